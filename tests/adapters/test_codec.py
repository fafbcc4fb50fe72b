"""Codec: exact round trips of every supported dtype, writable received arrays, refusals, malformed frames."""

import pickle

import msgpack
import numpy as np
import pytest
import zmq
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from policylink.adapters.codec import SUPPORTED_DTYPES, CodecError, decode, encode


def _as_bytes(frames):
    """Frames as read-only ``bytes`` (the decoder must then hand out writable copies)."""
    return [memoryview(f).tobytes() for f in frames]


def _via_zmq(frames):
    """Send frames through a real inproc PAIR and receive them zero-copy, as the transport does."""
    ctx = zmq.Context()
    a, b = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
    try:
        a.bind("inproc://codec-test")
        b.connect("inproc://codec-test")
        a.send_multipart(frames, copy=False)
        assert b.poll(2000)
        return b.recv_multipart(copy=False)
    finally:
        a.close(0)
        b.close(0)
        ctx.term()


@pytest.mark.parametrize("dtype", SUPPORTED_DTYPES)
def test_every_dtype_round_trips_exactly(dtype):
    x = (np.arange(24) % 7).astype(dtype).reshape(2, 3, 4)
    frames = encode({"x": x})
    assert len(frames) == 2 and frames[1] is x  # the caller's own array is the frame: zero-copy send
    y = decode(_via_zmq(frames))["x"]
    assert y.dtype == np.dtype(dtype) and y.shape == (2, 3, 4)
    np.testing.assert_array_equal(y, x)


def test_extreme_values_and_special_floats():
    msg = {
        "i64": np.array([np.iinfo(np.int64).min, np.iinfo(np.int64).max]),
        "u64": np.array([0, np.iinfo(np.uint64).max], dtype=np.uint64),
        "f16": np.array([np.inf, -0.0, 65504.0], dtype=np.float16),
        "f64": np.array([np.nan, 1e-308, -np.inf]),
    }
    out = decode(encode(msg))
    for k, v in msg.items():
        np.testing.assert_array_equal(out[k], v)
        assert out[k].dtype == v.dtype
    assert np.signbit(out["f16"][1])  # -0.0 kept bit-exactly


def test_received_arrays_are_writable_for_in_place_normalisation():
    img = np.full((4, 4, 3), 200, np.uint8)
    state = np.array([[1.0, 3.0]], np.float32)
    for frames in (_via_zmq(encode({"img": img, "state": state})), _as_bytes(encode({"img": img, "state": state}))):
        out = decode(frames)
        out["state"] -= np.array([1.0, 1.0], np.float32)  # in place, as a normaliser does
        out["state"] /= 2.0
        out["img"][0, 0, 0] = 7
        np.testing.assert_array_equal(out["state"], [[0.0, 1.0]])
        assert out["img"][0, 0, 0] == 7 and img[0, 0, 0] == 200  # the sender's array is untouched


def test_layouts_and_byte_order_are_normalised():
    base = np.arange(12, dtype=np.float32).reshape(3, 4)
    msg = {
        "t": base.T,
        "step": base[:, ::2],
        "be": base.astype(">f4"),
        "zero_d": np.array(5, np.int16),
        "zero_d_be": np.array(-7, ">i2"),
        "empty": np.zeros((0, 3), np.uint8),
    }
    out = decode(encode(msg))
    np.testing.assert_array_equal(out["t"], base.T)
    np.testing.assert_array_equal(out["step"], base[:, ::2])
    np.testing.assert_array_equal(out["be"], base)
    assert out["be"].dtype == np.float32  # native little-endian on arrival
    assert out["zero_d"].shape == () and out["zero_d"] == 5 and out["zero_d"].dtype == np.int16
    assert out["zero_d_be"].shape == () and out["zero_d_be"] == -7 and out["zero_d_be"].dtype == np.int16
    assert out["empty"].shape == (0, 3) and out["empty"].dtype == np.uint8


def test_strings_prompts_and_plain_values():
    msg = {
        "task": ["pick up the red cube", "open the drawer ü"],
        "one": "push",
        "n": 3,
        "f": 0.5,
        "b": True,
        "none": None,
        "raw": b"\x00\x01",
        "nested": {"a": [1, {"b": "c"}]},
        "names": np.array([["a", "bb"], ["ccc", "d"]]),
        "scalar": np.int8(-3),
        "half": np.float16(1.5),
    }
    out = decode(encode(msg))
    assert out["task"] == ["pick up the red cube", "open the drawer ü"]
    assert (out["one"], out["n"], out["f"], out["b"], out["none"], out["raw"]) == (
        "push",
        3,
        0.5,
        True,
        None,
        b"\x00\x01",
    )
    assert out["nested"] == {"a": [1, {"b": "c"}]}
    np.testing.assert_array_equal(out["names"], [["a", "bb"], ["ccc", "d"]])
    assert out["scalar"] == -3 and out["scalar"].dtype == np.int8
    assert out["half"] == 1.5 and out["half"].dtype == np.float16


class _Evil:
    def __reduce__(self):
        return (print, ("pwned",))


