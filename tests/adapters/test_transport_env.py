"""EnvServer / RemoteEnv: a gymnasium env across a process boundary, exact observations, live robots, errors; over
ZeroMQ and over a ``unix://`` socket."""

import gymnasium as gym
import numpy as np
import pytest

from policylink.adapters.env import EnvAdapter
from policylink.adapters.protocol import RemoteError
from policylink.adapters.schema import ActionError, ActionSpec, EnvSpec, FeatureSpec
from policylink.adapters.transport import EnvServer, RemoteEnv

ENV_SPEC = EnvSpec(
    "point",
    {
        "observation.state": FeatureSpec("float32", (2,)),
        "observation.images.top": FeatureSpec("uint8", (4, 4, 3)),
        "task": FeatureSpec("string", ()),
    },
    ActionSpec(("dx", "dy"), "ee_delta", ("m", "m"), (-1.0, -1.0), (1.0, 1.0)),
    control_frequency=10.0,
    max_episode_steps=5,
    tasks=("reach the origin",),
)


class PointEnv(EnvAdapter):
    """A point at ``seed`` units from the origin on x; an action moves it; success within 0.05 m."""

    def __init__(self):
        self.env_spec = ENV_SPEC
        self._init_spaces()
        self.pos = np.zeros(2, np.float32)
        self.t = 0

    def _obs(self):
        img = np.zeros((4, 4, 3), np.uint8)
        img[..., 0] = self.t
        return {"observation.state": self.pos.copy(), "observation.images.top": img, "task": "reach the origin"}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.pos = np.array([float(seed or 0), (options or {}).get("y", 0.0)], np.float32)
        self.t = 0
        return self._obs(), {"is_success": False}

    def step(self, action):
        if action[0] > 0.99:
            raise RuntimeError("simulated joint limit")
        self.pos = self.pos + action
        self.t += 1
        success = bool(np.linalg.norm(self.pos) < 0.05)
        return (
            self._obs(),
            -float(np.linalg.norm(self.pos)),
            success,
            self.t >= 5,
            {"is_success": success, "dist": np.float32(0.5)},
        )


class LivePointEnv(PointEnv):
    """PointEnv that also exposes get_observation / send_action (a LiveEnv, like a robot)."""

    def get_observation(self):
        return self._obs()

    def send_action(self, action):
        self.pos = self.pos + 2 * action


@pytest.fixture(params=["tcp", "unix"])
def served(request, tmp_path):
    """The env server over ZeroMQ (tcp) and over a Unix socket file (adapters.local_wire), and its client."""
    bind = "tcp://127.0.0.1:0" if request.param == "tcp" else f"unix://{tmp_path}/env.sock"
    srv = EnvServer(PointEnv(), bind).start()
    env = RemoteEnv(srv.endpoint, timeout_s=5)
    yield srv, env
    env.close()
    srv.stop()


def test_remote_env_is_a_gymnasium_env_with_the_served_spec(served):
    _, env = served
    assert isinstance(env, gym.Env) and env.env_spec == ENV_SPEC
    assert env.action_space.shape == (2,) and env.observation_space["observation.images.top"].shape == (4, 4, 3)


def test_reset_and_step_round_trip_exact_values(served):
    srv, env = served
    obs, info = env.reset(seed=1, options={"y": 0.5})
    np.testing.assert_array_equal(obs["observation.state"], [1.0, 0.5])
    assert obs["task"] == "reach the origin" and info == {"is_success": False}
    assert obs["observation.state"].dtype == np.float32
    obs, reward, terminated, truncated, info = env.step(np.array([-0.5, -0.25], np.float32))
    np.testing.assert_array_equal(obs["observation.state"], [0.5, 0.25])
    assert obs["observation.images.top"].dtype == np.uint8 and obs["observation.images.top"][0, 0, 0] == 1
    assert reward == pytest.approx(-np.hypot(0.5, 0.25), rel=1e-6)
    assert (terminated, truncated, info["is_success"]) == (False, False, False)
    assert info["dist"] == np.float32(0.5) and info["dist"].dtype == np.float32
    obs, _, terminated, _, info = env.step(np.array([-0.5, -0.25], np.float32))
    assert terminated and info["is_success"]
    np.testing.assert_array_equal(env.get_observation()["observation.state"], [0.0, 0.0])
    assert srv.stats.snapshot()["step"]["count"] == 2


