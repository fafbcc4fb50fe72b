"""The ``memory`` task: gymnasium's env checker, the cue only in the first second, the waypoint dwell, the wrong
goal failing, the scripted expert, and record -> train (SEGA) -> eval through the library entry points."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from policylink.adapters.registry import make_env
from policylink.sim.experts import make_expert
from policylink.sim.mujoco.memory import CUE_RGBA, CUE_STEPS, DWELL_STEPS, IDLE_RGBA, WAYPOINT

STATE = "observation.state"


def _run(env, expert, seed, goal=None, max_steps=200):
    obs, info = env.reset(seed=seed, options=None if goal is None else {"goal": goal})
    expert.reset(seed)
    states = [obs[STATE]]
    for _ in range(max_steps):
        obs, reward, terminated, truncated, info = env.step(expert.act(obs, env))
        states.append(obs[STATE])
        if terminated or truncated:
            break
    return np.stack(states), info, terminated


def test_env_checker_passes():
    env = make_env("memory")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the unbounded Box warnings of every state task
        check_env(env.unwrapped, skip_render_check=True)


def test_expert_succeeds_and_the_cue_is_shown_only_in_the_first_second():
    env = make_env("memory")
    expert = make_expert(env)
    for seed in range(4):
        states, info, terminated = _run(env, expert, seed)
        cue = 1.0 if env.unwrapped.goal_index == 0 else -1.0
        assert info["is_success"] and terminated and not info["wrong_goal"]
        assert states[:CUE_STEPS, 3].tolist() == [cue] * CUE_STEPS and not states[CUE_STEPS:, 3].any()
        first_visit = int(np.argmax(states[:, 4] == 1.0))  # the decision comes long after the cue is gone
        assert first_visit >= CUE_STEPS + DWELL_STEPS and (states[first_visit:, 4] == 1.0).all()
        assert np.linalg.norm(states[first_visit - 1, :3] - WAYPOINT) < 0.03
        # the dwell progress rises by 1 / DWELL_STEPS per step spent at the waypoint
        dwell = states[: first_visit + 1, 4]
        assert np.all(np.diff(dwell) >= 0) and np.isin(np.round(dwell * DWELL_STEPS, 4), np.arange(16)).all()
        assert (dwell > 0).sum() == DWELL_STEPS


def test_the_lit_goal_is_the_correct_one_and_goes_grey():
    env = make_env("memory").unwrapped
    env.reset(seed=0, options={"goal": 1})
    rgba = env.model.geom_rgba
    left, right = (env.model.geom(n).id for n in ("goal_left", "goal_right"))
    assert np.array_equal(rgba[right], CUE_RGBA) and np.array_equal(rgba[left], IDLE_RGBA)
    for _ in range(CUE_STEPS):
        env.step(np.zeros(3, np.float32))
    assert np.array_equal(rgba[right], IDLE_RGBA) and np.array_equal(rgba[left], IDLE_RGBA)
    with pytest.raises(ValueError, match="options\\['goal'\\]"):
        env.reset(seed=0, options={"goal": 2})


def test_the_wrong_goal_after_the_waypoint_fails_the_episode():
    env = make_env("memory")
    expert = make_expert(env)

    class Swapped:  # the expert aiming at the other goal
        def act(self, obs, env):
            task = env.unwrapped
            task.goal_index = 1 - task.goal_index
            try:
                return expert.act(obs, env)
            finally:
                task.goal_index = 1 - task.goal_index

        def reset(self, seed=None):
            pass

    states, info, terminated = _run(env, Swapped(), seed=0, goal=0)
    assert terminated and info["wrong_goal"] and not info["is_success"] and len(states) < 80


def test_record_train_sega_and_eval(tmp_path, served):
    from policylink.policies.checkpoint import load_components
    from policylink.policies.policy import policy_for_model
    from policylink.policies.registry import make_config
    from policylink.runtime.record import RecordConfig, record
    from policylink.train.imitation import DatasetConfig, TrainConfig, evaluate_success, train

    store = tmp_path / "memory.zarr"
    summary = record(RecordConfig(env="memory", episodes=2, out=str(store), seed=0), progress=False)
    assert summary.success_rate == 1.0
    sega = {"tokens": 2, "width": 8, "layers": 1, "heads": 2, "train_windows": 6}
    policy = make_config("flow", memory="sega", sega=sega, n_action_steps=8, unet={"down_dims": [8, 16]})
    cfg = TrainConfig(
        policy=policy,
        dataset=DatasetConfig(path=str(store), env="memory", val_fraction=0.0),
        output_dir=str(tmp_path / "run"),
        steps=2,
        batch_size=4,
        val_every=0,
        progress=False,
        torch_threads=1,
    )
    ckpt = train(cfg)
    loaded_cfg, spec, model, processors = load_components(ckpt)
    assert loaded_cfg.memory == "sega" and loaded_cfg.sega.train_windows == 6
    rate = evaluate_success(policy_for_model(model, processors, spec), cfg.dataset, episodes=2, seed=100_000)
    assert rate in (0.0, 0.5, 1.0)

    # served over ZMQ: the server's per-row memory follows the same steps and resets as a local policy's
    from policylink.policies import load_policy

    local, remote = load_policy(ckpt, device="cpu", seed=3), served(load_policy(ckpt, device="cpu", seed=3))
    rng = np.random.default_rng(0)
    for step in range(4):
        obs = {"observation.state": rng.normal(size=(2, 5)).astype(np.float32), "task": ["go", "go"]}
        if step == 2:
            local.reset([1])
            remote.reset([1])
        local.update_observation(obs)
        remote.update_observation(obs)
        np.testing.assert_array_equal(remote.predict_action_chunk(), local.predict_action_chunk())
