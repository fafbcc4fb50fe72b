"""Isolated env families: the venv-side MetaWorld adapter through the env server (in-process, with a fake MetaWorld
env), the env process lifecycle (a server under this interpreter), crashes and hangs as errors, the registry's
``<family>/<task>`` names, and the real MetaWorld venv when it is installed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from policylink.adapters import registry
from policylink.adapters.env_transport import EnvServer, RemoteEnv
from policylink.adapters.schema import IMAGE_PREFIX, STATE_KEY, TASK_KEY
from policylink.sim.experts import make_expert
from policylink.sim.isolated import metaworld, metaworld_env
from policylink.sim.isolated.families import IsolatedFamily
from policylink.sim.isolated.process import EnvProcessError, start_isolated_env
from policylink.sim.isolated.venvs import EnvNotInstalledError, family_python, installed, record_install

HERE = Path(__file__).parent
FAKE = "fake_metaworld:make_fake_metaworld_env"


@pytest.fixture
def fakes(monkeypatch):
    """The fake MetaWorld module, importable here and (through PYTHONPATH) in env server subprocesses."""
    monkeypatch.syspath_prepend(str(HERE))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]))
    import fake_metaworld

    return fake_metaworld


def _stop(pid: int) -> None:
    """SIGSTOP ``pid`` and wait until the kernel reports it stopped (``T`` in /proc/PID/stat): the signal takes
    effect asynchronously, and a process still finishing its last reply on a loaded machine would answer the next
    request before it stops."""
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + 10.0
    while open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] != "T":
        assert time.monotonic() < deadline, f"pid {pid} not stopped 10 s after SIGSTOP"
        time.sleep(0.005)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_images_are_the_cameras_frames(fakes):
    env = fakes.make_fake_metaworld_env("reach", obs_mode="state+image", image_size=24)
    try:
        obs, _ = env.reset(seed=7)
        img = obs[IMAGE_PREFIX + "corner2"]
        assert img.dtype == np.uint8 and img.shape == (24, 24, 3) and img.std() > 0  # a rendered scene
        np.testing.assert_array_equal(env.render(), img)
        assert set(env.env_spec.observation_features) == {STATE_KEY, IMAGE_PREFIX + "corner2", TASK_KEY}
    finally:
        env.close()  # on the thread that rendered (a GL context belongs to its thread)


def test_image_proprio_state_is_the_hand_and_gripper(fakes):
    full = fakes.make_fake_metaworld_env("reach", obs_mode="state")
    env = fakes.make_fake_metaworld_env("reach", obs_mode="image+proprio", image_size=16)
    try:
        state, _ = full.reset(seed=3)
        obs, _ = env.reset(seed=3)
        np.testing.assert_array_equal(obs[STATE_KEY], state[STATE_KEY][:4])
        feature = env.env_spec.observation_features[STATE_KEY]
        assert feature.shape == (4,) and feature.names == ("hand_x", "hand_y", "hand_z", "gripper_opening")
        assert feature.unit == "m,m,m,1" and obs[IMAGE_PREFIX + "corner2"].shape == (16, 16, 3)
    finally:
        env.close()
        full.close()


def test_adapter_through_the_env_server_in_process(fakes):
    adapter = fakes.make_fake_metaworld_env("reach")
    with EnvServer(adapter, "tcp://127.0.0.1:0") as server:
        env = RemoteEnv(server.endpoint)
        env.last_info = {}
        try:
            spec = env.env_spec
            assert spec.name == "metaworld/reach" and spec.tasks == ("reach a goal position",)
            assert spec.control_frequency == pytest.approx(80.0) and spec.max_episode_steps == 500
            assert spec.observation_features[STATE_KEY].shape == (39,)
            assert spec.observation_features[STATE_KEY].names[36:] == ("goal_x", "goal_y", "goal_z")
            obs, info = env.reset(seed=7, options={"expert_actions": True})  # asked for over the wire
            assert obs[STATE_KEY].dtype == np.float32 and obs[STATE_KEY].shape == (39,)
            assert obs[TASK_KEY] == "reach a goal position" and info["is_success"] is False
            goal = obs[STATE_KEY][36:]
            expected = fakes.FakeReachPolicy().get_action(obs[STATE_KEY].astype(np.float64))
            np.testing.assert_allclose(info["expert_action"], np.clip(expected, -1, 1), atol=1e-5)
            action = np.array([1.0, 0.0, 0.0, 0.0], np.float32)
            obs, _, terminated, truncated, info = env.step(action)
            np.testing.assert_allclose(obs[STATE_KEY][:3], [0.01, 0.6, 0.2], atol=1e-6)  # 1 unit = 1 cm
            np.testing.assert_allclose(obs[STATE_KEY][36:], goal)
            assert (terminated, truncated, info["is_success"]) == (False, False, False)
        finally:
            env.close()


def test_success_terminates_and_seeded_resets_reproduce(fakes, expert_episode):
    env = fakes.make_fake_metaworld_env("reach")
    env.last_info = {}
    orig_reset = env.reset

    def reset(**kw):  # the expert reads last_info, as on an IsolatedEnv
        obs, info = orig_reset(**kw)
        env.last_info = info
        return obs, info

    orig_step = env.step

    def step(a):
        out = orig_step(a)
        env.last_info = out[4]
        return out

    env.reset, env.step = reset, step
    first_a, steps_a, ok_a = expert_episode(env, seed=3, max_steps=199)
    first_b, steps_b, ok_b = expert_episode(env, seed=3, max_steps=199)
    first_c, _, _ = expert_episode(env, seed=4, max_steps=199)
    assert ok_a and ok_b and steps_a == steps_b and steps_a < 50
    np.testing.assert_array_equal(first_a, first_b)
    assert not np.allclose(first_a[36:], first_c[36:])  # another seed, another goal


def test_expert_actions_are_computed_only_once_asked_for(fakes):
    env = fakes.make_fake_metaworld_env("reach")
    calls = []
    get_action = env.expert.get_action
    env.expert.get_action = lambda obs: calls.append(1) or get_action(obs)
    env.reset(seed=0)
    env.step(np.zeros(4, np.float32))
    assert calls == []  # an evaluation's env: no expert call per step
    _, info = env.reset(seed=0, options={"expert_actions": True})
    _, _, _, _, info2 = env.step(np.zeros(4, np.float32))
    assert len(calls) == 2 and info["expert_action"].shape == info2["expert_action"].shape == (4,)
    env.reset(seed=0, options={"expert_actions": False})
    assert len(calls) == 2
    with pytest.raises(ValueError, match=r"options.expert_actions: expected a bool, received 1"):
        env.reset(options={"expert_actions": 1})
    env.expert = None
    with pytest.raises(ValueError, match=r"expected False \(this adapter has no expert\), received True"):
        env.reset(options={"expert_actions": True})


def test_adapter_rejects_bad_options(fakes):
    with pytest.raises(ValueError, match="cameras: expected a non-empty list of"):
        fakes.make_fake_metaworld_env(obs_mode="image", cameras=("nope",))
    with pytest.raises(ValueError, match=r"max_episode_steps: expected 1..500"):
        fakes.make_fake_metaworld_env(max_episode_steps=501)
    with pytest.raises(ValueError, match="obs_mode"):
        fakes.make_fake_metaworld_env(obs_mode="pointmap+proprio")


def test_isolated_env_renders_video_frames_over_the_wire(fakes):
    """``render()`` of an env process (eval's videos): the served env's frame, decoded exactly; the image
    observation of the same state is that frame (``image_size`` 24, camera corner2)."""
    kw = {"task": "reach", "obs_mode": "state+image", "image_size": 24, "render_mode": "rgb_array"}
    env = start_isolated_env(sys.executable, FAKE, kw)
    try:
        assert "rgb_array" in env.metadata["render_modes"]
        obs, _ = env.reset(seed=7)
        for _ in range(10):  # past the server's inline threshold: rendering stays on the thread that made the context
            frame = env.render()
        assert frame.dtype == np.uint8 and frame.shape == (24, 24, 3) and frame.std() > 0
        np.testing.assert_array_equal(frame, obs[IMAGE_PREFIX + "corner2"])
    finally:
        env.close()


def test_env_process_lifecycle_under_this_interpreter(fakes):
    env = start_isolated_env(sys.executable, FAKE, {"task": "push", "max_episode_steps": 50})
    pid, folder = env.process.pid, env.process.log_path.parent
    assert env.env_spec.name == "metaworld/push" and env.env_spec.max_episode_steps == 50
    obs, info = env.reset(seed=1)
    assert obs[STATE_KEY].shape == (39,) and "expert_action" not in env.last_info  # computed only when asked for
    expert = make_expert(env)  # asks for it: one reset with the option; later infos carry it
    obs, _ = env.reset(seed=1)
    assert "expert_action" in env.last_info and expert.act(obs, env).shape == (4,)
    obs, *_ = env.step(np.zeros(4, np.float32))
    assert "expert_action" in env.last_info
    assert _alive(pid) and os.getpgid(pid) == pid  # its own process group
    env.close()
    assert not _alive(pid) and not folder.exists()


def test_kwargs_the_factory_refuses_are_one_value_error(fakes):
    with pytest.raises(
        ValueError,
        match=r"^env fake_metaworld:\S+: obs_mode: .*received 'pointmap\+proprio'(; did you mean 'image\+proprio'\?)?$",
    ):
        start_isolated_env(sys.executable, FAKE, {"task": "reach", "obs_mode": "pointmap+proprio"})


def test_killed_env_process_is_an_episode_error_not_a_hang(fakes):
    env = start_isolated_env(sys.executable, FAKE, {"task": "reach"}, timeout_s=30.0)
    try:
        env.reset(seed=0)
        os.kill(env.process.pid, signal.SIGKILL)
        env.process.proc.wait(10)
        t0 = time.monotonic()
        with pytest.raises(EnvProcessError, match=r"exited with status -9.*the env process is gone"):
            env.step(np.zeros(4, np.float32))
        assert time.monotonic() - t0 < 5.0  # found at once, not after the 30 s request timeout
    finally:
        env.close()


def test_env_process_killed_during_a_step_is_reported_within_a_poll_not_the_timeout(fakes):
    """The process ends while a step waits for its reply (stopped, then killed 0.5 s later): the step raises
    EnvProcessError within about ALIVE_POLL_S of the kill, not at the 30 s request timeout."""
    import threading

    env = start_isolated_env(sys.executable, FAKE, {"task": "reach"}, timeout_s=30.0)
    try:
        env.reset(seed=0)
        _stop(env.process.pid)  # the step's request is sent but never answered
        threading.Timer(0.5, os.kill, (env.process.pid, signal.SIGKILL)).start()
        t0 = time.monotonic()
        with pytest.raises(EnvProcessError, match=r"exited with status -9.*process ended while 'step' waited"):
            env.step(np.zeros(4, np.float32))
        assert time.monotonic() - t0 < 10.0  # kill at 0.5 s + a 0.25 s poll; the timeout is 30 s
    finally:
        env.close()


def test_crash_inside_a_step_reports_the_process_output(fakes):
    env = start_isolated_env(sys.executable, FAKE, {"task": "reach", "crash_at_step": 2}, timeout_s=3.0)
    try:
        env.reset(seed=0)
        env.step(np.zeros(4, np.float32))
        with pytest.raises(EnvProcessError, match=r"exited with status 3"):
            env.step(np.zeros(4, np.float32))
    finally:
        env.close()


def test_hung_env_process_times_out(fakes):
    env = start_isolated_env(sys.executable, FAKE, {"task": "reach"}, timeout_s=1.0)
    try:
        env.reset(seed=0)
        _stop(env.process.pid)
        with pytest.raises(EnvProcessError, match=r"running\): no reply"):
            env.step(np.zeros(4, np.float32))
    finally:
        os.kill(env.process.pid, signal.SIGCONT)
        env.close()
    assert not env.process.alive()


def test_env_process_that_fails_to_start_names_the_cause():
    with pytest.raises(EnvProcessError, match=r"exited before serving(.|\n)*No module named 'no_such_env_module'"):
        start_isolated_env(sys.executable, "no_such_env_module:make", {})


def test_family_names_resolve_through_the_registry(fakes, tmp_path, monkeypatch):
    monkeypatch.setenv("POLICYLINK_ENVS_DIR", str(tmp_path))
    family = IsolatedFamily(name="fakeworld", requirements=(), factory=FAKE, tasks=("reach", "push"))
    registry.register_env_family("fakeworld", family, overwrite=True)
    assert {"fakeworld/reach", "fakeworld/push"} <= set(registry.available_envs())
    registry.check_env_name("fakeworld/push")
    with pytest.raises(registry.UnknownNameError, match="fakeworld task: expected one of .*did you mean 'push'"):
        registry.make_env("fakeworld/pussh")
    with pytest.raises(EnvNotInstalledError, match="policylink envs install fakeworld"):
        registry.make_env("fakeworld/reach")
    record_install("fakeworld", {"python": sys.executable, "installed_at": "now"})
    assert family_python("fakeworld") == sys.executable
    env = registry.make_env("fakeworld/reach", max_episode_steps=20)
    try:
        assert env.env_spec.name == "metaworld/reach" and env.env_spec.max_episode_steps == 20
    finally:
        env.close()
    record_install("gone", {"python": str(tmp_path / "no" / "python")})
    assert set(installed()) == {"fakeworld"}  # an entry whose interpreter is gone is dropped


def test_envs_cli_lists_families(tmp_path, monkeypatch, capsys):
    from policylink.cli.envs import main

    monkeypatch.setenv("POLICYLINK_ENVS_DIR", str(tmp_path))
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert f"venvs under {tmp_path}" in out and "metaworld    not installed" in out
    assert "metaworld/peg-insert-side" in out
    assert main(["install"]) == 2 and main(["frobnicate"]) == 2


def test_server_side_imports_no_torch_nor_our_mujoco_tasks():
    code = (
        "import sys, policylink.sim.isolated.server, policylink.sim.isolated.metaworld_env; "
        "bad = [m for m in sys.modules if m == 'torch' or m.startswith('policylink.sim.mujoco')]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_host_and_venv_task_lists_agree():
    assert metaworld.MT10_TASKS == metaworld_env.MT10_TASKS
    assert set(metaworld_env.INSTRUCTIONS) == set(metaworld.MT10_TASKS)


@pytest.mark.skipif("metaworld" not in installed(), reason="needs `policylink envs install metaworld`")
def test_real_metaworld_through_its_venv(expert_episode):
    env = registry.make_env("metaworld/reach")
    try:
        assert env.env_spec.name == "metaworld/reach" and env.env_spec.max_episode_steps == 500
        first_a, steps_a, ok_a = expert_episode(env, seed=11, max_steps=199)
        first_b, steps_b, ok_b = expert_episode(env, seed=11, max_steps=199)
        assert ok_a and ok_b and steps_a == steps_b
        np.testing.assert_array_equal(first_a, first_b)
    finally:
        env.close()
    env = registry.make_env("metaworld/push", obs_mode="image", image_size=32, cameras=["corner2", "topview"])
    try:
        obs, _ = env.reset(seed=0)
        for cam in ("corner2", "topview"):
            assert obs[IMAGE_PREFIX + cam].shape == (32, 32, 3) and obs[IMAGE_PREFIX + cam].std() > 0
        assert STATE_KEY not in obs and obs[TASK_KEY] == "push the puck to a goal"
    finally:
        env.close()
    env = registry.make_env("metaworld/reach", obs_mode="image+proprio", image_size=16)
    try:
        obs, _ = env.reset(seed=11)
        np.testing.assert_array_equal(obs[STATE_KEY], first_a[:4])  # the hand and gripper of the same reset
        assert obs[IMAGE_PREFIX + "corner2"].shape == (16, 16, 3)
    finally:
        env.close()


def test_an_env_process_crash_in_an_evaluation_is_episode_errors_in_its_table(fakes, tmp_path):
    """The env process dies at its 5th step of the first episode: `evaluate` neither hangs nor aborts; the cell's
    3 planned episodes are failures carrying the process error, and the table says "3 env errors"."""
    from policylink.adapters.policy import HistoryPolicy
    from policylink.adapters.schema import FeatureSpec, PolicySpec
    from policylink.evaluate import nxm

    spec = fakes.make_fake_metaworld_env("reach").env_spec
    action = spec.action

    class Zeros(HistoryPolicy):
        def __init__(self):
            super().__init__(
                PolicySpec(
                    {STATE_KEY: FeatureSpec("float32", (39,))},
                    action,
                    chunk_size=4,
                    n_action_steps=2,
                    control_frequency=spec.control_frequency,
                )
            )

        def _predict(self, history, pad_mask, tasks):
            return np.zeros((history[STATE_KEY].shape[0], 4, action.dim), np.float32)

    def crashy():
        return start_isolated_env(sys.executable, FAKE, {"task": "reach", "crash_at_step": 5}, timeout_s=10.0)

    summaries = nxm.evaluate(
        [("zeros", Zeros)], [("crashy", crashy)], episodes=3, workers=0, progress=False, out=tmp_path, videos=0
    )
    (s,) = summaries
    assert (s["n_episodes"], s["n_success"], s["n_errors"]) == (3, 0, 3)
    info = json.loads(next((tmp_path / "cells").glob("*/eval_info.json")).read_text())
    errors = [e["error"] for e in info["per_episode"]]
    assert [e["seed"] for e in info["per_episode"]] == [100000, 100001, 100002]  # the default seed + index
    assert all("EnvProcessError" in e and "exited with status 3" in e for e in errors), errors
    assert "(n=3) (3 env errors)" in (tmp_path / "results.md").read_text()