def test_bad_actions_and_env_failures_are_structured(served):
    _, env = served
    with pytest.raises(RemoteError, match="env_failed: get_observation: no observation yet"):
        env.get_observation()
    env.reset(seed=0)
    with pytest.raises(ActionError, match=r"action: expected shape \(2,\) \('dx', 'dy'\), received shape \(3,\)"):
        env.step(np.zeros(3, np.float32))  # checked before sending
    with pytest.raises(RemoteError) as err:
        env._channel.request("step", {"action": np.zeros(3, np.float64)})  # bypassing the local check
    assert err.value.code == "invalid_field" and err.value.field == "body.action"
    assert "expected shape (2,)" in err.value.message and "received shape (3,)" in err.value.message
    with pytest.raises(RemoteError) as err:
        env.step(np.array([1.0, 0.0], np.float32))
    assert err.value.code == "env_failed" and "RuntimeError: simulated joint limit" in err.value.message
    with pytest.raises(RemoteError) as err:
        env.send_action(np.zeros(2, np.float32))
    assert err.value.code == "unsupported"
    obs, *_ = env.step(np.array([0.25, 0.0], np.float32))  # still serving
    np.testing.assert_array_equal(obs["observation.state"], [0.25, 0.0])


def test_live_env_reads_sensors_and_sends_actions_without_stepping():
    srv = EnvServer(LivePointEnv(), "tcp://127.0.0.1:0").start()
    env = RemoteEnv(srv.endpoint, timeout_s=5)
    try:
        env.reset(seed=2)
        env.send_action(np.array([0.5, 0.25], np.float32))
        np.testing.assert_array_equal(env.get_observation()["observation.state"], [3.0, 0.5])
    finally:
        env.close()
        srv.stop()


def test_policy_client_refuses_an_env_server(served):
    from policylink.adapters.protocol import ProtocolError
    from policylink.adapters.transport import RemotePolicy

    srv, _ = served
    with pytest.raises(ProtocolError, match="kind: expected a policy server"):
        RemotePolicy(srv.endpoint, timeout_s=5)


def test_step_contract_before_reset_none_nan_and_float64_lists(served):
    srv, env = served
    with pytest.raises(RuntimeError, match=r"^step\(\) before reset\(\): call reset\(\) first$"):
        env.step([0.0, 0.0])
    assert "step" not in srv.stats.snapshot()  # refused client-side, nothing sent
    env.reset(seed=2)
    with pytest.raises(ActionError, match=r"action: expected an array-like of 2 floats \('dx', 'dy'\), received None"):
        env.step(None)
    with pytest.raises(ActionError, match=r"action: expected an array-like of 2 floats .*received str"):
        env.step("left")
    with pytest.raises(ActionError, match=r"action\[1\] \(dy\): expected a finite value, received nan"):
        env.step([0.0, float("nan")])
    obs, *_ = env.step([-0.5, 0.25])  # a float64 list, converted to float32 before sending
    np.testing.assert_array_equal(obs["observation.state"], [1.5, 0.25])
    obs, *_ = env.step(np.array([-5.0, -3.0]))  # outside [-1, 1]: clipped to (-1, -1)
    np.testing.assert_array_equal(obs["observation.state"], [0.5, -0.75])


def test_server_converts_and_clips_actions_from_any_client(served):
    _, env = served
    env.reset(seed=0)
    reply = env._channel.request("step", {"action": np.array([-7.0, 0.5], np.float64)})  # raw, bypassing the client
    np.testing.assert_array_equal(reply["observation"]["observation.state"], [-1.0, 0.5])


class IntKeyInfoEnv(PointEnv):
    """Reports its step info with a non-str key, which the wire cannot carry."""

    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        return obs, reward, terminated, truncated, {**info, 7: "seven"}


def test_env_replies_with_a_non_str_map_key_are_env_failed_naming_it():
    srv = EnvServer(IntKeyInfoEnv(), "tcp://127.0.0.1:0").start()
    try:
        env = RemoteEnv(srv.endpoint, timeout_s=5)
        env.reset(seed=1)
        with pytest.raises(RemoteError, match=r"reply not encodable: .*info\[7\]: map keys must be str") as err:
            env.step(np.array([0.1, 0.0], np.float32))
        assert err.value.code == "env_failed"
        env.close()
    finally:
        srv.stop()
