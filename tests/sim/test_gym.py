"""Foreign gymnasium envs (Reacher-v5, Pusher-v5) through the contract: key maps, spec, images, experts."""

from __future__ import annotations

import math
import os

os.environ.setdefault("MUJOCO_GL", "egl")

import gymnasium as gym
import numpy as np
import pytest

from policylink.adapters import registry
from policylink.adapters.compatibility import check_compatible
from policylink.adapters.env import GymEnvAdapter, ObsMap
from policylink.adapters.schema import (
    STATE_KEY,
    IncompatibleSpecError,
    PolicySpec,
    SpecError,
)
from policylink.sim.gym import (
    REACHER_SUCCESS_TOLERANCE_M,
    make_pusher_env,
    make_reacher_env,
)
from policylink.sim.gym_experts import make_pusher_expert, make_reacher_expert

TOP = "observation.images.top"


@pytest.mark.parametrize(
    ("factory", "gym_id", "dim"), [(make_reacher_env, "Reacher-v5", 10), (make_pusher_env, "Pusher-v5", 23)]
)
def test_state_equals_raw_gymnasium_observation(factory, gym_id, dim):
    env, raw_env = factory(), gym.make(gym_id)
    obs, info = env.reset(seed=5)
    raw, _ = raw_env.reset(seed=5)
    assert info["is_success"] is False
    np.testing.assert_array_equal(obs[STATE_KEY], raw.astype(np.float32))
    action = np.linspace(-0.5, 0.5, env.action_space.shape[0]).astype(np.float32)
    for _ in range(3):
        obs, _, _, _, info = env.step(action)
        raw, *_ = raw_env.step(action)
    np.testing.assert_array_equal(obs[STATE_KEY], raw.astype(np.float32))
    feat = env.env_spec.observation_features[STATE_KEY]
    assert feat.shape == (dim,) and obs[STATE_KEY].dtype == np.float32
    assert len(feat.names) == dim and len(feat.unit.split(",")) == dim
    assert isinstance(info["is_success"], bool)


def test_reacher_spec_read_from_model():
    spec = make_reacher_env().env_spec
    assert spec.name == "reacher"
    assert spec.control_frequency == pytest.approx(50.0)  # timestep 0.01 s x frame_skip 2
    assert spec.max_episode_steps == 50
    assert spec.action.names == ("joint0", "joint1")
    assert spec.action.control_mode.value == "joint_torque"
    assert spec.action.units == ("200*N*m", "200*N*m")
    assert spec.action.low == (-1.0, -1.0) and spec.action.high == (1.0, 1.0)
    feat = spec.observation_features[STATE_KEY]
    assert feat.names[4:6] == ("target_x", "target_y") and feat.unit.split(",")[6] == "rad/s"


def test_pusher_spec_read_from_model():
    spec = make_pusher_env().env_spec
    assert spec.name == "pusher"
    assert spec.control_frequency == pytest.approx(20.0)  # timestep 0.01 s x frame_skip 5
    assert spec.max_episode_steps == 100
    assert spec.action.dim == 7 and spec.action.names[0] == "r_shoulder_pan_joint"
    assert spec.action.units == ("N*m",) * 7 and spec.action.high == (2.0,) * 7
    assert spec.observation_features[STATE_KEY].names[17:20] == ("object_x", "object_y", "object_z")


def test_registry_entry_points_build_the_envs():
    assert {"reacher", "pusher"} <= set(registry.available_envs())
    env = registry.make_env("reacher", obs_mode="state")
    assert env.env_spec.name == "reacher"


def test_seeded_reset_reproduces_first_observation():
    env = make_reacher_env()
    a, _ = env.reset(seed=11)
    env.step(np.ones(2, dtype=np.float32))
    b, _ = env.reset(seed=11)
    c, _ = env.reset(seed=12)
    np.testing.assert_array_equal(a[STATE_KEY], b[STATE_KEY])
    assert not np.array_equal(a[STATE_KEY][4:6], c[STATE_KEY][4:6])  # a different target


def test_top_image_orientation_up_is_plus_y_right_is_plus_x():
    env = make_reacher_env(obs_mode="state+image", image_size=96)
    obs, _ = env.reset(seed=0)
    assert obs[TOP].shape == (96, 96, 3) and obs[TOP].dtype == np.uint8
    mj = env.env.unwrapped
    half_width = 0.8 * math.tan(math.radians(22.5))  # camera 0.8 m above, fovy 45 deg -> metres per half image
    for tx, ty in [(0.15, 0.1), (-0.15, -0.1), (0.0, 0.15)]:
        mj.set_state(np.array([-np.pi / 2, 0.0, tx, ty]), np.zeros(4))  # arm points to -y, away from the target
        img = env.render().astype(int)
        red = (img[..., 0] > 2.5 * img[..., 1]) & (img[..., 0] > 2.5 * img[..., 2]) & (img[..., 0] > 40)
        rows, cols = np.nonzero(red)
        assert rows.size > 0, f"target not visible at {(tx, ty)}"
        assert cols.mean() == pytest.approx(48 + 48 * tx / half_width, abs=2.0)
        assert rows.mean() == pytest.approx(48 - 48 * ty / half_width, abs=2.0)


