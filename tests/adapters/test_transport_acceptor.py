"""The schema check's fast path (protocol._acceptor): it accepts only bodies the exact check accepts, and every
body it turns away still gets the exact check's verdict and named error."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policylink.adapters import protocol
from policylink.adapters.protocol import (
    ENV_REPLIES,
    ENV_REQUESTS,
    POLICY_REPLIES,
    POLICY_REPLIES_V1,
    POLICY_REQUESTS,
    POLICY_REQUESTS_V1,
    ErrorCode,
    ProtocolError,
    encode_message,
    parse_message,
)

SCHEMAS = [
    (table, verb, schema)
    for table in (POLICY_REQUESTS, POLICY_REPLIES, POLICY_REQUESTS_V1, POLICY_REPLIES_V1, ENV_REQUESTS, ENV_REPLIES)
    for verb, schema in table.items()
] + [(None, "error", protocol._ERROR_BODY)]

_leaf = (
    st.none()
    | st.booleans()
    | st.integers(-5, 5)
    | st.floats(allow_nan=False, width=32)
    | st.text(max_size=3)
    | st.just(np.zeros((1, 2), np.float32))
    | st.just(np.float32(1.5))  # a numpy scalar: not an array, not a float
)
_values = st.recursive(
    _leaf,
    lambda children: (
        st.lists(children, max_size=3)
        | st.dictionaries(
            st.sampled_from(["observation.state", "task", "x", "receive_to_reply_s"]), children, max_size=3
        )
    ),
    max_leaves=8,
)


_array = st.just(np.zeros((1, 2), np.float32))
_text = st.text(max_size=3)
_obs = st.dictionaries(st.sampled_from(["observation.state", "task"]), _array | _text | st.lists(_text, max_size=2))
_FITTING = {
    "array": _array,
    "any_map": st.dictionaries(_text, _values, max_size=2),
    "int_list": st.lists(st.integers(-3, 3), max_size=3),
    "str_list": st.lists(_text, max_size=3),
    "obs": _obs,
    "obs_list": st.lists(_obs, max_size=2),
    int: st.integers(-3, 3),
    float: st.floats(allow_nan=False, width=32),
    str: _text,
    bool: st.booleans(),
}


def _near(kind):
    """A value that fits ``kind`` (mostly) or any value (sometimes)."""
    if type(kind) is dict:
        fitting = st.fixed_dictionaries({}, optional={name: _near(f.kind) for name, f in kind.items()})
    else:
        fitting = _FITTING[kind[0] if type(kind) is tuple else kind]
    return st.one_of(fitting, fitting, fitting, _values)


@st.composite
def bodies(draw):
    """A schema and a body drawn near it: some of its fields (and sometimes a stranger) with values that mostly fit
    their kind, so that the fast path accepts a good share of them."""
    _, verb, schema = draw(st.sampled_from(SCHEMAS))
    required = [name for name, f in schema.items() if not f.optional]
    names = [*required] if draw(st.integers(0, 3)) else []
    names += draw(st.lists(st.sampled_from([*schema, "unknown"]), unique=True, max_size=2))
    return verb, schema, {name: draw(_near(schema[name].kind) if name in schema else _values) for name in names}


@settings(max_examples=600, deadline=None)
@given(bodies())
def test_the_fast_path_accepts_only_what_the_exact_check_accepts(drawn):
    verb, schema, body = drawn
    if protocol._acceptor(schema)(body):
        assert protocol._fields_problem(schema, body, "body", verb) is None, body


def _request(body, verb="infer"):
    return encode_message(7, verb, body, 2)


@pytest.mark.parametrize(
    ("body", "field", "words"),
    [
        ({"updates": [{"x": np.zeros(2, np.float32)}], "env_ids": [0, True]}, "body.env_ids", "list of int"),
        ({"updates": [{"x": 3}]}, "body.updates", "x: expected an array"),
        ({"updates": [{"task": ["a", 1]}]}, "body.updates", "list of str"),
        ({"updates": None}, "body.updates", "missing required field"),
        ({"updates": [], "extra": 1}, "body.extra", "unknown field(s) ['extra']"),
        (
            {"updates": [], "prefix": {"actions": np.zeros((1, 2, 3), np.float32), "weights": 1.0, "max_guidance": 1}},
            "body.prefix.weights",
            "expected an array",
        ),
    ],
)
def test_bodies_off_the_fast_path_still_get_the_named_error(body, field, words):
    with pytest.raises(ProtocolError) as e:
        parse_message(_request(body), POLICY_REQUESTS)
    assert e.value.code == ErrorCode.INVALID_FIELD and e.value.field == field and words in e.value.message


def test_values_the_exact_check_allows_beyond_exact_types_still_pass():
    # an int where a float is expected, a dict subclass where a map is, no prefix method: the exact check decides
    body = {
        "updates": [{"x": np.zeros(2, np.float32), "task": "pick"}],
        "prefix": {
            "actions": np.zeros((1, 2, 3), np.float32),
            "weights": np.ones((1, 2), np.float32),
            "max_guidance": 2,
        },
    }
    msg = parse_message(_request(body), POLICY_REQUESTS)
    assert msg.body["prefix"]["max_guidance"] == 2 and msg.body["updates"][0]["task"] == "pick"
    assert not protocol._acceptor(POLICY_REQUESTS["infer"])(msg.body)  # the int took the exact path
    reply = {
        "actions": np.zeros((1, 2, 3), np.float32),
        "timing": {"receive_to_reply_s": 1, "queue_s": 0.0, "inference_s": 0.5},
    }
    assert parse_message(encode_message(7, "infer", reply, 2), POLICY_REPLIES).body["timing"]["receive_to_reply_s"] == 1


def test_the_acceptor_cache_stays_bounded_and_never_confuses_schemas():
    for i in range(1100):
        schema = {f"f{i}": protocol.Field((int,))}
        assert parse_message(encode_message(1, "v", {f"f{i}": i}, 2), {"v": schema}).body == {f"f{i}": i}
    assert len(protocol._ACCEPTORS) <= 1024
    with pytest.raises(ProtocolError, match="f1"):  # a new schema with a recycled id is compiled afresh
        parse_message(encode_message(1, "v", {"f0": 0}, 2), {"v": {"f1": protocol.Field((int,))}})
