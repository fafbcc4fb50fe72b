"""Consuming XPolicyLab model servers: a transcript recorded from XPolicyLab's own server pins the protocol byte for
byte (our reference server and our server reproduce it where the protocol is deterministic), our ``xpl://`` client
drives the reference server (chunks equal the model's, executors on top, a whole ``policylink run``), and a dead or
stuck server is a clear error within the timeout."""

import json
import re
import socket
import time
from pathlib import Path

import msgpack
import numpy as np
import pytest

pytest.importorskip("msgpack_numpy")
websockets = pytest.importorskip("websockets")

from policylink.adapters.policy import HistoryPolicy  # noqa: E402
from policylink.adapters.protocol import RemoteError  # noqa: E402
from policylink.adapters.schema import ActionSpec, EnvSpec, FeatureSpec, PolicySpec  # noqa: E402
from policylink.adapters.ws import connect  # noqa: E402
from policylink.adapters.xpolicylab import XPolicyLabRemotePolicy, XPolicyLabServer  # noqa: E402
from policylink.policies import load_policy  # noqa: E402
from tests.adapters.fixtures.xpolicylab_record import observation  # noqa: E402
from tests.adapters.xpolicylab_reference import ReferenceServer, expected_chunk, normalised  # noqa: E402

TRANSCRIPT = json.loads((Path(__file__).parent / "fixtures" / "xpolicylab_transcript.json").read_text())["entries"]
STATE = "observation.state"
FRONT = "observation.images.front"
ENV = EnvSpec(  # the env the remote policy runs on: a 2-joint arm + gripper with one camera
    "arm",
    {
        STATE: FeatureSpec("float32", (3,), names=("j0", "j1", "gripper")),
        FRONT: FeatureSpec("uint8", (8, 8, 3)),
        "task": FeatureSpec("string", ()),
    },
    ActionSpec(
        ("j0", "j1", "gripper"), "joint_position", ("rad", "rad", "1"), (-100,) * 3, (100,) * 3, gripper_index=2
    ),
    control_frequency=30.0,
    max_episode_steps=10,
)


def _replay(url: str) -> list[bytes | None]:
    """Send every transcript request on one connection; the reply to each (None where none came first)."""
    ws = connect(url, 5.0)
    try:
        replies = []
        for entry in TRANSCRIPT:
            ws.send(bytes.fromhex(entry["request"]))
            if entry["reply"] is None:  # the next request (a heartbeat) must be answered first
                replies.append(None)
                continue
            replies.append(ws.recv(timeout=5.0))
        return replies
    finally:
        ws.close()


def test_transcript_shape():
    names = [e["name"] for e in TRANSCRIPT]
    assert names[:7] == [
        "hello",
        "heartbeat",
        "prepare_case",
        "reset",
        "infer",
        "infer_missing_observation",
        "trial_end",
    ]
    silent = [e["name"] for e in TRANSCRIPT if e["reply"] is None]
    assert silent == [
        "bad_msgpack",
        "not_a_map",
        "missing_message_id",
        "missing_evaluation_id",
        "unknown_message_type",
        "payload_not_a_map",
        "object_array",
    ]


def test_reference_server_reproduces_the_recorded_transcript_byte_for_byte():
    with ReferenceServer() as ref:
        replies = _replay(ref.url)
    for entry, got in zip(TRANSCRIPT, replies):
        if entry["reply"] is None:
            assert got is None, entry["name"]
        else:
            assert normalised(got) == normalised(bytes.fromhex(entry["reply"])), entry["name"]


class ArmPolicy(HistoryPolicy):
    """Our twin of the recording model: chunk step h = state + mean(front image) + h, 4 steps."""

    def __init__(self):
        super().__init__(
            PolicySpec({k: ENV.observation_features[k] for k in (STATE, FRONT)}, ENV.action, 1, 4, 4, 30.0)
        )

    def _predict(self, history, pad_mask, tasks):
        s = history[STATE][:, -1] + history[FRONT][:, -1].mean(axis=(1, 2, 3))[:, None]
        return (s[:, None, :] + np.arange(4, dtype=np.float32)[None, :, None]).astype(np.float32)


