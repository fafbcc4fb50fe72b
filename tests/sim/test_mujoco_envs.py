"""MuJoCo tasks through the EnvAdapter contract: spec, observations, seeded and unseeded resets, leak-free
resets, perturbations and vector envs."""

from __future__ import annotations

import mujoco
import numpy as np
import pytest

from policylink.adapters import registry
from policylink.adapters.schema import STATE_KEY, TASK_KEY, ActionError
from policylink.adapters.validation import validate_observation
from policylink.runtime.rollout import RegistryEnvFn, make_vector_env
from policylink.sim.mujoco.perturbations import PerturbationConfig

TASKS = ("reach", "push", "pick_place", "insert", "multitask")


def _rollout(env, steps: int, seed: int = 0):
    obs, _ = env.reset(seed=seed)
    rng = np.random.default_rng(seed)
    states = [obs[STATE_KEY]]
    for _ in range(steps):
        obs, *_ = env.step(rng.uniform(env.action_space.low, env.action_space.high).astype(np.float32))
        states.append(obs[STATE_KEY])
    return np.stack(states)


@pytest.mark.parametrize("name", TASKS)
def test_spec_and_observation_match(name):
    env = registry.make_env(name, obs_mode="state+image", image_size=32)
    obs, info = env.reset(seed=3)
    spec = env.env_spec
    assert spec.name == name and spec.control_frequency == 10.0 and spec.max_episode_steps >= 50
    validate_observation(spec, obs)
    assert env.observation_space.contains(obs)
    assert obs[TASK_KEY] in spec.tasks
    assert info.pop("progress", 0.0) == 0.0  # tasks with a goal distance: progress 1 - d_t / d_0 is 0 at reset
    assert info == {"is_success": False}
    assert env.n_substeps * env.model.opt.timestep == pytest.approx(0.1)
    obs, reward, terminated, truncated, info = env.step(np.zeros(spec.action.dim, np.float32))
    validate_observation(spec, obs)
    assert isinstance(info["is_success"], bool) and reward == float(info["is_success"])
    with pytest.raises(ActionError, match="shape"):
        env.step(np.zeros(spec.action.dim + 1, np.float32))


@pytest.mark.parametrize("name", TASKS)
def test_seeded_reset_replays_and_unseeded_reset_is_new(name):
    env = registry.make_env(name)
    a = _rollout(env, 5, seed=11)
    b = _rollout(env, 5, seed=11)
    np.testing.assert_array_equal(a, b)
    first, _ = env.reset(seed=11)
    second, _ = env.reset()
    assert not np.allclose(first[STATE_KEY], second[STATE_KEY])


@pytest.mark.parametrize("name", TASKS)
def test_reset_leaks_nothing_from_previous_episode(name):
    """A fresh env and a used env give the identical episode from the same seed (controller, contacts...)."""
    fresh = registry.make_env(name)
    used = registry.make_env(name)
    _rollout(used, 30, seed=5)  # leaves velocities, contacts, controller targets behind
    used.data.xfrc_applied[:] = 1.0
    expected = _rollout(fresh, 8, seed=42)
    got = _rollout(used, 8, seed=42)
    np.testing.assert_array_equal(expected, got)
    assert used.elapsed_steps == 8
    np.testing.assert_array_equal(used.data.ctrl, fresh.data.ctrl)


@pytest.mark.parametrize("name", TASKS)
def test_derived_quantities_valid_before_first_step(name):
    env = registry.make_env(name)
    env.reset(seed=7)
    xpos = env.data.xpos.copy()
    site = env.data.site_xpos.copy()
    mujoco.mj_forward(env.model, env.data)
    np.testing.assert_allclose(xpos, env.data.xpos)
    np.testing.assert_allclose(site, env.data.site_xpos)
    state = env._state()
    np.testing.assert_allclose(state[:2], env.data.site("ee").xpos[:2], atol=1e-6)


def test_first_frame_is_rendered_from_reset_state():
    env = registry.make_env("push", obs_mode="image", image_size=48, randomization=None)
    frame_a, _ = env.reset(seed=1)
    frame_b, _ = env.reset(seed=2)  # different block pose -> different first frame
    key = "observation.images.top"
    assert frame_a[key].shape == (48, 48, 3) and frame_a[key].dtype == np.uint8
    assert np.abs(frame_a[key].astype(int) - frame_b[key].astype(int)).sum() > 0


