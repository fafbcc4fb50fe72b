"""Serving over XPolicyLab's protocol: the unmodified inspect-robots-xpolicylab client drives ``policylink serve
--protocol xpolicylab`` and gets the policy's own actions exactly; malformed messages of every kind get an error
naming the field, or no reply where the protocol gives none, and the next valid request is answered."""

import pickle
import socket
import threading
import time

import msgpack
import numpy as np
import pytest

msgpack_numpy = pytest.importorskip("msgpack_numpy")
pytest.importorskip("websockets")

from policylink.adapters import registry  # noqa: E402
from policylink.adapters.policy import HistoryPolicy  # noqa: E402
from policylink.adapters.schema import ActionSpec, FeatureSpec, PolicySpec  # noqa: E402
from policylink.adapters.ws import connect  # noqa: E402
from policylink.adapters.xpolicylab import XPolicyLabServer  # noqa: E402
from policylink.cli import serve as serve_cli  # noqa: E402

# inspect-robots-xpolicylab 0.1.0 opens its websocket the pre-websockets-17 way; that warning is theirs, not ours.
pytestmark = pytest.mark.filterwarnings("ignore:connect\\(\\) must be used as a context manager:DeprecationWarning")

STATE, FRONT = "observation.state", "observation.images.front"
SPEC = PolicySpec(
    {
        STATE: FeatureSpec("float32", (3,), names=("j0", "j1", "gripper")),
        FRONT: FeatureSpec("uint8", (8, 8, 3)),
        "task": FeatureSpec("string", ()),
    },
    ActionSpec(("j0", "j1", "g"), "joint_position", ("rad", "rad", "1"), (-1e3,) * 3, (1e3,) * 3, gripper_index=2),
    chunk_size=4,
    n_action_steps=2,
    control_frequency=30.0,
)


class ArmPolicy(HistoryPolicy):
    """chunk step h = state + mean(front) + 0.25 * h + len(task); raises on state[0] == 666; can be held."""

    def __init__(self):
        super().__init__(SPEC)
        self.tasks, self.hold = [], None

    def _predict(self, history, pad_mask, tasks):
        if self.hold is not None:
            self.hold.wait(10)
        state = history[STATE][:, -1]
        if state[0, 0] == 666:
            raise RuntimeError("joint limit model blew up")
        self.tasks.append(tasks)
        s = state + history[FRONT][:, -1].mean(axis=(1, 2, 3))[:, None] + np.float32(len(tasks[0]))
        return (s[:, None, :] + 0.25 * np.arange(4)[None, :, None]).astype(np.float32)


def _own_chunk(state, image, task):
    policy = ArmPolicy()
    policy.update_observation({STATE: state[None], FRONT: image[None], "task": [task]})
    return policy.predict_action_chunk()[0]


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_inspect_robots_client_drives_policylink_serve(monkeypatch):
    ir = pytest.importorskip("inspect_robots")
    from inspect_robots_xpolicylab import XPolicyLabPolicy

    registry.register_policy("xpl_arm_test", ArmPolicy, overwrite=True)
    port = _free_port()
    argv = ["--policy", "xpl_arm_test", "--protocol", "xpolicylab", "--port", str(port), "--duration_s", "30"]
    result = {}
    thread = threading.Thread(target=lambda: result.setdefault("rc", serve_cli.main(argv)), daemon=True)
    thread.start()
    client = XPolicyLabPolicy(
        url=f"ws://127.0.0.1:{port}",
        cameras={"cam_head": "front"},
        state_map={"arm_joint_state": "joint_pos", "ee_joint_state": "gripper"},
        arm_dim=2,
        ee_dim=1,
        connect_attempts=40,
        connect_retry_delay_s=0.25,
        request_timeout_s=10,
    )
    rng = np.random.default_rng(0)
    try:
        client.reset(ir.Scene(id="push-0", instruction="push the red block"))
        for _ in range(3):
            state = rng.normal(size=3).astype(np.float32)
            image = rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)
            obs = ir.Observation(images={"front": image}, state={"joint_pos": state[:2], "gripper": state[2:]})
            chunk = client.act(obs)
            got = np.stack([a.data for a in chunk.actions])
            assert got.shape == (4, 3)
            np.testing.assert_array_equal(got, _own_chunk(state, image, "push the red block").astype(np.float64))
            assert chunk.meta["server_latency_ms"] >= 0
    finally:
        client.close()
    assert "rc" not in result  # still serving


@pytest.fixture
def server():
    srv = XPolicyLabServer(ArmPolicy(), port=0).start()
    yield srv
    srv.stop()


def _frame(kind="infer", payload=None, mid="m1", **over):
    wire = {"message_type": kind, "message_id": mid, "evaluation_id": "e", "step": 0, "payload": payload or {}}
    wire.update(over)
    return {k: v for k, v in wire.items() if v is not _DROP}