def test_image_only_mode_and_bad_arguments():
    env = make_pusher_env(obs_mode="image", image_size=32)
    obs, _ = env.reset(seed=0)
    assert set(obs) == {TOP} and obs[TOP].shape == (32, 32, 3)
    with pytest.raises(ValueError, match="obs_mode"):
        make_reacher_env(obs_mode="pixels")
    with pytest.raises(ValueError, match="render_mode"):
        make_reacher_env(obs_mode="image", render_mode="human")


def test_bad_key_map_raises_spec_error_naming_the_field():
    good = make_reacher_env()
    wrong = GymEnvAdapter(gym.make("Reacher-v5"), good.env_spec, {STATE_KEY: ObsMap(indices=tuple(range(9)))})
    with pytest.raises(SpecError, match=r"observation\.state: expected shape \(10,?\), received \(9,\)"):
        wrong.reset(seed=0)
    with pytest.raises(SpecError, match=r"observation\.state: no ObsMap entry"):
        GymEnvAdapter(gym.make("Reacher-v5"), good.env_spec, {})


def test_reacher_success_predicate_uses_the_stated_tolerance():
    env = make_reacher_env()
    env.reset(seed=0)
    mj = env.env.unwrapped
    mj.set_state(np.array([0.0, 0.0, 0.21 - 0.5 * REACHER_SUCCESS_TOLERANCE_M, 0.0]), np.zeros(4))
    _, _, _, _, info = env.step(np.zeros(2, dtype=np.float32))
    assert info["is_success"] is True  # fingertip at (0.21, 0), target 1 cm away
    mj.set_state(np.array([0.0, 0.0, 0.21 - 1.5 * REACHER_SUCCESS_TOLERANCE_M, 0.0]), np.zeros(4))
    _, _, _, _, info = env.step(np.zeros(2, dtype=np.float32))
    assert info["is_success"] is False  # 3 cm away


def _reacher_final_successes(quality: str, seeds: range) -> int:
    env = make_reacher_env()
    expert = make_reacher_expert(env, quality)
    wins = 0
    for seed in seeds:
        obs, _ = env.reset(seed=seed)
        expert.reset(seed)
        for _ in range(env.env_spec.max_episode_steps):
            action = expert.act(obs, env)
            assert action.dtype == np.float32 and action.shape == (2,)
            assert np.all(np.abs(action) <= 1.0)
            obs, _, terminated, truncated, info = env.step(action)
            if terminated or truncated:
                break
        assert truncated  # Reacher-v5 only ends by its 50-step time limit
        wins += info["is_success"]
    return wins


def test_reacher_expert_succeeds_and_poor_is_clearly_worse():
    # measured over 100 seeds: expert 100%, poor 10% (benchmarks/results/foreign_experts.md)
    assert _reacher_final_successes("expert", range(20)) >= 18
    assert _reacher_final_successes("poor", range(20)) <= 8


def test_pusher_expert_moves_the_object_toward_the_goal():
    env = make_pusher_env()
    expert = make_pusher_expert(env, "expert")
    obs, _ = env.reset(seed=4)
    expert.reset(4)
    dist = lambda s: float(np.linalg.norm(s[17:19] - s[20:22]))  # noqa: E731
    start = dist(obs[STATE_KEY])
    for _ in range(100):
        action = expert.act(obs, env)
        assert action.shape == (7,) and np.all(np.abs(action) <= 2.0)
        obs, *_ = env.step(action)
    assert expert.phase == "push"
    assert dist(obs[STATE_KEY]) < start - 0.08  # measured: 0.198 m -> ~0.09 m


def test_unknown_quality_is_rejected():
    with pytest.raises(ValueError, match="quality: expected one of"):
        make_reacher_expert(make_reacher_env(), "great")


def test_check_compatible_lists_every_reacher_vs_pusher_mismatch():
    reacher, pusher = make_reacher_env().env_spec, make_pusher_env().env_spec
    policy = PolicySpec(
        observation_features=reacher.observation_features,
        action=reacher.action,
        control_frequency=reacher.control_frequency,
    )
    check_compatible(policy, reacher)
    with pytest.raises(IncompatibleSpecError) as err:
        check_compatible(policy, pusher)
    problems = err.value.problems
    assert "observation.state: expected shape (10,) (policy), received (23,) (env)" in problems
    assert "action dimension: expected 2 (policy), received 7 (env)" in problems
    assert "control_frequency: expected 50.0 Hz (policy), received 20.0 Hz (env)" in problems
    assert len(problems) == 3