def test_invalid_arguments_name_the_field():
    with pytest.raises(ValueError, match="obs_mode"):
        registry.make_env("reach", obs_mode="pixels")
    with pytest.raises(KeyError, match="cameras"):
        registry.make_env("reach", obs_mode="image", cameras=("wrist_cam",))
    with pytest.raises(ValueError, match="render_quality"):
        registry.make_env("reach", obs_mode="image", render_quality="ultra")
    with pytest.raises(ValueError, match="action_delay_steps"):
        PerturbationConfig(action_delay_steps=-1)
    # through make_env a mapping's keys and types are checked against the env's config first (tests/sim/
    # test_env_config.py); PerturbationConfig itself checks values, and keys and types when built directly
    with pytest.raises(ValueError, match=r"^'push' env kwarg perturbation: expected one of .*received 'push'"):
        registry.make_env("push", perturbation={"push": 0.03})
    with pytest.raises(ValueError, match=r"perturbation: unknown key\(s\) \['push'\]: expected keys among .*'force'"):
        PerturbationConfig.coerce({"push": 0.03})
    bad = [
        ({"force": "strong"}, "force: expected a finite number, received 'strong'"),
        ({"displacement": float("inf")}, "displacement: expected a finite number, received inf"),
        ({"displacement": True}, "displacement: expected a finite number, received True"),
        ({"action_delay_steps": 1.5}, "action_delay_steps: expected an integer, received 1.5"),
        (
            {"displacement_steps": [10.5, 20]},
            r"displacement_steps: expected \(first, last\) integers, received \[10.5, 20\]",
        ),
    ]
    for value, message in bad:
        with pytest.raises(ValueError, match=f"^PerturbationConfig.{message}$"):
            PerturbationConfig.coerce(value)
    # through make_env the value checks name the env and the kwarg's field path, not the class
    with pytest.raises(registry.EnvKwargsError) as e:
        registry.make_env("push", perturbation={"displacement": float("inf")})  # a float: the value check's
    assert str(e.value) == "'push' env kwarg perturbation.displacement: expected a finite number, received inf"
    with pytest.raises(registry.EnvKwargsError) as e:
        registry.make_env("push", perturbation={"displacement": -0.1})
    assert str(e.value) == "'push' env kwarg perturbation.displacement: expected a distance >= 0 m, received -0.1"
    with pytest.raises(ValueError, match="perturbation: expected None or a mapping"):
        PerturbationConfig.coerce(0.03)


def test_action_delay_holds_robot_for_the_delay():
    env = registry.make_env("reach", perturbation=PerturbationConfig(action_delay_steps=2))
    obs, _ = env.reset(seed=0)
    start = obs[STATE_KEY][:3].copy()
    push = np.array([0.02, 0.0, 0.0], np.float32)
    for _ in range(2):
        obs, *_ = env.step(push)
    np.testing.assert_allclose(obs[STATE_KEY][:3], start, atol=2e-3)  # delayed: still (about) at the start
    obs, *_ = env.step(push)
    assert obs[STATE_KEY][0] - start[0] > 0.01


@pytest.mark.parametrize(
    "cfg",
    [
        PerturbationConfig(displacement=0.05, displacement_steps=(3, 3)),
        {"displacement": 0.05, "displacement_steps": [3, 3]},
    ],
    ids=["config", "mapping"],  # a mapping is what --env_kwargs '{perturbation: {...}}' gives
)
def test_displacement_moves_object_once_by_configured_distance(cfg):
    env = registry.make_env("push", perturbation=cfg)
    obs, _ = env.reset(seed=0)
    block = [obs[STATE_KEY][2:4]]
    for _ in range(5):
        obs, *_ = env.step(np.zeros(2, np.float32))  # pusher does not move; block only moves if displaced
        block.append(obs[STATE_KEY][2:4])
    jumps = np.linalg.norm(np.diff(np.stack(block), axis=0), axis=1)
    assert jumps[3] == pytest.approx(0.05, abs=0.003)
    assert np.all(np.delete(jumps, 3) < 1e-3)


def test_force_pulses_move_a_resting_block():
    cfg = PerturbationConfig(force=3.0, force_probability=1.0, force_duration_steps=1)
    env = registry.make_env("push", perturbation=cfg)
    obs, _ = env.reset(seed=0)
    start = obs[STATE_KEY][2:4].copy()
    for _ in range(3):
        obs, *_ = env.step(np.zeros(2, np.float32))
    assert np.linalg.norm(obs[STATE_KEY][2:4] - start) > 0.01


@pytest.mark.parametrize("asynchronous", [False, True])
def test_vector_partial_reset_leaves_other_envs_untouched(asynchronous):
    venv = make_vector_env(RegistryEnvFn("reach"), 2, asynchronous=asynchronous)
    try:
        venv.reset(seed=[1, 2])
        obs, *_ = venv.step(np.full((2, 3), 0.01, np.float32))
        before = obs[STATE_KEY].copy()
        obs, _ = venv.reset(seed=[7, 8], options={"reset_mask": np.array([True, False])})
        np.testing.assert_array_equal(obs[STATE_KEY][1], before[1])
        assert not np.allclose(obs[STATE_KEY][0], before[0])
        assert list(obs[TASK_KEY]) == [registry.env_factory("reach")().task] * 2
    finally:
        venv.close()


def test_multitask_instruction_selects_the_goal():
    env = registry.make_env("multitask")
    assert len(env.env_spec.tasks) == 18 and len(set(env.env_spec.tasks)) == 18
    obs, _ = env.reset(seed=0, options={"task": "place the blue cube onto the left target"})
    assert obs[TASK_KEY] == "place the blue cube onto the left target"
    assert env.goal == ("blue", "left")
    np.testing.assert_allclose(env.object_position, obs[STATE_KEY][10:13], atol=1e-6)  # blue cube xyz
    assert env.goal_position[0] < 0  # left pad
    drawn = {env.reset(seed=s)[0][TASK_KEY] for s in range(40)}
    assert len(drawn) > 10 and drawn <= set(env.env_spec.tasks)
    with pytest.raises(ValueError, match="options\\['task'\\]"):
        env.reset(options={"task": "juggle the cubes"})