@pytest.mark.parametrize(
    ("value", "path", "reason"),
    [
        (np.array([1, "a"], dtype=object), "message.obs.x", "object arrays"),
        (np.array([1 + 2j]), "message.obs.x", "complex128"),
        (np.array(["2020-01-01"], dtype="datetime64[D]"), "message.obs.x", "datetime64"),
        ({1, 2}, "message.obs.x", "type set"),
        (_Evil(), "message.obs.x", "no pickling"),
        (2**70, "message.obs.x", "64 bits"),
    ],
)
def test_unsupported_values_are_refused_at_encode_time_with_their_path(value, path, reason):
    with pytest.raises(CodecError) as err:
        encode({"obs": {"x": value}})
    assert path in str(err.value) and reason in str(err.value)


def test_non_string_map_keys_are_refused():
    with pytest.raises(CodecError, match=r"message.obs\[3\]: map keys must be str"):
        encode({"obs": {3: np.zeros(2, np.float32)}})


def test_no_pickle_bytes_anywhere_on_the_wire():
    frames = encode({"x": np.arange(3, dtype=np.int64), "task": ["a"]})
    header = bytes(frames[0])
    assert pickle.PROTO not in header[:1] and b"numpy" not in header
    assert decode(frames)["task"] == ["a"]


F32 = SUPPORTED_DTYPES.index("float32")


def _header_with_array(code, ndim, index, shape):
    import struct

    payload = struct.pack("<BBI", code, ndim, index) + struct.pack(f"<{len(shape)}Q", *shape)
    return msgpack.packb({"x": msgpack.ExtType(1, payload)})


@pytest.mark.parametrize(
    ("frames", "match"),
    [
        ([], "at least one"),
        ([b"\xc1"], "invalid msgpack"),
        ([_header_with_array(F32, 1, 0, (4,)), b"\x00" * 15], "expected 16 bytes"),  # float32 (4,) needs 16
        ([_header_with_array(F32, 1, 0, (4,))], "out of range"),  # frame missing
        ([_header_with_array(F32, 1, 0, (1,)), b"\x00" * 4, b"extra"], "referenced"),  # unused frame
        ([_header_with_array(99, 1, 0, (1,)), b"\x00"], "invalid header"),  # unknown dtype code
        ([_header_with_array(0, 1, 0, (2,)), b"\x00\x02"], "bool array"),  # bool byte 2
        ([msgpack.packb(msgpack.ExtType(42, b""))], "unknown msgpack extension"),
        ([msgpack.packb({1: 2})], "invalid msgpack"),  # int map key
    ],
)
def test_malformed_frames_raise_codec_error(frames, match):
    with pytest.raises(CodecError, match=match):
        decode(frames)


def test_a_repeated_array_header_is_checked_against_every_message_frames():
    header = _header_with_array(F32, 1, 0, (4,))
    np.testing.assert_array_equal(decode([header, np.arange(4, dtype=np.float32).tobytes()])["x"], [0, 1, 2, 3])
    with pytest.raises(CodecError, match="expected 16 bytes"):  # the same header again, now with a short frame
        decode([header, b"\x00" * 12])
    with pytest.raises(CodecError, match="out of range"):
        decode([header])


def test_array_header_caches_stay_bounded():
    from policylink.adapters import codec

    for n in range(3000):  # every message of a new shape
        x = np.zeros(n, np.uint8)
        assert decode(encode({"x": x}))["x"].shape == (n,)
    assert len(codec._ENCODED_HEADS) <= codec._CACHE_SIZE and len(codec._DECODED_HEADS) <= codec._CACHE_SIZE


@settings(max_examples=60, deadline=None)
@given(
    hnp.arrays(
        dtype=st.sampled_from(SUPPORTED_DTYPES).map(np.dtype),
        shape=hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=5),
    )
)
def test_random_arrays_round_trip_bit_exactly(x):
    y = decode(_as_bytes(encode({"x": x})))["x"]
    assert y.dtype == x.dtype and y.shape == x.shape
    assert y.tobytes() == np.ascontiguousarray(x).tobytes()


@settings(max_examples=150, deadline=None)
@given(st.lists(st.binary(max_size=64), min_size=1, max_size=4))
def test_random_bytes_never_crash_the_decoder(frames):
    try:
        decode(frames)
    except CodecError:
        pass


def test_a_refused_message_leaves_no_arrays_behind_and_the_next_one_encodes_alone():
    from policylink.adapters import codec

    big = np.ones(1000, np.float32)
    with pytest.raises(CodecError, match=r"message\.bad: object arrays"):
        encode({"x": big, "bad": np.array([object()], dtype=object)})
    assert codec._THREAD.encoder[1] == []  # the refused message's array is not kept alive
    frames = encode({"y": np.arange(3, dtype=np.int16)})
    assert len(frames) == 2 and decode(_as_bytes(frames))["y"].tolist() == [0, 1, 2]


def test_each_thread_encodes_with_its_own_packer():
    import threading

    from policylink.adapters import codec

    results, packers = {}, {}

    def work(i):
        x = np.full((i + 1,), i, np.int32)
        for _ in range(200):
            results[i] = decode(_as_bytes(encode({"x": x, "i": i})))
        packers[i] = codec._THREAD.encoder[0]

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(results[i]["i"] == i and results[i]["x"].tolist() == [i] * (i + 1) for i in range(4))
    assert len({id(p) for p in packers.values()}) == 4
