"""XPolicyLab wire codec and Observation Format v1.0 key map: exact bytes against msgpack_numpy, refusals (object
arrays never unpickled), defaults derived from a spec, overrides, xpl:// references and the spec taken from an env."""

import dataclasses

import msgpack
import numpy as np
import pytest

msgpack_numpy = pytest.importorskip("msgpack_numpy")

from policylink.adapters.schema import ActionSpec, EnvSpec, FeatureSpec, PolicySpec  # noqa: E402
from policylink.adapters.xpolicylab import parse_ref, spec_from_env  # noqa: E402
from policylink.adapters.xpolicylab_keymap import FieldError, KeyMap  # noqa: E402
from policylink.adapters.xpolicylab_wire import (  # noqa: E402
    Frame,
    MessageType,
    XPolicyLabError,
    decode,
    decode_frame,
    encode,
    encode_actions_reply,
    encode_frame,
)

STATE, IMG = "observation.state", "observation.images."


def _spec(state_names, action: ActionSpec, cams=("front",)):
    feats = {STATE: FeatureSpec("float32", (len(state_names),), names=state_names)}
    feats.update({IMG + c: FeatureSpec("uint8", (4, 4, 3)) for c in cams})
    return PolicySpec(feats, action, chunk_size=3, n_action_steps=3)


JOINTS = ActionSpec(("a", "b", "g"), "joint_position", ("rad", "rad", "1"), (-1,) * 3, (1,) * 3, gripper_index=2)
POSE = ActionSpec(
    ("x", "y", "z", "qw", "qx", "qy", "qz", "g"), "ee_position", ("m",) * 3 + ("1",) * 5, (-1,) * 8, (1,) * 8,
    rotation="quat_wxyz", gripper_index=7,
)  # fmt: skip
ARM_AND_GRIPPER = [("arm_joint_state", 2), ("ee_joint_state", 1)]
DELTA = ActionSpec(("dx", "dy"), "ee_delta", ("m", "m"), (-1, -1), (1, 1))


def test_arrays_encode_exactly_as_msgpack_numpy_and_decode_back():
    obj = {"a": np.arange(6, dtype=np.float32).reshape(2, 3), "s": np.int64(7), "x": [1, "two", None]}
    assert encode(obj) == msgpack.packb(obj, default=msgpack_numpy.encode, use_bin_type=True)
    back = decode(encode(obj))
    np.testing.assert_array_equal(back["a"], obj["a"])
    assert back["a"].dtype == np.float32 and back["s"] == 7 and back["x"] == [1, "two", None]


FIRED = []


def _fire(what):
    FIRED.append(what)


class _Tripwire:
    def __reduce__(self):
        return (_fire, ("unpickled",))  # a module function: unpickling calls it here


@pytest.mark.parametrize(
    "bad",
    [
        {b"nd": True, b"type": "|O", b"kind": b"O", b"shape": [1], b"data": b""},
        {b"nd": True, b"type": [["a", "<f4"]], b"kind": b"V", b"shape": [1], b"data": b"\0" * 4},
        {b"nd": True, b"type": "<U3", b"kind": b"", b"shape": [1], b"data": b"\0" * 12},
        {b"nd": True, b"type": "<f4", b"kind": b"", b"shape": [3], b"data": b"\0" * 8},
        {b"nd": True, b"type": "<f4", b"kind": b"", b"shape": [-1], b"data": b""},
        {b"nd": False, b"type": "<f8", b"data": b"\0"},
    ],
)
def test_unsupported_or_inconsistent_arrays_are_invalid_frames(bad):
    with pytest.raises(XPolicyLabError) as e:
        decode(msgpack.packb({"x": bad}, use_bin_type=True))
    assert e.value.code == "invalid_frame"


def test_an_object_array_is_never_unpickled():
    import pickle

    payload = pickle.dumps(np.array([_Tripwire()], dtype=object))
    obj = {b"nd": True, b"type": "|O", b"kind": b"O", b"shape": [1], b"data": payload}
    msgpack_numpy.decode(dict(obj))  # msgpack_numpy itself would run it: the tripwire works
    assert FIRED == ["unpickled"]
    with pytest.raises(XPolicyLabError, match="never unpickled"):
        decode(msgpack.packb({"x": obj}, use_bin_type=True))
    assert FIRED == ["unpickled"]
    with pytest.raises(XPolicyLabError, match="object/structured"):
        encode({"x": np.array([object()], dtype=object)})


def test_frame_round_trip_and_envelope_errors():
    frame = Frame(MessageType.INFER, "id-1", "ev", "case", "trial", 2, 5, "2026-01-01T00:00:00+00:00", {"k": 1})
    assert list(frame.to_wire()) == [
        "message_type", "evaluation_id", "action_case_id", "trial_id", "repeat_index", "step", "sent_at", "message_id",
        "payload",
    ]  # fmt: skip
    assert decode_frame(encode_frame(frame)) == frame
    reply = frame.reply(MessageType.INFER_RESULT, {"ok": True})
    assert (reply.message_id, reply.trial_id, reply.step, reply.repeat_index) == ("id-1", "trial", 5, 2)
    wire = frame.to_wire()
    for key, code in (("message_type", "invalid_frame"), ("evaluation_id", "invalid_frame")):
        broken = {k: v for k, v in wire.items() if k != key}
        with pytest.raises(XPolicyLabError, match=f"{key}: required") as e:
            decode_frame(encode(broken))
        assert e.value.code == code and e.value.details == {"message_id": "id-1"}
    with pytest.raises(XPolicyLabError) as e:
        decode_frame(encode({**wire, "message_type": "teleport"}))
    assert e.value.code == "unknown_message_type"