def test_gripper_action_spec_is_physical():
    spec = registry.make_env("pick_place").env_spec.action
    assert spec.control_mode.value == "ee_delta" and spec.units == ("m", "m", "m", "1")
    assert spec.gripper_index == 3 and spec.low[3] == 0.0 and spec.high[3] == 1.0


def test_async_image_envs_render_after_the_parent_rendered():
    """A GL context in the parent must not hang the workers; sub-env 0 seeded 0 renders the same first frame."""
    key = "observation.images.top"
    local = registry.make_env("push", obs_mode="image", image_size=32)
    expected = local.reset(seed=0)[0][key]
    venv = make_vector_env(RegistryEnvFn("push", obs_mode="image", image_size=32), 2, asynchronous=True)
    try:
        obs, _ = venv.reset(seed=[0, 5])
        np.testing.assert_array_equal(obs[key][0], expected)
        assert not np.array_equal(obs[key][1], expected)
    finally:
        venv.close()


def test_step_contract_is_the_same_locally_and_remotely():
    from policylink.adapters.transport import EnvServer, RemoteEnv

    local, served = registry.make_env("reach"), registry.make_env("reach")
    srv = EnvServer(served, "tcp://127.0.0.1:0").start()
    remote = RemoteEnv(srv.endpoint, timeout_s=10)
    try:
        for env in (local, remote):
            with pytest.raises(RuntimeError, match=r"^step\(\) before reset\(\): call reset\(\) first$"):
                env.step([0.0, 0.0, 0.0])
            env.reset(seed=4)
            with pytest.raises(ActionError, match=r"action: expected an array-like of 3 floats .* received None"):
                env.step(None)
            with pytest.raises(ActionError, match=r"action: expected shape \(3,\) .* received shape \(2,\)"):
                env.step([0.0, 0.0])
            with pytest.raises(ActionError, match=r"action\[2\] \(dz\): expected a finite value, received inf"):
                env.step([0.0, 0.0, np.inf])
        low, high = local.env_spec.action.low_array, local.env_spec.action.high_array
        steps = [[0.01, -0.02, 0.0], np.array([1.0, -1.0, 0.5]), 10 * high]  # float64 list, float64, far outside
        for action in steps:
            a, b = local.step(action)[0][STATE_KEY], remote.step(action)[0][STATE_KEY]
            np.testing.assert_array_equal(a, b)
        clipped = registry.make_env("reach")
        clipped.reset(seed=4)
        for action in steps[:-1] + [high]:  # the same episode with the last action at the limit
            expected = clipped.step(np.clip(np.asarray(action, np.float32), low, high))[0][STATE_KEY]
        np.testing.assert_array_equal(a, expected)
    finally:
        remote.close()
        srv.stop()


@pytest.mark.parametrize(("name", "proprio"), [("push", ("pusher_x", "pusher_y")), ("pick_place", None)])
def test_image_proprio_mode_shows_only_the_robot_state(name, proprio):
    full = registry.make_env(name, obs_mode="state")
    env = registry.make_env(name, obs_mode="image+proprio", image_size=32)
    names = proprio or ("ee_x", "ee_y", "ee_z", "gripper_opening")
    feature = env.env_spec.observation_features[STATE_KEY]
    assert feature.names == names and feature.shape == (len(names),)
    assert feature.unit == ("m" if name == "push" else "m (positions); 1 (gripper_opening)")
    obs, _ = env.reset(seed=7)
    full_obs, _ = full.reset(seed=7)
    validate_observation(env.env_spec, obs)
    assert obs["observation.images.top" if name == "push" else "observation.images.front"].shape == (32, 32, 3)
    np.testing.assert_array_equal(obs[STATE_KEY], full_obs[STATE_KEY][: len(names)])
    np.testing.assert_array_equal(env.privileged_state(), full_obs[STATE_KEY])  # what scripted experts read


def test_insert_progress_reaches_one_when_the_expert_inserts():
    """``insert`` exposes progress 1 - d_t / d_0: 0 at reset, close to 1 once the expert has inserted the peg."""
    from policylink.sim.experts import make_expert

    env = registry.make_env("insert")
    obs, info = env.reset(seed=3)
    assert info["progress"] == 0.0
    s = np.asarray(obs[STATE_KEY])[None]
    goal = env.goal_position
    expected = np.linalg.norm(s[0, 0:3] - s[0, 4:7]) + np.linalg.norm(s[0, 4:7] - goal)
    assert env.goal_distance(s)[0] == pytest.approx(expected, abs=1e-6)
    expert = make_expert(env, quality="expert")
    expert.reset(3)
    for _ in range(env.env_spec.max_episode_steps):
        obs, _, terminated, truncated, info = env.step(expert.act(obs, env))
        if terminated or truncated:
            break
    assert info["is_success"] and info["progress"] > 0.8
