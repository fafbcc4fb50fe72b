"""genesis-world backend: the MuJoCo tasks' EnvSpec, episodes and experts on Genesis CPU physics.

One Genesis scene is built per test module (its first build compiles kernels: ~130 s on a 2-core CPU with an
empty ``~/.cache/quadrants``, 5-30 s warm); both envs share it, used one after the other.
"""

from __future__ import annotations

import dataclasses
from importlib.util import find_spec

import numpy as np
import pytest

from policylink.adapters import registry
from policylink.adapters.schema import IMAGE_PREFIX, STATE_KEY, TASK_KEY, ActionError
from policylink.adapters.validation import validate_observation
from policylink.sim.experts import make_expert
from policylink.sim.mujoco.perturbations import PerturbationConfig

pytestmark = [
    pytest.mark.genesis,
    pytest.mark.slow,
    pytest.mark.skipif(
        find_spec("genesis") is None, reason="genesis-world is not installed (pip install -e '.[genesis]')"
    ),
]
PAIRS = (("genesis_reach", "reach"), ("genesis_pick_place", "pick_place"))


@pytest.fixture(scope="module")
def scene():
    from policylink.sim.genesis.scene import GantryScene

    return GantryScene()


@pytest.fixture(scope="module")
def envs(scene):
    return {name: registry.make_env(name, scene=scene) for name, _ in PAIRS}


def _run_expert(env, seed: int) -> tuple[bool, int]:
    expert = make_expert(env, seed=seed)
    obs, _ = env.reset(seed=seed)
    expert.reset(seed)
    for t in range(env.env_spec.max_episode_steps):
        obs, _, terminated, truncated, info = env.step(expert.act(obs, env))
        if terminated or truncated:
            return bool(info["is_success"]), t + 1
    return False, env.env_spec.max_episode_steps


@pytest.mark.parametrize(("name", "mujoco_name"), PAIRS)
def test_env_spec_is_the_mujoco_spec(envs, name, mujoco_name):
    spec = envs[name].env_spec
    assert spec.name == name
    assert dataclasses.replace(spec, name=mujoco_name) == registry.make_env(mujoco_name).env_spec


@pytest.mark.parametrize(("name", "mujoco_name"), PAIRS)
def test_seed_gives_the_mujoco_episode(envs, name, mujoco_name):
    """Episodes are sampled by the MuJoCo task, so a seed starts the same episode on both backends."""
    obs, info = envs[name].reset(seed=11)
    ref, ref_info = registry.make_env(mujoco_name).reset(seed=11)
    np.testing.assert_array_equal(obs[STATE_KEY], ref[STATE_KEY])
    assert obs[TASK_KEY] == ref[TASK_KEY] and info == ref_info == {"is_success": False, "progress": 0.0}


@pytest.mark.parametrize("name", [n for n, _ in PAIRS])
def test_reset_and_step_shapes(envs, name):
    env = envs[name]
    spec = env.env_spec
    obs, _ = env.reset(seed=0)
    validate_observation(spec, obs)
    assert env.observation_space.contains(obs)
    out = env.step(np.zeros(spec.action.dim, np.float32))
    assert len(out) == 5
    obs, reward, terminated, truncated, info = out
    validate_observation(spec, obs)
    assert obs[STATE_KEY].shape == (len(spec.observation_features[STATE_KEY].names),)
    assert obs[STATE_KEY].dtype == np.float32
    assert isinstance(info["is_success"], bool) and reward in (0.0, 1.0)
    assert terminated is False and truncated is False
    with pytest.raises(ActionError, match=rf"action: expected shape \({spec.action.dim},\) .*received shape"):
        env.step(np.zeros(spec.action.dim + 1, np.float32))
    with pytest.raises(ActionError, match=r"action\[0\] \(dx\): expected a finite value, received nan"):
        env.step(np.full(spec.action.dim, np.nan, np.float32))


def test_seeded_rollouts_are_reproducible(envs):
    env = envs["genesis_pick_place"]
    actions = np.random.default_rng(0).uniform(env.action_space.low, env.action_space.high, (8, 4)).astype(np.float32)

    def rollout(seed):
        states = [env.reset(seed=seed)[0][STATE_KEY]]
        states += [env.step(a)[0][STATE_KEY] for a in actions]
        return np.stack(states)

    first, second, other = rollout(5), rollout(5), rollout(6)
    np.testing.assert_array_equal(first, second)
    assert not np.allclose(first[0], other[0])


def test_free_space_motion_matches_mujoco(envs):
    """The gantry's position servo (kp 1500 N/m, kv 80 N s/m, 40 N limit) tracks alike on both engines."""
    env, ref = envs["genesis_reach"], registry.make_env("reach")
    env.reset(seed=2)
    ref.reset(seed=2)
    step = np.array([0.03, -0.03, -0.03], np.float32)
    g0, m0 = env.robot.ee_position.copy(), ref.robot.ee_position.copy()
    for _ in range(3):
        env.step(step)
        ref.step(step)
    g_moved, m_moved = env.robot.ee_position - g0, ref.robot.ee_position - m0
    # each step re-targets 3 cm past the *measured* ee; the overdamped servo lags, so 3 steps cover 3-9 cm
    assert np.all((np.abs(m_moved) > 0.03) & (np.abs(m_moved) < 0.09)), m_moved
    assert np.all(np.sign(m_moved) == np.sign(step))
    np.testing.assert_allclose(g_moved, m_moved, atol=5e-4)  # measured here: within 2 micrometres


def test_cube_rests_on_the_table_and_the_gripper_closes(envs):
    env = envs["genesis_pick_place"]
    env.reset(seed=4)
    cube0 = env.object_position.copy()
    assert env.robot.opening == pytest.approx(1.0)
    for _ in range(5):
        obs, *_ = env.step(np.array([0.0, 0.0, 0.0, 1.0], np.float32))
    np.testing.assert_allclose(env.object_position, cube0, atol=1e-3)  # untouched cube stays put at z = 2 cm
    assert cube0[2] == pytest.approx(0.02)
    assert obs[STATE_KEY][3] < 0.05  # gripper opening: 1 open -> ~0 closed on nothing


def test_image_observations_render_the_genesis_state(scene):
    env = registry.make_env("genesis_reach", scene=scene, obs_mode="state+image", image_size=32)
    ref = registry.make_env("reach", obs_mode="state+image", image_size=32)
    key = IMAGE_PREFIX + "front"
    obs, _ = env.reset(seed=1)
    ref_obs, _ = ref.reset(seed=1)
    assert obs[key].shape == (32, 32, 3) and obs[key].dtype == np.uint8
    np.testing.assert_array_equal(obs[key], ref_obs[key])  # same episode, same renderer, same pixels
    moved, *_ = env.step(np.array([0.03, 0.03, 0.03], np.float32))
    assert np.abs(moved[key].astype(int) - obs[key].astype(int)).sum() > 0
    env.close()
    ref.close()


def test_active_perturbation_is_refused(scene):
    with pytest.raises(ValueError, match="perturbation: expected None"):
        registry.make_env("genesis_reach", scene=scene, perturbation=PerturbationConfig(force=1.0))


@pytest.mark.parametrize(("name", "min_successes"), [("genesis_reach", 4), ("genesis_pick_place", 3)])
def test_scripted_expert_succeeds(envs, name, min_successes):
    results = [_run_expert(envs[name], seed) for seed in range(4)]
    successes = sum(ok for ok, _ in results)
    assert min_successes <= successes <= 4, results
