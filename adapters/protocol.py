"""The strict message envelope of the policylink wire protocol: versions, verbs, typed bodies and error codes.

Every message is ``{"id": int, "type": str, "body": map}`` encoded by :mod:`policylink.adapters.codec`; from
protocol 2 on the envelope also carries ``"v": <protocol>`` (a protocol-1 message has no ``v``). Requests carry a
verb as ``type``; replies echo the request ``id`` and its protocol, with ``type`` = the verb, or ``"error"`` with
body ``{"code", "message", "field"}``. Each verb has a typed body schema per protocol; unknown or missing fields
are rejected with ``invalid_field`` naming the field (DESIGN.md section 3; XPolicyLab-style strict envelope).

Protocol history: 1 = ``hello``/``ping``/``reset``/``infer``. 2 adds to ``infer`` the rows ``env_ids`` and a
real-time-chunking ``prefix``, server ``timing`` in its reply, an ``embed`` verb, and ``capabilities`` in
``hello``. A server answers each request in the request's protocol, so protocol-1 clients keep working.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Any, NamedTuple

import numpy as np

from policylink.adapters.codec import CodecError, decode, encode

PROTOCOL_VERSION = 2
SUPPORTED_PROTOCOLS = (1, 2)
"""Protocols a server of this version answers (a request's envelope ``v``; absent = 1)."""
ERROR = "error"


class ErrorCode(StrEnum):
    """Closed set of error codes carried by ``error`` replies."""

    INVALID_FRAME = "invalid_frame"  # not decodable / not an envelope
    UNKNOWN_MESSAGE_TYPE = "unknown_message_type"  # verb not served by this server
    INVALID_FIELD = "invalid_field"  # body field missing, unknown, of the wrong type, or off-spec
    TOO_LARGE = "too_large"  # message over the server's size cap
    TIMEOUT = "timeout"  # client-side: no reply in time
    INFER_FAILED = "infer_failed"  # the policy raised
    ENV_FAILED = "env_failed"  # the environment raised
    VERSION_MISMATCH = "version_mismatch"  # hello with another protocol version
    UNSUPPORTED = "unsupported"  # verb valid but not offered by this server's object
    INTERNAL = "internal"  # server bug; the server keeps serving


class ProtocolError(Exception):
    """A request or reply violates the protocol; becomes an ``error`` reply on the server side.

    Attributes:
        code: an :class:`ErrorCode`.
        message: human-readable reason naming the expected and received value.
        field: dotted path of the offending field (``"body.updates[0].observation.state"``) or None.
        request_id: the request's id when it could be read, else None.
    """

    def __init__(self, code: ErrorCode, message: str, field: str | None = None, request_id: int | None = None):
        super().__init__(f"{code.value}: {message}" + (f" (field {field})" if field else ""))
        self.code, self.message, self.field, self.request_id = code, message, field, request_id


class RemoteError(RuntimeError):
    """The server answered a request with an ``error`` reply.

    Attributes: ``code`` (:class:`ErrorCode` value, str), ``message``, ``field``, ``server`` (endpoint),
    ``verb``.
    """

    def __init__(self, server: str, verb: str, code: str, message: str, field: str | None):
        where = f" (field {field})" if field else ""
        super().__init__(f"{server} {verb}: {code}: {message}{where}")
        self.server, self.verb, self.code, self.message, self.field = server, verb, code, message, field


class VersionMismatchError(RemoteError):
    """Client and server speak different protocol versions (raised at ``hello``)."""


class Message(NamedTuple):
    """A decoded, schema-checked message: ``id``, ``type`` (verb or ``"error"``), ``body`` and the envelope's
    ``protocol`` (1 when the envelope has no ``v``). A named tuple: immutable, and cheap to make per message."""

    id: int | None
    type: str
    body: dict[str, Any]
    protocol: int = 1


class Field(NamedTuple):
    """Schema of one body field.

    ``kind`` is a tuple of Python types (``(int,)``, ``(str,)``...; bool is not an int, an int is a float), one
    of ``"array"`` (numpy array), ``"obs"`` (map of key -> array / str / list of str), ``"obs_list"`` (list of
    those), ``"int_list"``, ``"str_list"`` or ``"any_map"``, or a nested schema (a map of field name ->
    :class:`Field`, checked as strictly as a body: its errors name ``body.<field>.<subfield>``). ``optional``
    fields may be absent or None.
    """

    kind: Any
    optional: bool = False


_f = Field
Schema = Mapping[str, Mapping[str, Field]]
_INT = (int,)
_FLOAT = (float,)
_HELLO_REQ = {"protocol": _f(_INT), "client": _f((str,), optional=True)}
_HELLO_REP_V1 = {"protocol": _f(_INT), "kind": _f((str,)), "spec": _f("any_map"), "server": _f((str,))}
_HELLO_REP = {  # capabilities: a policy server's (PolicyServer.hello_extras); absent from an env server's
    **_HELLO_REP_V1,
    "capabilities": _f("str_list", optional=True),
    "latent_dim": _f(_INT, optional=True),
}
_PING_REP = {"time": _f(_FLOAT)}
PREFIX_FIELDS = {
    "actions": _f("array"),
    "weights": _f("array"),
    "max_guidance": _f(_FLOAT),
    "method": _f((str,), optional=True),
}
"""``infer``'s ``prefix``: :class:`~policylink.adapters.capabilities.ChunkPrefix` (float32 actions ``(B', H, A)``,
float32 weights ``(B', H)`` in ``[0, 1]``, ``max_guidance`` > 0, ``method`` ``"guidance"`` (absent = guidance) or
``"inpaint"``; rows follow ``env_ids``)."""
TIMING_FIELDS = {"receive_to_reply_s": _f(_FLOAT), "queue_s": _f(_FLOAT), "inference_s": _f(_FLOAT)}
"""Server timing in ``infer``/``embed`` replies, seconds (``time.perf_counter`` on the server): from receiving the
request to encoding its reply, of which waiting behind earlier calls (``queue_s``) and the policy call itself
(``inference_s``)."""

POLICY_REQUESTS_V1: dict[str, dict[str, Field]] = {
    "hello": _HELLO_REQ,
    "ping": {},
    "reset": {"env_ids": _f("int_list", optional=True), "updates": _f("obs_list")},
    "infer": {"updates": _f("obs_list")},
}
POLICY_REPLIES_V1: dict[str, dict[str, Field]] = {
    "hello": _HELLO_REP_V1,
    "ping": _PING_REP,
    "reset": {},
    "infer": {"actions": _f("array")},
}
POLICY_REQUESTS: dict[str, dict[str, Field]] = {
    **POLICY_REQUESTS_V1,
    "infer": {
        "updates": _f("obs_list"),
        "env_ids": _f("int_list", optional=True),
        "prefix": _f(PREFIX_FIELDS, optional=True),
    },
    "embed": {"updates": _f("obs_list"), "env_ids": _f("int_list", optional=True)},
}
"""Policy request schemas of :data:`PROTOCOL_VERSION` (protocol 1: :data:`POLICY_REQUESTS_V1`)."""
POLICY_REPLIES: dict[str, dict[str, Field]] = {
    **POLICY_REPLIES_V1,
    "hello": _HELLO_REP,
    "infer": {"actions": _f("array"), "timing": _f(TIMING_FIELDS)},
    "embed": {"latent": _f("array"), "timing": _f(TIMING_FIELDS)},
}
"""Policy reply schemas of :data:`PROTOCOL_VERSION` (protocol 1: :data:`POLICY_REPLIES_V1`)."""
POLICY_REQUESTS_BY_PROTOCOL = {1: POLICY_REQUESTS_V1, 2: POLICY_REQUESTS}
POLICY_REPLIES_BY_PROTOCOL = {1: POLICY_REPLIES_V1, 2: POLICY_REPLIES}
ENV_REQUESTS: dict[str, dict[str, Field]] = {
    "hello": _HELLO_REQ,
    "ping": {},
    "reset": {"seed": _f(_INT, optional=True), "options": _f("any_map", optional=True)},
    "step": {"action": _f("array")},
    "get_observation": {},
    "send_action": {"action": _f("array")},
    "render": {},
}
"""Env request schemas (the same in every protocol)."""
ENV_REPLIES: dict[str, dict[str, Field]] = {
    "hello": _HELLO_REP,
    "ping": _PING_REP,
    "reset": {"observation": _f("obs"), "info": _f("any_map")},
    "step": {
        "observation": _f("obs"),
        "reward": _f(_FLOAT),
        "terminated": _f((bool,)),
        "truncated": _f((bool,)),
        "info": _f("any_map"),
    },
    "get_observation": {"observation": _f("obs")},
    "send_action": {},
    "render": {"frame": _f("array")},
}
"""Env reply schemas (the same in every protocol)."""
_ERROR_BODY = {"code": _f((str,)), "message": _f((str,)), "field": _f((str,), optional=True)}


def encode_message(
    request_id: int | None, type_: str, body: Mapping[str, Any], protocol: int = 1, *, check_keys: bool = True
) -> list:
    """Frames of ``{"id", "type", "body"}`` (plus ``"v": protocol`` when ``protocol`` > 1); ``check_keys`` as in
    :func:`~policylink.adapters.codec.encode`.

    Raises:
        CodecError: the body holds a value the codec refuses.
    """
    envelope = {"id": request_id, "type": type_, "body": body if type(body) is dict else dict(body)}
    if protocol != 1:
        envelope["v"] = protocol
    return encode(envelope, check_keys=check_keys)


def error_frames(err: ProtocolError, protocol: int = 1) -> list:
    """Frames of the ``error`` reply for ``err`` in ``protocol`` (the request's)."""
    body = {"code": err.code.value, "message": err.message, "field": err.field}
    return encode_message(err.request_id, ERROR, body, protocol)


def parse_message(
    frames: list, schemas: Schema, allow_error: bool = False, by_protocol: Mapping[int, Schema] | None = None
) -> Message:
    """Decode and check ``frames`` against ``schemas`` (verb -> body field schema).

    Args:
        frames: the message frames (without the ROUTER identity frame).
        schemas: e.g. :data:`POLICY_REQUESTS` (server side) or :data:`POLICY_REPLIES` (client side).
        allow_error: accept ``type == "error"`` (client side).
        by_protocol: schemas of particular protocols (e.g. :data:`POLICY_REQUESTS_BY_PROTOCOL`); a message of a
            protocol not listed there is checked against ``schemas``.

    Raises:
        ProtocolError: ``invalid_frame`` (undecodable / not an envelope), ``version_mismatch`` (an envelope
            ``v`` outside :data:`SUPPORTED_PROTOCOLS`), ``unknown_message_type``, ``invalid_field`` (a body field
            missing, unknown or of the wrong type; ``field`` is its dotted path).
    """
    try:
        msg = decode(frames)
    except CodecError as e:
        raise ProtocolError(ErrorCode.INVALID_FRAME, str(e)) from None
    if type(msg) is not dict or msg.keys() not in _ENVELOPES:
        got = sorted(msg) if isinstance(msg, dict) else type(msg).__name__
        raise ProtocolError(
            ErrorCode.INVALID_FRAME, f"envelope: expected keys ['body', 'id', 'type'] (and 'v'), received {got}"
        )
    rid = msg["id"]
    if rid is not None and type(rid) is not int:  # msgpack gives exact ints; a bool is not an id
        raise ProtocolError(ErrorCode.INVALID_FRAME, f"id: expected int, received {type(rid).__name__}")
    protocol = msg.get("v", 1)
    if type(protocol) is not int or protocol not in SUPPORTED_PROTOCOLS:
        raise ProtocolError(
            ErrorCode.VERSION_MISMATCH,
            f"v: expected one of {list(SUPPORTED_PROTOCOLS)} (no 'v' = 1), received {protocol!r:.40}",
            "v",
            rid,
        )
    type_, body = msg["type"], msg["body"]
    if type(type_) is not str:
        raise ProtocolError(
            ErrorCode.INVALID_FRAME, f"type: expected str, received {type(type_).__name__}", "type", rid
        )
    if by_protocol is not None:
        schemas = by_protocol.get(protocol, schemas)
    schema = _ERROR_BODY if allow_error and type_ == ERROR else schemas.get(type_)
    if schema is None:
        raise ProtocolError(
            ErrorCode.UNKNOWN_MESSAGE_TYPE,
            f"type: expected one of {sorted(schemas)} (protocol {protocol}), received {type_[:60]!r}",
            "type",
            rid,
        )
    accept = _ACCEPTORS.get(id(schema))
    if accept is None or accept[0] is not schema:
        accept = _remember_acceptor(schema)
    if not accept[1](body):  # not certainly valid: the exact checks name the problem, if there is one
        problem = _fields_problem(schema, body, "body", type_)
        if problem:
            raise ProtocolError(ErrorCode.INVALID_FIELD, problem[1], problem[0], rid)
    return Message(rid, type_, body, protocol)


_ENVELOPES = ({"id", "type", "body"}, {"id", "type", "body", "v"})
_ACCEPTORS: dict[int, tuple[Mapping[str, Field], Any]] = {}  # id(schema) -> (schema, its acceptor)


def _remember_acceptor(schema: Mapping[str, Field]) -> tuple[Mapping[str, Field], Any]:
    """``(schema, acceptor)`` for ``schema``, made once (the entry holds the schema, so its id is not reused while
    cached; at most 1,024 entries: parse_message is given the module's schemas, not new ones per message)."""
    if len(_ACCEPTORS) >= 1024:
        _ACCEPTORS.clear()
    entry = _ACCEPTORS[id(schema)] = (schema, _acceptor(schema))
    return entry


def _acceptor(schema: Mapping[str, Field]) -> Any:
    """A function ``accept(value) -> bool`` that is True only for a map that conforms to ``schema``, by exact-type
    tests alone (``bool`` where ``bool`` is listed, ``float`` where ``float`` is, arrays of type ``np.ndarray``...).

    Every value it accepts passes :func:`_fields_problem`; a False sends the value there, which accepts what the
    exact tests do not cover (an int for a float, subclasses) and names the problem otherwise. It walks the
    fields present rather than every field of the schema, and tests most fields inline: it runs on every message
    (a policy request's schema check took about half the time of its decode before).
    """
    names = frozenset(schema)
    required = frozenset(name for name, (_, optional) in schema.items() if not optional)
    tests: dict[str, Any] = {}  # name -> a frozenset of exact types (inline test) or a function
    for name, (kind, optional) in schema.items():
        maybe_none = frozenset((type(None),)) if optional else frozenset()
        if type(kind) is tuple:
            tests[name] = frozenset(kind) | maybe_none
        elif type(kind) is dict:
            tests[name] = _acceptor(kind)
        elif kind in _EXACT_KINDS:
            tests[name] = _EXACT_KINDS[kind] | maybe_none
        else:
            tests[name] = _KIND_ACCEPTORS[kind]

    def accept(value: Any) -> bool:
        if type(value) is not dict:
            return False
        keys = value.keys()
        if not (keys <= names and keys >= required):
            return False
        for name, item in value.items():
            test = tests[name]
            if type(test) is frozenset:
                if type(item) not in test:
                    return False
            elif item is None:
                if name in required:
                    return False
            elif not test(item):
                return False
        return True

    return accept


def _fields_problem(schema: Mapping[str, Field], value: Any, path: str, what: str) -> tuple[str, str] | None:
    """``(field path, reason)`` of the first field of map ``value`` that breaks ``schema``, or None.

    Runs on every message, so the common case is kept to C-level operations: exact-type tests first, the full
    ``isinstance`` rules only when those fail."""
    if type(value) is not dict:
        return path, f"{path.rsplit('.', 1)[-1]}: expected a map, received {type(value).__name__}"
    if not value.keys() <= schema.keys():
        unknown = sorted(value.keys() - schema.keys())
        return f"{path}.{unknown[0]}", f"unknown field(s) {unknown}; {what} accepts {sorted(schema)}"
    for name, (kind, optional) in schema.items():
        item = value.get(name)
        if item is None:
            if not optional:
                return f"{path}.{name}", f"missing required field {name!r}"
            continue
        if type(kind) is tuple:
            if type(item) in kind:  # exact type (a bool is only accepted where bool is listed)
                continue
            reason = _scalar_problem(kind, item)
        elif type(kind) is dict:
            problem = _fields_problem(kind, item, f"{path}.{name}", name)
            if problem:
                return problem
            continue
        else:
            reason = _KIND_CHECKS[kind](item)
        if reason:
            return f"{path}.{name}", f"{name}: {reason}"
    return None


def _scalar_problem(kind: tuple, value: Any) -> str | None:
    if kind == (float,) and isinstance(value, int) and not isinstance(value, bool):
        return None
    if not isinstance(value, kind) or (kind == _INT and isinstance(value, bool)):
        return f"expected {kind[0].__name__}, received {type(value).__name__}"
    return None


def _array_problem(value: Any) -> str | None:
    return None if isinstance(value, np.ndarray) else f"expected an array, received {type(value).__name__}"


def _map_problem(value: Any) -> str | None:
    return None if isinstance(value, dict) else f"expected a map, received {type(value).__name__}"


def _int_list_problem(value: Any) -> str | None:
    ok = isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    return None if ok else "expected a list of int"


def _str_list_problem(value: Any) -> str | None:
    return None if isinstance(value, list) and all(isinstance(v, str) for v in value) else "expected a list of str"


def _obs_list_problem(value: Any) -> str | None:
    if type(value) is not list:
        return f"expected a list of observation maps, received {type(value).__name__}"
    for i, obs in enumerate(value):
        problem = _obs_problem(obs)
        if problem:
            return f"[{i}] {problem}"
    return None


def _obs_problem(obs: Any) -> str | None:
    if type(obs) is not dict:
        return f"expected an observation map, received {type(obs).__name__}"
    for key, value in obs.items():
        if type(value) is np.ndarray:
            continue
        is_text = isinstance(value, str) or (isinstance(value, list) and all(isinstance(v, str) for v in value))
        if not is_text:
            return f"{key}: expected an array, a str or a list of str, received {type(value).__name__}"
    return None


def _accept_obs(obs: Any) -> bool:
    if type(obs) is not dict:
        return False
    for value in obs.values():
        if type(value) is np.ndarray or type(value) is str:
            continue
        if type(value) is not list:
            return False
        for s in value:
            if type(s) is not str:
                return False
    return True


def _accept_obs_list(value: Any) -> bool:
    if type(value) is not list:
        return False
    for obs in value:
        if not _accept_obs(obs):
            return False
    return True


def _accept_list_of(kind: type) -> Any:
    def accept(value: Any) -> bool:
        if type(value) is not list:
            return False
        for v in value:
            if type(v) is not kind:
                return False
        return True

    return accept


_EXACT_KINDS = {"array": frozenset((np.ndarray,)), "any_map": frozenset((dict,))}
_KIND_ACCEPTORS = {
    "int_list": _accept_list_of(int),
    "str_list": _accept_list_of(str),
    "obs": _accept_obs,
    "obs_list": _accept_obs_list,
}
_KIND_CHECKS = {
    "array": _array_problem,
    "any_map": _map_problem,
    "int_list": _int_list_problem,
    "str_list": _str_list_problem,
    "obs": _obs_problem,
    "obs_list": _obs_list_problem,
}