def test_infer_reply_fast_path_is_byte_identical_to_the_generic_encoder():
    request = Frame(MessageType.INFER, "m", "e", None, "t", 0, 3, "S", {})
    chunk = np.arange(50 * 8, dtype=np.float32).reshape(50, 8) / 7
    keys = (("ee_pose", 7), ("ee_joint_state", 1))
    steps = KeyMap(action=keys).to_actions(chunk)
    fast = encode_actions_reply(request, chunk, keys, 1.5)
    reply = request.reply(MessageType.INFER_RESULT, {"actions": steps, "latency_ms": 1.5})
    reply = dataclasses.replace(reply, sent_at=decode(fast)["sent_at"])
    assert fast == encode_frame(reply)


@pytest.mark.parametrize(
    ("state_names", "action", "state", "act"),
    [
        (("j0", "j1", "gripper"), JOINTS, [("arm_joint_state", 2), ("ee_joint_state", 1)], ARM_AND_GRIPPER),
        (("x", "y", "z"), POSE, [("arm_joint_state", 3)], [("ee_pose", 7), ("ee_joint_state", 1)]),
        (("ee_x", "ee_y", "t_x", "t_y"), DELTA, [("arm_joint_state", 4)], [("arm_joint_state", 2)]),
    ],
)  # fmt: skip
def test_default_key_map_from_the_spec(state_names, action, state, act):
    km = KeyMap.for_spec(_spec(state_names, action))
    assert list(km.state) == state and list(km.action) == act
    assert km.cameras == (("cam_head", IMG + "front"),)


def test_default_cameras_and_overrides():
    spec = _spec(("a", "b", "gripper"), JOINTS, cams=("top", "wrist_cam", "side"))
    km = KeyMap.for_spec(spec)
    assert dict(km.cameras) == {"cam_wrist": IMG + "wrist_cam", "cam_head": IMG + "top", "cam_third_view": IMG + "side"}
    km = KeyMap.for_spec(spec, cameras="cam_head:side", state="arm_joint_state:3", action="arm_joint_state:3")
    assert km.cameras == (("cam_head", IMG + "side"),) and km.state == (("arm_joint_state", 3),)
    with pytest.raises(ValueError, match=r"state: expected lengths summing to 3 .* received arm_joint_state:2"):
        KeyMap.for_spec(spec, state="arm_joint_state:2")
    with pytest.raises(ValueError, match="expected cameras among"):
        KeyMap.for_spec(spec, cameras="cam_head:nope")
    with pytest.raises(ValueError, match="expected a slot in"):
        KeyMap(cameras=(("cam_nose", IMG + "top"),))


def test_v1_observation_round_trip_and_action_chunk():
    spec = _spec(("j0", "j1", "gripper"), JOINTS)
    km = KeyMap.for_spec(spec)
    row = {STATE: np.array([1, 2, 3], np.float32), IMG + "front": np.full((4, 4, 3), 9, np.uint8)}
    v1 = km.to_observation(row, None)
    assert set(v1["state"]) == {"arm_joint_state", "ee_joint_state"} and "instruction" not in v1
    batch = km.to_batch(v1, spec)
    np.testing.assert_array_equal(batch[STATE], [[1, 2, 3]])
    chunk = np.arange(9, dtype=np.float32).reshape(3, 3)
    np.testing.assert_array_equal(km.to_chunk(km.to_actions(chunk)), chunk)
    with pytest.raises(FieldError, match=r"actions\[1\].ee_joint_state: expected numeric \(1,\), received nothing"):
        km.to_chunk([{"arm_joint_state": [0, 0], "ee_joint_state": [1]}, {"arm_joint_state": [0, 0]}])
    with pytest.raises(FieldError, match="a non-empty list"):
        km.to_chunk([])


def test_xpl_references_and_spec_from_env():
    assert parse_ref("xpl://gpu-box:19000") == ("xpl://gpu-box:19000", {})
    address, opts = parse_ref("xpl://h:1?chunk_size=8&n_action_steps=4&timeout_s=2.5&state=a:1&state=b:2&env=push")
    assert opts == {"chunk_size": 8, "n_action_steps": 4, "timeout_s": 2.5, "state": "a:1,b:2", "env": "push"}
    for bad, match in (
        ("xpl://h", "expected xpl://HOST:PORT"),
        ("xpl://h:1?chunk=3", "unknown option 'chunk'"),
        ("xpl://h:1?chunk_size=0", "chunk_size: expected a positive integer, received '0'"),
        ("xpl://h:1?n_action_steps=-2", "n_action_steps: expected a positive integer, received '-2'"),
        ("xpl://h:1?timeout_s=nan", "timeout_s: expected a positive number, received 'nan'"),
        ("xpl://h:1?timeout_s=abc", "timeout_s: expected a positive number, received 'abc'"),
    ):
        with pytest.raises(ValueError, match=match):
            parse_ref(bad)
    env = EnvSpec(
        "arm",
        {
            STATE: FeatureSpec("float32", (3,), names=("j0", "j1", "gripper")),
            IMG + "front": FeatureSpec("uint8", (4, 4, 3)),
            "observation.environment_state": FeatureSpec("float32", (5,)),
            "task": FeatureSpec("string", ()),
        },
        JOINTS,
        control_frequency=15.0,
        max_episode_steps=10,
    )
    spec = spec_from_env(env, chunk_size=6, n_action_steps=3)
    assert set(spec.observation_features) == {STATE, IMG + "front", "task"}
    assert (spec.chunk_size, spec.n_action_steps, spec.n_obs_steps, spec.control_frequency) == (6, 3, 1, 15.0)
    assert spec.action == JOINTS
    assert set(spec_from_env(env, cameras="").observation_features) == {STATE, "task"}
