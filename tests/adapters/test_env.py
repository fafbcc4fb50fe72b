"""EnvAdapter spaces and the key-map wrapper for foreign gymnasium envs."""

import gymnasium as gym
import numpy as np
import pytest

from policylink.adapters.env import GymEnvAdapter, ObsMap, observation_space
from policylink.adapters.schema import ActionError, ActionSpec, EnvSpec, FeatureSpec, SpecError


class ForeignEnv(gym.Env):
    """A foreign env with its own key names: obs {'qpos': (3,), 'goal': (2,)}; success when action[0] > 0.5."""

    def __init__(self):
        self.observation_space = gym.spaces.Dict(
            {"qpos": gym.spaces.Box(-1, 1, (3,), np.float64), "goal": gym.spaces.Box(-1, 1, (2,), np.float64)}
        )
        self.action_space = gym.spaces.Box(-1, 1, (2,), np.float32)
        self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return {"qpos": np.array([0.1, 0.2, 0.3]), "goal": np.array([0.5, -0.5])}, {}

    def step(self, action):
        self.t += 1
        obs = {"qpos": np.array([0.1, 0.2, 0.3]) + self.t, "goal": np.array([0.5, -0.5])}
        return obs, -1.0, False, self.t >= 3, {"success": bool(action[0] > 0.5)}


SPEC = EnvSpec(
    name="foreign",
    control_frequency=20.0,
    max_episode_steps=3,
    tasks=("reach the goal",),
    observation_features={
        "observation.state": FeatureSpec("float32", (2,), names=("q0", "q2"), unit="rad"),
        "observation.environment_state": FeatureSpec("float32", (2,), unit="m"),
        "task": FeatureSpec("string", ()),
    },
    action=ActionSpec(names=("t0", "t1"), control_mode="joint_torque", units=("N*m", "N*m"), low=(-1, -1), high=(1, 1)),
)
MAP = {"observation.state": ObsMap("qpos", (0, 2)), "observation.environment_state": ObsMap("goal")}


def test_key_map_selects_exact_values_and_casts():
    env = GymEnvAdapter(ForeignEnv(), SPEC, MAP)
    obs, info = env.reset(seed=1)
    np.testing.assert_array_equal(obs["observation.state"], np.array([0.1, 0.3], np.float32))
    assert obs["observation.state"].dtype == np.float32
    np.testing.assert_array_equal(obs["observation.environment_state"], np.array([0.5, -0.5], np.float32))
    assert obs["task"] == "reach the goal" and info["is_success"] is False
    assert env.observation_space.contains(obs)
    obs, r, term, trunc, info = env.step(np.array([0.9, 0.0], np.float32))
    np.testing.assert_allclose(obs["observation.state"], [1.1, 1.3], rtol=1e-6)
    assert info["is_success"] is True and r == -1.0


def test_missing_map_entry_and_bad_action_are_named():
    with pytest.raises(SpecError, match="observation.environment_state: no ObsMap entry"):
        GymEnvAdapter(ForeignEnv(), SPEC, {"observation.state": ObsMap("qpos", (0, 2))})
    env = GymEnvAdapter(ForeignEnv(), SPEC, MAP)
    env.reset()
    with pytest.raises(ActionError, match=r"expected shape \(\.\.\., 2\)"):
        env.step(np.zeros(3, np.float32))


def test_declared_shape_mismatch_is_reported():
    bad_map = {**MAP, "observation.state": ObsMap("qpos")}  # (3,) where the spec says (2,)
    env = GymEnvAdapter(ForeignEnv(), SPEC, bad_map)
    with pytest.raises(SpecError, match=r"observation.state: expected shape \(2,\), received \(3,\)"):
        env.reset()


def test_observation_space_types():
    space = observation_space(
        {
            "observation.images.top": FeatureSpec("uint8", (8, 8, 3)),
            "task": FeatureSpec("string", ()),
            "observation.state": FeatureSpec("float32", (4,)),
        }
    )
    assert space["observation.images.top"].dtype == np.uint8 and space["observation.images.top"].high.max() == 255
    assert space["task"].contains("Put the red block in the bin.")
    assert space["observation.state"].shape == (4,)


def test_out_of_range_map_index_is_a_spec_error():
    env = GymEnvAdapter(ForeignEnv(), SPEC, {**MAP, "observation.state": ObsMap("qpos", (0, 7))})
    with pytest.raises(SpecError, match=r"observation.state: indices \[0, 7\] out of range for source 'qpos'"):
        env.reset()
