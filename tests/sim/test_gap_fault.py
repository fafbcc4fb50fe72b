"""Diverged physics under a reality gap (issue 34 item 2): the one check (``sim/mujoco/gap_runtime.physics_fault``)
ends a gapped task's episode as a failure carrying ``info["fault"]``, the rollout loop keeps the reason in the
episode's result, and ``record`` leaves such an episode out of the store (counted, its seed printed). Seeds 5 and 12
of the scripted expert on ``worn_gantry``: 5 blows up at step 27 (the cube spins at 643 rad/s and is flung to
~100 m), 12 drops the cube at its last step (a sound tumble at 22.7 rad/s) and succeeds."""

import types

import numpy as np

from policylink.adapters.registry import make_env
from policylink.adapters.schema import FAULT_INFO, STATE_KEY
from policylink.runtime.record import RecordConfig, _expert_observation, record
from policylink.sim.experts import make_expert
from policylink.sim.mujoco.gap_runtime import MAX_ANGULAR_SPEED, MAX_SPEED, physics_fault


def _fake(qpos, qvel):
    return types.SimpleNamespace(unwrapped=types.SimpleNamespace(data=types.SimpleNamespace(qpos=qpos, qvel=qvel)))


def test_physics_fault_flags_nonfinite_and_implausible_speeds_only():
    assert physics_fault(_fake(np.zeros(3), np.array([0.0, -0.3, 9.9]))) is None
    msg = physics_fault(_fake(np.zeros(3), np.array([0.0, -37.5, 1.0])))  # no model: every dof held to 10 m/s
    assert msg is not None and "joint velocity 1 is -37.5" in msg and str(MAX_SPEED) in msg
    assert "non-finite" in physics_fault(_fake(np.array([0.0, np.nan]), np.zeros(2)))
    assert physics_fault(_fake(np.zeros(2), np.array([5.0, 0.0])), max_speed=4.0) is not None
    assert physics_fault(types.SimpleNamespace()) is None  # not a MuJoCo env: never judged


def test_rotations_and_translations_have_their_own_limits():
    env = make_env("pick_place")
    env.reset(seed=0)
    base = env.unwrapped
    qvel = base.data.qvel
    assert qvel.shape == (11,)  # gantry x, y, z, two fingers, the cube's free joint (3 translations, 3 rotations)
    qvel[9] = 22.7  # the sound tumble of seed 12
    assert base.physics_fault() is None
    qvel[9] = -78.7
    msg = base.physics_fault()
    assert "joint velocity 9 is -78.7" in msg and f"angular {MAX_ANGULAR_SPEED}" in msg
    qvel[9], qvel[6] = 0.0, 10.5  # the cube's y translation
    assert f"joint velocity 6 is 10.5, above the plausible linear {MAX_SPEED}" in base.physics_fault()
    qvel[6], qvel[0] = 0.0, -11.0  # a gantry slide
    assert "joint velocity 0 is -11.0" in base.physics_fault()
    env.close()


def _expert_episode(seed):
    env = make_env("pick_place", gap="worn_gantry")
    expert = make_expert(env, quality="expert", seed=seed)
    obs, _ = env.reset(seed=seed)
    expert.reset(seed)
    cubes, out = [obs[STATE_KEY][4:7]], None
    for _ in range(env.env_spec.max_episode_steps):
        out = env.step(expert.act(_expert_observation(env, obs), env))
        obs = out[0]
        if out[2] or out[3]:
            break
        cubes.append(obs[STATE_KEY][4:7])
    env.close()
    return len(cubes), np.abs(np.array(cubes)).max(), out


def test_a_diverged_gapped_episode_ends_as_a_failure_with_its_fault():
    n, cube_max, (_, reward, terminated, truncated, info) = _expert_episode(5)
    assert n == 27 and terminated is True and truncated is False and reward == 0.0
    assert info["is_success"] is False
    assert "joint velocity 9 is -643.1, above the plausible angular 50.0" in info[FAULT_INFO]
    assert cube_max < 0.2  # every observation before the fault is sane (the cube within the 0.2 m workspace)


def test_a_sound_tumble_is_not_a_fault():
    n, _, (_, reward, terminated, _, info) = _expert_episode(12)
    assert n == 61 and terminated is True and reward == 1.0 and info["is_success"] is True
    assert FAULT_INFO not in info


def test_the_nominal_env_does_not_judge_its_steps():  # the check costs the fast state path nothing
    env = make_env("pick_place")
    env.reset(seed=0)
    env.unwrapped.data.qvel[5] = 500.0
    _, _, terminated, _, info = env.step(np.zeros(4, np.float32))
    assert FAULT_INFO not in info and terminated is False
    assert env.unwrapped.physics_fault() is not None  # the robot calls the check itself
    env.close()


def test_record_leaves_a_diverged_demo_out_and_says_so(tmp_path, capsys):
    from policylink.data.buffer import EpisodeStore

    out = str(tmp_path / "worn.zarr")
    cfg = RecordConfig(env="pick_place", episodes=2, out=out, seed=5, gap="worn_gantry")
    summary = record(cfg, progress=False)
    assert (summary.episodes, summary.faulted, summary.successes) == (1, 1, 1)
    assert "1 left out (physics diverged)" in str(summary)
    err = capsys.readouterr().err
    assert "left 1 episode(s) out" in err and "seeds [5]" in err and "joint velocity" in err
    store = EpisodeStore(out, "r")
    assert [m.seed for m in store.all_meta()] == [6]
    assert store.n_episodes == 1 and np.abs(store.get_episode(0)[STATE_KEY][:, 4:7]).max() < 0.2


def test_an_eval_episode_result_carries_the_fault():
    from policylink.runtime.record import ScriptedSource
    from policylink.runtime.rollout import rollout
    from policylink.runtime.vector_env import RegistryEnvFn, make_vector_env

    env_fn = RegistryEnvFn("pick_place", gap="worn_gantry")
    probe = env_fn()
    expert = make_expert(probe, quality="expert", seed=5)
    plans = [[(0, 5), (1, 12)]]
    vec = make_vector_env(env_fn, plans)
    inner = vec.envs[0]
    source = ScriptedSource([lambda obs: expert.act(_expert_observation(inner, dict(obs)), inner)], [expert.reset])
    try:
        results = rollout(vec, source, 2, subscribers=[source])
    finally:
        vec.close()
        probe.close()
    assert [r.success for r in results] == [False, True] and [r.n_steps for r in results] == [27, 61]
    assert "joint velocity" in results[0].fault and results[1].fault == ""
    assert results[0].to_dict()["fault"] == results[0].fault