_DROP = object()
IMAGE = np.full((8, 8, 3), 4, np.uint8)
ARM, GRIP = np.array([1.0, 2.0], np.float32), np.array([0.5], np.float32)


def _obs(**over):
    obs = {
        "data_format_version": "v1.0",
        "instruction": "go",
        "vision": {"cam_head": {"color": IMAGE}},
        "state": {"arm_joint_state": ARM, "ee_joint_state": GRIP},
    }
    for path, value in over.items():
        *parents, leaf = path.split("__")
        node = obs
        for p in parents:
            node = node[p]
        if value is _DROP:
            del node[leaf]
        else:
            node[leaf] = value
    return obs


def _pack(wire):
    return msgpack.packb(wire, default=msgpack_numpy.encode, use_bin_type=True)


UNPICKLED = []


def _fire(what):
    UNPICKLED.append(what)


class _Tripwire:
    def __reduce__(self):
        return (_fire, ("unpickled!",))  # a module function: unpickling calls it (test_xpolicylab_keymap.py)


MALFORMED = {  # name -> (bytes or str sent, expected reply: None or (code, field or None))
    "bad msgpack": (b"\xc1\xff\x00", None),
    "text frame": ("hello", None),
    "not a map": (msgpack.packb([1, 2]), None),
    "missing message_id": (_pack(_frame(mid=_DROP, payload={"observation": _obs()})), None),
    "object array": (
        _pack(
            _frame(
                payload={
                    "observation": {
                        "state": {
                            "arm_joint_state": {
                                b"nd": True,
                                b"type": "|O",
                                b"kind": b"O",
                                b"shape": [1],
                                b"data": pickle.dumps(np.array([_Tripwire()], dtype=object)),
                            }
                        }
                    }
                }
            )
        ),
        None,
    ),
    "structured array": (_pack(_frame(payload={"observation": {"x": np.zeros(2, dtype=[("a", "<f4")])}})), None),
    "array data too short": (
        _pack(_frame(payload={"x": {b"nd": True, b"type": "<f4", b"kind": b"", b"shape": [4], b"data": b"\0" * 8}})),
        None,
    ),
    "missing evaluation_id": (_pack(_frame(evaluation_id=_DROP)), ("invalid_frame", None)),
    "unknown message_type": (_pack(_frame(kind="teleport")), ("unknown_message_type", None)),
    "reply type as request": (_pack(_frame(kind="infer_result")), ("unknown_message_type", None)),
    "payload not a map": (_pack(_frame(payload=[1, 2])), ("invalid_frame", None)),
    "step not an int": (_pack(_frame(step="three", payload={"observation": _obs()})), ("invalid_frame", None)),
    "missing observation": (_pack(_frame(payload={})), ("invalid_frame", "payload.observation")),
    "observation not a map": (_pack(_frame(payload={"observation": [1]})), ("invalid_frame", "observation")),
    "missing camera": (
        _pack(_frame(payload={"observation": _obs(vision__cam_head=_DROP)})),
        ("invalid_frame", "observation.vision.cam_head.color"),
    ),
    "wrong image shape": (
        _pack(_frame(payload={"observation": _obs(vision__cam_head__color=np.zeros((8, 9, 3), np.uint8))})),
        ("invalid_frame", "observation.vision.cam_head.color"),
    ),
    "wrong image dtype": (
        _pack(_frame(payload={"observation": _obs(vision__cam_head__color=IMAGE.astype(np.float32))})),
        ("invalid_frame", "observation.vision.cam_head.color"),
    ),
    "wrong state length": (
        _pack(_frame(payload={"observation": _obs(state__arm_joint_state=np.zeros(3, np.float32))})),
        ("invalid_frame", "observation.state.arm_joint_state"),
    ),
    "state key missing": (
        _pack(_frame(payload={"observation": _obs(state__ee_joint_state=_DROP)})),
        ("invalid_frame", "observation.state.ee_joint_state"),
    ),
    "non-finite state": (
        _pack(_frame(payload={"observation": _obs(state__arm_joint_state=np.array([np.nan, 1], np.float32))})),
        ("invalid_frame", "observation.state.arm_joint_state"),
    ),
    "missing instruction": (
        _pack(_frame(payload={"observation": _obs(instruction=_DROP)})),
        ("invalid_frame", "observation.instruction"),
    ),
    "policy raises": (
        _pack(_frame(payload={"observation": _obs(state__arm_joint_state=np.array([666, 0], np.float32))})),
        ("infer_failed", None),
    ),
}