def _replay_by_id(url: str) -> dict[str, bytes | None]:
    """Send every transcript request; each request's reply by name, matched by ``message_id`` (None: no reply)."""
    ids = {}
    for e in TRANSCRIPT:
        try:
            ids[e["name"]] = msgpack.unpackb(bytes.fromhex(e["request"]), raw=False)["message_id"]
        except Exception:  # bad msgpack, not a map, no id
            ids[e["name"]] = None
    ws = connect(url, 5.0)
    try:
        got: dict[str, bytes] = {}
        for entry in TRANSCRIPT:
            ws.send(bytes.fromhex(entry["request"]))
            while entry["reply"] is not None and ids[entry["name"]] not in got:  # silent ones: see the heartbeat next
                reply = ws.recv(timeout=5.0)
                got[msgpack.unpackb(reply, raw=False, strict_map_key=False)["message_id"]] = reply
        return {name: got.get(mid) for name, mid in ids.items()}
    finally:
        ws.close()


def test_our_server_answers_like_xpolicylab_where_the_protocol_is_deterministic():
    """heartbeat, prepare_case, reset, infer and trial_end replies are byte-identical to XPolicyLab's (sent_at and
    latency_ms aside); hello_ack carries our spec besides ok; errors keep upstream's codes; frames whose id can be
    read get an error naming the problem where upstream stays silent (documented in adapters/xpolicylab.py), the
    others no reply."""
    with XPolicyLabServer(ArmPolicy(), port=0) as server:
        replies = _replay_by_id(server.url)
    recorded = {e["name"]: e["reply"] for e in TRANSCRIPT}
    for name in ("heartbeat", "prepare_case", "reset", "infer", "trial_end", "heartbeat_after_object_array"):
        assert normalised(replies[name]) == normalised(bytes.fromhex(recorded[name])), name
    hello = msgpack.unpackb(replies["hello"], raw=False)
    assert hello["payload"]["ok"] is True and hello["payload"]["policylink"]["spec"] == ArmPolicy().spec.to_dict()
    error = msgpack.unpackb(replies["infer_missing_observation"], raw=False)
    assert error["message_type"] == "error" and error["payload"]["code"] == "invalid_frame"
    assert error["payload"]["details"]["field"] == "payload.observation"
    for name in ("bad_msgpack", "not_a_map", "missing_message_id", "object_array"):
        assert replies[name] is None, name
    codes = {
        name: msgpack.unpackb(replies[name], raw=False)["payload"]["code"]
        for name in ("missing_evaluation_id", "unknown_message_type", "payload_not_a_map")
    }
    assert codes == {
        "missing_evaluation_id": "invalid_frame",
        "unknown_message_type": "unknown_message_type",
        "payload_not_a_map": "invalid_frame",
    }


def test_xpl_client_drives_the_reference_server_with_the_env_spec():
    with ReferenceServer() as ref:
        policy = load_policy(f"xpl://127.0.0.1:{ref.port}?chunk_size=4&n_action_steps=2", env_spec=ENV)
        try:
            assert policy.spec.chunk_size == 4 and policy.spec.n_action_steps == 2
            assert set(policy.spec.observation_features) == {STATE, FRONT, "task"}
            policy.reset()
            obs = observation()
            state = np.concatenate([obs["state"]["arm_joint_state"], obs["state"]["ee_joint_state"]])
            policy.update_observation(
                {STATE: state[None], FRONT: obs["vision"]["cam_head"]["color"][None], "task": ["go"]}
            )
            chunk = policy.predict_action_chunk()
            np.testing.assert_array_equal(chunk[0], expected_chunk(obs))
            kinds = [r["message_type"] for r in ref.requests]
            assert kinds == ["hello", "reset", "infer"]
            sent = ref.requests[-1]["payload"]["observation"]
            assert sent["instruction"] == "go" and sent["data_format_version"] == "v1.0"
            np.testing.assert_array_equal(sent["state"]["ee_joint_state"], [0.5])
        finally:
            policy.close()
        deadline = time.monotonic() + 10  # the server thread records the last frames after close() returns
        while len(ref.requests) < 5 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert [r["message_type"] for r in ref.requests][-2:] == ["trial_end", "close"]


