"""The deployment loop: absolute-deadline pacing (fake clock), a robot env (the driver behind its safety layer)
dropping late actions, human takeover recorded with source ``human``, a tripped watchdog ending the run,
interrupted episodes kept; and the three processes on loopback (policy server, sim-as-real robot
server, ``policylink run --robot``) with a trained reach policy, including a policy server killed mid-run."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from policylink.adapters.schema import ActionSpec, ControlMode, EnvSpec, FeatureSpec
from policylink.data.buffer import EpisodeStore
from policylink.real.deploy import DeployRecorder, DeployStats, open_deploy_recorder
from policylink.real.deploy_recorder import DEPLOY_KEYS
from policylink.real.pacing import Pacer
from policylink.real.robot import Robot
from policylink.real.teleop import KeyboardTeleop
from policylink.runtime.rollout import make_vector_env, plan_episodes, rollout


def test_pacing_1000_periods_at_100_hz_with_2_ms_work_takes_10_s_exactly(fake_clock):
    clock = fake_clock
    pacer = Pacer(0.01, clock, clock.sleep)
    t0 = pacer.t0
    for _ in range(1000):
        clock.t += 0.002  # the work of one period
        assert pacer.wait() == 0.0
    assert clock.t - t0 == pytest.approx(10.0, abs=1e-9) and pacer.overruns == 0


def test_an_overrun_is_counted_and_skipped_not_accumulated(fake_clock):
    clock = fake_clock
    clock.t = 0.0
    pacer = Pacer(0.1, clock, clock.sleep)
    clock.t = 0.05
    pacer.wait()
    assert clock.t == pytest.approx(0.1)
    clock.t = 0.43  # deadlines 0.2, 0.3 and 0.4 were missed
    pacer.wait()
    assert (pacer.overruns, pacer.skipped) == (1, 3)
    assert clock.t == pytest.approx(0.5)  # back on the grid t0 + k * period
    clock.t = 0.52
    pacer.wait()
    assert clock.t == pytest.approx(0.6) and pacer.overruns == 1
    with pytest.raises(ValueError, match="period_s"):
        Pacer(0.0)


def test_catch_up_keeps_every_deadline_so_the_total_stays_n_periods(fake_clock):
    clock = fake_clock
    clock.t = 0.0
    pacer = Pacer(0.1, clock, clock.sleep, catch_up=True)
    clock.t = 0.43  # a stall: deadlines 0.1 .. 0.4 passed
    errors = [pacer.wait() for _ in range(4)]
    assert errors == pytest.approx([0.33, 0.23, 0.13, 0.03]) and clock.t == pytest.approx(0.43)
    assert pacer.wait() == 0.0 and clock.t == pytest.approx(0.5)  # caught up: on the grid again
    assert (pacer.overruns, pacer.skipped) == (4, 0)


class FakeRobot(Robot):
    """A 2-D delta-controlled point; episode ends after 4 steps (success when x > 0.03)."""

    def __init__(self, clock):
        self.env_spec = EnvSpec(
            name="point",
            observation_features={"observation.state": FeatureSpec("float32", (2,)), "task": FeatureSpec("string", ())},
            action=ActionSpec(("dx", "dy"), ControlMode.EE_DELTA, ("m", "m"), (-0.02, -0.02), (0.02, 0.02)),
            control_frequency=10.0,
            max_episode_steps=4,
        )
        self.clock, self.sent, self.x, self.n = clock, [], np.zeros(2, np.float32), 0

    def reset(self, seed=None, options=None):
        self.x[:], self.n = 0.0, 0
        return self.get_observation(), {"is_success": False}

    def get_observation(self):
        return {"observation.state": self.x.copy(), "task": "go right"}

    def send_action(self, action):
        a = np.asarray(action, np.float32)
        self.sent.append(a)
        self.x += a
        return a

    def hold_action(self):
        return np.zeros(2, np.float32)

    def observe(self):
        self.n += 1
        done = self.n >= 4
        return self.get_observation(), {"is_success": bool(self.x[0] > 0.03), "terminated": False, "truncated": done}


class SlowOnce:
    """An action source whose second act takes ``action_delay_s`` (0.15 s: longer than the 0.1 s period)."""

    def __init__(self, clock, action=(0.02, 0.0)):
        self.clock, self.calls, self.action = clock, 0, np.array([action], np.float32)
        self.action_delay_s = 0.15
        self.inferences = np.zeros(1, np.int64)
        self.stall_steps = np.zeros(1, np.int64)

    def act(self, obs):
        self.calls += 1
        if self.calls == 2:
            self.clock.t += self.action_delay_s
        return self.action

    def reset(self, env_ids=None):
        pass


def _deploy(tmp_path, robot, source, episodes=1):
    """Run ``episodes`` of ``source`` on the robot env ``robot`` through the rollout loop, recorded."""
    vec = make_vector_env(lambda: robot, plan_episodes(episodes, 7, 1), 4)
    rec = open_deploy_recorder(str(tmp_path / "run.zarr"), robot.env_spec)
    stats = DeployStats()
    try:
        results = rollout(vec, source, episodes, subscribers=[stats, DeployRecorder(rec)])
    finally:
        rec.close()
    return stats, results, EpisodeStore(tmp_path / "run.zarr", "r")


def test_a_late_action_is_dropped_and_every_step_is_recorded_with_its_timing(tmp_path, fake_clock, on_fake_clock):
    clock = fake_clock
    robot = FakeRobot(clock)
    stats, results, store = _deploy(tmp_path, on_fake_clock(robot), SlowOnce(clock))
    assert (stats.startup_steps, stats.steps, stats.late) == (1, 3, 1)
    assert len(robot.sent) == 3  # the late action never reached the robot
    ep = store.get_episode(0)
    np.testing.assert_array_equal(ep["deploy.late"], [False, True, False, False])
    np.testing.assert_allclose(ep["action"][1], [0.0, 0.0])  # recorded: what the robot executed (hold)
    np.testing.assert_allclose(ep["deploy.latency_s"][1], 0.15, atol=1e-6)
    np.testing.assert_array_equal(ep["deploy.source"], [0, 0, 0, 0])
    assert set(DEPLOY_KEYS) <= set(store.keys) and store.info["step_sources"] == ["policy", "human"]
    assert results[0].success and store.episode_meta(0).success is True


def test_a_tripped_watchdog_ends_the_run_instead_of_feeding_a_robot_that_refuses(tmp_path, fake_clock, on_fake_clock):
    from policylink.real.deploy import WatchdogTripped

    clock = fake_clock
    robot = FakeRobot(clock)
    policy = SlowOnce(clock)
    policy.action_delay_s = 0.6  # the second action is 0.6 s late (dropped); the third finds the watchdog tripped
    with pytest.raises(WatchdogTripped, match="watchdog tripped"):
        _deploy(tmp_path, on_fake_clock(robot, watchdog_s=0.5), policy)
    # the first action reached the motors, then only holds: the watchdog's, and the one replacing the third action
    np.testing.assert_allclose(np.stack(robot.sent), [[0.02, 0.0], [0.0, 0.0], [0.0, 0.0]], atol=1e-7)
    store = EpisodeStore(tmp_path / "run.zarr", "r")  # the interrupted episode is committed, success unknown
    assert store.n_episodes == 1 and store.episode_lengths.tolist() == [2] and store.episode_meta(0).success is None


def test_human_takeover_replaces_the_policy_and_is_recorded_as_human(tmp_path, fake_clock, on_fake_clock):
    clock = fake_clock
    robot = on_fake_clock(FakeRobot(clock))
    robot.teleop = tele = KeyboardTeleop(2, step=0.01, keys={"d": (0, 1.0)})
    tele.press(" ")
    tele.press("d")
    policy = SlowOnce(clock, action=(-0.02, 0.0))
    policy.action_delay_s = 0.0  # never slow
    stats, _, store = _deploy(tmp_path, robot, policy)
    ep = store.get_episode(0)
    np.testing.assert_array_equal(ep["deploy.source"], [1, 1, 1, 1])
    np.testing.assert_allclose(ep["action"][0], [0.01, 0.0])  # the human's key press, not the policy's -0.02
    np.testing.assert_allclose(ep["action"][1], [0.0, 0.0])  # engaged, no key: hold still
    assert stats.human == 4


def test_an_interrupted_episode_is_committed_with_unknown_success(tmp_path, fake_clock, on_fake_clock):
    clock = fake_clock
    robot = on_fake_clock(FakeRobot(clock))

    class Interrupt(SlowOnce):
        def act(self, obs):
            self.calls += 1
            if self.calls == 3:
                raise KeyboardInterrupt
            return self.action

    with pytest.raises(KeyboardInterrupt):
        _deploy(tmp_path, robot, Interrupt(clock))
    store = EpisodeStore(tmp_path / "run.zarr", "r")
    assert store.n_episodes == 1 and store.episode_lengths.tolist() == [2]
    assert store.episode_meta(0).success is None


# -- three processes on loopback -----------------------------------------------------------------------------


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(args):
    # one torch thread: with two on two shared cores one inference takes seconds (see runtime.run.limit_threads)
    env = {**os.environ, "MUJOCO_GL": os.environ.get("MUJOCO_GL", "egl"), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "policylink.cli.app", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    seen = []
    while not seen or "serving" not in seen[-1]:  # wait for the "serving ... on tcp://..." line
        seen.append(proc.stdout.readline())
        assert seen[-1] or proc.poll() is None, "".join(seen)
    return proc


@pytest.mark.slow
def test_three_processes_policy_server_robot_server_and_run_complete_reach(trained_reach_checkpoint, tmp_path):
    from policylink.data.sampler import SequenceDataset
    from policylink.real.server import RemoteRobot

    pport, rport = _free_port(), _free_port()
    policy_addr, robot_addr = f"tcp://127.0.0.1:{pport}", f"tcp://127.0.0.1:{rport}"
    server = _start(["serve", "--checkpoint", str(trained_reach_checkpoint), "--bind", policy_addr, "--device", "cpu"])
    # half speed (5 Hz wall): the policy's inference fits a period even on a loaded 2-core CI machine
    robot = _start(["robot", "--sim", "reach", "--bind", robot_addr, "--watchdog-ms", "600", "--time_scale", "0.5"])
    store = tmp_path / "deploy.zarr"
    run = [
        sys.executable,
        "-m",
        "policylink.cli.app",
        "run",
        "--policy",
        policy_addr,
        "--robot",
        robot_addr,
        "--record",
        str(store),
        "--executor.n_action_steps",
        "4",
        "--hz",
        "5",
    ]
    try:
        first = [*run, "--episodes", "4", "--seed", "100", "--executor.kind", "receding_horizon"]
        done = subprocess.run(first, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr
        n_ok = int(re.search(r"success: (\d)/4", done.stdout).group(1))
        assert n_ok >= 1, done.stdout
        recorded = EpisodeStore(store, "r")
        assert recorded.n_episodes == 4 and set(DEPLOY_KEYS) <= set(recorded.keys)
        acts = recorded.load(["action"])["action"]
        assert np.all(np.abs(acts) <= 0.02 + 1e-6)  # everything executed is within the limits
        ds = SequenceDataset(recorded, n_obs_steps=1, horizon=8, obs_keys=["observation.state"])
        assert len(ds) == recorded.n_steps  # the recording loads for training
        recorded.close()

        # kill the policy server mid-run: the run ends with one message, the robot holds, the data stays
        second = subprocess.Popen(
            [*run, "--episodes", "40", "--seed", "200", "--executor.kind", "async"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and EpisodeStore(store, "r").n_episodes < 5:
            time.sleep(0.2)
        server.send_signal(signal.SIGKILL)
        out, err = second.communicate(timeout=60)
        assert second.returncode == 1, out + err
        assert err.count("stopped answering") == 1
        client = RemoteRobot(robot_addr)
        before, info = client.observe()
        time.sleep(0.3)
        after, _ = client.observe()
        client.disconnect()
        # the robot stands still: tripped mid-episode, or unarmed when the dead policy was asked for a new episode
        assert info["safety"]["watchdog"] in ("tripped", "unarmed")
        np.testing.assert_array_equal(before["observation.state"], after["observation.state"])
        assert EpisodeStore(store, "r").n_episodes >= 5
    finally:
        for p in (server, robot):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                p.wait(timeout=20)


def test_the_summary_of_a_run_that_stopped_early_says_how_far_it_got():
    from types import SimpleNamespace

    from policylink.real.deploy import DeployOutcome, DeployStats, summary_line

    done = [SimpleNamespace(success=s) for s in (True, False, True, True)]
    assert summary_line(DeployOutcome(0, done, DeployStats(), 0.1), 4) == "success: 3/4"
    stopped = DeployOutcome(1, done, DeployStats(), 0.1, reason="the policy stopped answering")
    assert summary_line(stopped, 60) == "success: 3/4 (the run stopped after 4 of 60 episodes)"
    assert (
        summary_line(DeployOutcome(1, [], DeployStats(), 0.1), 2)
        == "success: 0/0 (the run stopped after 0 of 2 episodes)"
    )