def _roundtrip(ws, data, wait=True):
    ws.send(data)
    ws.send(_pack(_frame(payload={"observation": _obs()}, mid="valid")))
    replies = []
    while True:
        reply = msgpack.unpackb(ws.recv(timeout=10), object_hook=msgpack_numpy.decode, raw=False)
        replies.append(reply)
        if reply["message_id"] == "valid":
            return replies


@pytest.mark.parametrize("name", list(MALFORMED))
def test_malformed_message_gets_an_error_or_no_reply_and_serving_goes_on(server, name):
    data, expected = MALFORMED[name]
    ws = connect(server.url, 5.0)
    try:
        *errors, valid = _roundtrip(ws, data)
    finally:
        ws.close()
    if expected is None:
        assert errors == []
    else:
        (error,) = errors
        code, field = expected
        assert error["message_type"] == "error" and error["payload"]["code"] == code, error
        if field is not None:
            assert error["payload"]["details"]["field"] == field
            assert field in error["payload"]["message"]
            assert {"expected", "received"} <= set(error["payload"]["details"])
    assert valid["message_type"] == "infer_result"
    got = np.stack([np.concatenate([a["arm_joint_state"], a["ee_joint_state"]]) for a in valid["payload"]["actions"]])
    np.testing.assert_array_equal(got, _own_chunk(np.concatenate([ARM, GRIP]), IMAGE, "go"))
    assert UNPICKLED == []


def test_field_error_says_expected_and_received(server):
    ws = connect(server.url, 5.0)
    try:
        (error, _) = _roundtrip(ws, MALFORMED["wrong image shape"][0])
    finally:
        ws.close()
    details = error["payload"]["details"]
    assert details["expected"] == "uint8 array (8, 8, 3)" and details["received"] == "uint8 array (8, 9, 3)"


def test_prepare_case_instruction_reaches_a_language_policy(server):
    ws = connect(server.url, 5.0)
    try:
        ws.send(_pack(_frame(kind="prepare_case", payload={"action_case_id": "c1", "instruction": "stack the cups"})))
        assert msgpack.unpackb(ws.recv(timeout=5), raw=False)["payload"] == {"ok": True}
        ws.send(_pack(_frame(kind="reset", mid="r")))
        assert msgpack.unpackb(ws.recv(timeout=5), raw=False)["message_type"] == "reset_result"
        ws.send(_pack(_frame(payload={"observation": _obs(instruction=_DROP)}, mid="i")))
        reply = msgpack.unpackb(ws.recv(timeout=5), raw=False)
    finally:
        ws.close()
    assert reply["message_type"] == "infer_result" and server.policy.tasks[-1] == ["stack the cups"]


def test_heartbeat_is_answered_during_inference(server):
    server.policy.hold = threading.Event()
    ws = connect(server.url, 5.0)
    try:
        ws.send(_pack(_frame(payload={"observation": _obs()}, mid="slow")))
        ws.send(_pack(_frame(kind="heartbeat", mid="hb")))
        first = msgpack.unpackb(ws.recv(timeout=5), raw=False)
        server.policy.hold.set()
        second = msgpack.unpackb(ws.recv(timeout=10), raw=False)
    finally:
        server.policy.hold.set()
        ws.close()
    assert (first["message_id"], first["message_type"]) == ("hb", "heartbeat_ack")
    assert (second["message_id"], second["message_type"]) == ("slow", "infer_result")


def test_close_closes_the_connection_after_pending_replies(server):
    ws = connect(server.url, 5.0)
    ws.send(_pack(_frame(kind="heartbeat", mid="hb")))
    ws.send(_pack(_frame(kind="close", payload={"reason": "done"}, mid="bye")))
    assert msgpack.unpackb(ws.recv(timeout=5), raw=False)["message_id"] == "hb"
    deadline = time.monotonic() + 5
    with pytest.raises(Exception, match="1000"):
        while time.monotonic() < deadline:
            ws.recv(timeout=5)
    ws.close()


def test_non_loopback_needs_insecure():
    from policylink.adapters.security import InsecureBindError

    with pytest.raises(InsecureBindError, match="--insecure"):
        XPolicyLabServer(ArmPolicy(), host="0.0.0.0", port=0)
    registry.register_policy("xpl_arm_test", ArmPolicy, overwrite=True)
    rc = serve_cli.main(["--policy", "xpl_arm_test", "--protocol", "xpolicylab", "--xpolicylab_host", "0.0.0.0"])
    assert rc == 2


def test_a_policy_needing_an_unmapped_feature_is_refused():
    spec = PolicySpec({"observation.environment_state": FeatureSpec("float32", (2,))}, SPEC.action)

    class Env(HistoryPolicy):
        def _predict(self, history, pad_mask, tasks):
            raise AssertionError

    with pytest.raises(ValueError, match=r"requires \['observation.environment_state'\]"):
        XPolicyLabServer(Env(spec), port=0)