def test_xpl_client_reports_a_server_error_and_keeps_working():
    class Failing:
        calls = 0

        def reset(self):
            pass

        def infer(self, obs):
            self.calls += 1
            if self.calls == 1:
                raise RuntimeError("CUDA out of memory")
            return [{"arm_joint_state": np.zeros(2, np.float32), "ee_joint_state": np.ones(1, np.float32)}]

    with ReferenceServer(Failing()) as ref:
        policy = XPolicyLabRemotePolicy(f"xpl://127.0.0.1:{ref.port}", env_spec=ENV, timeout_s=5)
        policy.reset()
        batch = {STATE: np.zeros((1, 3), np.float32), FRONT: np.zeros((1, 8, 8, 3), np.uint8), "task": ["go"]}
        policy.update_observation(batch)
        with pytest.raises(RemoteError, match="infer_failed: CUDA out of memory"):
            policy.predict_action_chunk()
        np.testing.assert_array_equal(policy.predict_action_chunk()[0], [[0, 0, 1]])
        policy.close()


class _ReachModel:
    """A saturated P-controller toward the target, as XPolicyLab would serve it: state (6,) = ee xyz + target xyz
    in ``arm_joint_state``; 4 steps of the same ee delta in ``arm_joint_state``."""

    def reset(self):
        pass

    def infer(self, obs):
        s = obs["state"]["arm_joint_state"]
        delta = np.clip(0.9 * (s[3:6] - s[0:3]), -0.02, 0.02).astype(np.float32)
        return [{"arm_joint_state": delta} for _ in range(4)]


@pytest.mark.parametrize(("kind", "period"), [("receding_horizon", 2), ("temporal_ensemble", 1)])
def test_policylink_run_evaluates_an_xpolicylab_served_policy(capsys, kind, period):
    """``policylink run --policy xpl://...`` on reach: the served P-controller succeeds, and the executor asks for a
    chunk every ``n_action_steps`` = 2 steps (receding horizon) or every step (temporal ensembling)."""
    pytest.importorskip("mujoco")
    from policylink.evaluate.run import RunConfig, run_policy
    from policylink.runtime.executors import ExecutorConfig

    with ReferenceServer(_ReachModel()) as ref:
        ref_str = f"xpl://127.0.0.1:{ref.port}?chunk_size=4&n_action_steps=2"
        cfg = RunConfig(policy=ref_str, env="reach", episodes=2, executor=ExecutorConfig(kind=kind), device="cpu")
        assert run_policy(cfg) == 0
        kinds = [r["message_type"] for r in ref.requests]
    out = capsys.readouterr().out
    steps = [int(m) for m in re.findall(r"success=True steps=(\d+)", out)]
    assert len(steps) == 2 and "success: 2/2" in out, out
    assert kinds[0] == "hello" and kinds.count("infer") == sum(-(-n // period) for n in steps)


def test_dead_server_is_a_clear_error_within_the_timeout():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t0 = time.monotonic()
    with pytest.raises(ConnectionError, match=rf"xpl://127.0.0.1:{port}: cannot connect .*timeout 2 s"):
        XPolicyLabRemotePolicy(f"xpl://127.0.0.1:{port}", env_spec=ENV, timeout_s=2)
    assert time.monotonic() - t0 < 2


def test_silent_listener_times_out_at_the_handshake():
    with socket.socket() as listener:  # accepts TCP, never speaks websocket
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        t0 = time.monotonic()
        with pytest.raises(TimeoutError, match=rf"xpl://127.0.0.1:{port}: no websocket handshake within 0.5 s"):
            XPolicyLabRemotePolicy(f"xpl://127.0.0.1:{port}", env_spec=ENV, timeout_s=0.5)
        assert time.monotonic() - t0 < 5


def test_stuck_model_times_out_and_the_next_call_reconnects():
    with ReferenceServer(hang_infer=True) as ref:
        policy = XPolicyLabRemotePolicy(f"xpl://127.0.0.1:{ref.port}", env_spec=ENV, timeout_s=0.5)
        policy.update_observation(
            {STATE: np.zeros((1, 3), np.float32), FRONT: np.zeros((1, 8, 8, 3), np.uint8), "task": ["go"]}
        )
        t0 = time.monotonic()
        with pytest.raises(TimeoutError, match=r"no reply to 'infer' within 0.5 s; the next call reconnects"):
            policy.predict_action_chunk()
        assert time.monotonic() - t0 < 5
        policy.reset()  # a fresh connection: hello, then reset
        assert [r["message_type"] for r in ref.requests][-2:] == ["hello", "reset"]
        policy.close()


def test_no_spec_anywhere_is_a_clear_error():
    with ReferenceServer() as ref, pytest.raises(ValueError, match="advertises none .*'server'.*\\?env=NAME"):
        load_policy(f"xpl://127.0.0.1:{ref.port}")
