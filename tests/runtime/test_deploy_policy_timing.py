"""Deployment with a policy that is slow or gone: a first chunk slower than a control period starts at its first
action (the robot holds until the reply), later chunks stay latency-aligned; a policy that stops answering stops
the robot within the watchdog (it holds, the run says why, the recording keeps the episode marked aborted).
In process with a fake clock (exact values), and through the policy and robot servers on loopback in real time
(invariants and generous margins only)."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from policylink.adapters.policy import HistoryPolicy
from policylink.adapters.schema import ActionSpec, ControlMode, EnvSpec, FeatureSpec, PolicySpec
from policylink.data.buffer import EpisodeStore
from policylink.real.deploy import DeployStats, open_deploy_recorder, run_deployment
from policylink.real.robot import Robot
from policylink.runtime.executors import ExecutorConfig, LatencyConfig, make_executor
from policylink.runtime.rollout import make_vector_env, plan_episodes, rollout

STATE = "observation.state"
HZ = 8.0  # period 0.125 s, a binary fraction: fake-clock times add up exactly
PERIOD = 1.0 / HZ


def _action_spec():
    return ActionSpec(("src", "t"), ControlMode.EE_DELTA, ("1", "1"), (-1e6, -1e6), (1e6, 1e6))


class StepRobot(Robot):
    """A robot whose state is ``(1, k)``, ``k`` = observations read this episode (the step index). It logs every
    command it receives as ``(k, clock(), command)`` in ``commands``; its hold command is zeros."""

    def __init__(self, clock, hz=HZ, steps=64):
        self.env_spec = EnvSpec(
            name="steps",
            observation_features={STATE: FeatureSpec("float32", (2,)), "task": FeatureSpec("string", ())},
            action=_action_spec(),
            control_frequency=hz,
            max_episode_steps=steps,
        )
        self.clock, self.steps, self.k, self.commands = clock, steps, 0, []

    def reset(self, seed=None, options=None):
        self.k = 0
        return self._obs(), {"is_success": False}

    def get_observation(self):
        self.k += 1
        return self._obs()

    def episode_info(self):
        return {"is_success": False, "terminated": False, "truncated": self.k >= self.steps}

    def send_action(self, action):
        a = np.asarray(action, np.float32).copy()
        self.commands.append((self.k, self.clock(), a))
        return a

    def hold_action(self):
        return np.zeros(2, np.float32)

    def _obs(self):
        return {STATE: np.array([1.0, self.k], np.float32), "task": ""}

    def policy_commands(self):
        """The non-hold commands ``[(k, t, action)]`` (every policy action is non-zero)."""
        return [c for c in self.commands if c[2].any()]


class StepPolicy(HistoryPolicy):
    """``chunk[i] = (1000 + T, T + i)`` for the newest observation ``(1, T)``: ``action[1]`` is the step the action
    is planned for and ``action[1] - action[0] + 1000`` its index in its chunk. The first call advances a fake
    ``clock`` by ``first_s``; with ``hang``, every later call waits for that event (at most 10 s), then raises.
    ``replies``: clock time of every chunk returned."""

    def __init__(self, clock, hz=HZ, chunk_size=8, n_action_steps=4, first_s=0.0, hang=None):
        spec = PolicySpec(
            {STATE: FeatureSpec("float32", (2,))},
            _action_spec(),
            n_obs_steps=1,
            chunk_size=chunk_size,
            n_action_steps=n_action_steps,
            control_frequency=hz,
        )
        super().__init__(spec)
        self.clock, self.first_s, self.hang, self.replies = clock, first_s, hang, []

    def _predict(self, history, pad_mask, tasks):
        if self.replies and self.hang is not None:
            self.hang.wait(10.0)
            raise RuntimeError("StepPolicy: stopped answering")
        if not self.replies and self.first_s:
            self.clock.t += self.first_s
        obs = history[STATE][:, -1]
        h = self.spec.chunk_size
        src = 1000.0 + np.repeat(obs[:, 1:2], h, 1)
        chunk = np.stack([src, obs[:, 1:2] + np.arange(h)[None]], -1).astype(np.float32)
        self.replies.append(self.clock())
        return chunk


def _chunk_starts(commands):
    """Index in its chunk of the first executed action of each chunk."""
    starts, seen = [], set()
    for _, _, a in commands:
        if a[0] not in seen:
            seen.add(a[0])
            starts.append(int(a[1] - a[0] + 1000))
    return starts


def test_a_first_chunk_slower_than_a_period_starts_at_its_first_action(fake_clock, on_fake_clock):
    clock = fake_clock
    robot = StepRobot(clock, steps=12)
    policy = StepPolicy(clock, chunk_size=8, n_action_steps=4, first_s=0.3)  # 2.4 periods
    ex = make_executor(policy, ExecutorConfig(kind="async", latency=LatencyConfig("fixed", 2)))
    vec = make_vector_env(lambda: on_fake_clock(robot), plan_episodes(1, 0, 1), 12)
    stats = DeployStats()
    try:
        rollout(vec, ex, 1, subscribers=[stats])
    finally:
        ex.close()
    first_k, first_t, first_a = robot.commands[0]
    assert first_k == 0 and first_t == pytest.approx(1000.3)  # held until the reply, then a_0 at once
    np.testing.assert_array_equal(first_a, [1000.0, 0.0])
    assert [c[2][1] for c in robot.commands] == [c[0] for c in robot.commands]  # each action at its own step
    assert _chunk_starts(robot.commands) == [0, 2, 2]  # later chunks: the 2 actions of the delay are dropped
    assert len(robot.commands) == 12 and (stats.late, stats.startup_late) == (0, 1)
    times = [c[1] for c in robot.commands]
    np.testing.assert_allclose(np.diff(times), PERIOD)  # a_0 gets a whole period, like every later action


@pytest.fixture
def servers():
    """Factory ``servers(policy, robot, watchdog_s) -> (policy address, robot address)``: both served on free
    loopback ports, stopped at teardown."""
    from policylink.adapters.transport import PolicyServer
    from policylink.real.safety import SafetyConfig
    from policylink.real.server import RobotServer

    opened = []

    def start(policy, robot, watchdog_s):
        p = PolicyServer(policy, "tcp://127.0.0.1:0").start()
        opened.append(p)
        safety = SafetyConfig.from_action_spec(robot.env_spec.action, watchdog_s=watchdog_s)
        r = RobotServer(robot, "tcp://127.0.0.1:0", safety=safety).start()
        opened.append(r)
        return p.endpoint, r.endpoint

    yield start
    for s in reversed(opened):
        s.stop()


def _run_config(policy, robot, tmp_path, n_action_steps, **kw):
    from policylink.evaluate.run import RunConfig

    cfg = ExecutorConfig(kind="async", n_action_steps=n_action_steps)
    return RunConfig(policy=policy, robot=robot, episodes=1, executor=cfg, record=str(tmp_path / "run.zarr"), **kw)


def test_through_the_servers_a_slow_first_chunk_starts_at_a0_and_later_chunks_stay_aligned(servers, tmp_path):
    from policylink.real.deploy import deploy

    hz = 25.0  # 40 ms periods; every inference takes >= 100 ms (2.5 periods)
    robot = StepRobot(time.monotonic, hz=hz, steps=24)
    paddr, raddr = servers(StepPolicy(time.monotonic, hz=hz, chunk_size=12, n_action_steps=4), robot, 0.5)
    out = deploy(_run_config(paddr, raddr, tmp_path, 4, inject_latency_ms=100.0))
    assert out.code == 0
    cmds = robot.policy_commands()
    assert cmds[0][0] == 0  # the first command answers the first observation ...
    np.testing.assert_array_equal(cmds[0][2], [1000.0, 0.0])  # ... and is a_0 of the first chunk
    assert [c[2][1] for c in cmds] == [c[0] for c in cmds]  # every action executed at the step it is planned for
    starts = _chunk_starts(cmds)
    assert len(starts) >= 3 and starts[0] == 0 and min(starts[1:]) >= 1  # passed actions of later chunks dropped


@pytest.mark.parametrize("n_action_steps", [1, 2])
def test_a_policy_that_stops_answering_stops_the_robot_within_the_watchdog(
    tmp_path, n_action_steps, fake_clock, on_fake_clock
):
    clock, hang = fake_clock, threading.Event()
    robot = StepRobot(clock, steps=64)
    policy = StepPolicy(clock, chunk_size=16, n_action_steps=n_action_steps, hang=hang)  # a chunk lasts 2 s
    ex = make_executor(policy, ExecutorConfig(kind="async"))
    rec = open_deploy_recorder(str(tmp_path / "run.zarr"), robot.env_spec)
    try:
        out = run_deployment(on_fake_clock(robot), ex, 1, recorder=rec, reply_timeout_s=0.5)
    finally:
        hang.set()
    (last_reply,) = policy.replies  # it answered the first request only
    cmds = robot.policy_commands()
    # the next request goes out n_action_steps periods after the reply; actions run while it is unanswered for
    # at most 0.5 s (times are binary fractions: exact)
    assert cmds[-1][1] - last_reply == 0.5 + n_action_steps * PERIOD
    assert [c[2][1] for c in cmds] == list(range(len(cmds)))  # the planned actions, one per period, none skipped
    held_k, held_t, held = robot.commands[-1]  # then the robot is told to hold, at the next period
    assert held.tolist() == [0.0, 0.0] and held_t == cmds[-1][1] + PERIOD
    assert out.code == 1 and out.results == []
    waited, since = 1e3 * (0.5 + PERIOD), 1e3 * (0.5 + (n_action_steps + 1) * PERIOD)
    assert out.reason.startswith(
        f"the policy stopped answering: no reply to a chunk request for {waited:.0f} ms (limit 500 ms); its last "
        f"reply came {since:.0f} ms ago; the robot holds"
    )
    store = EpisodeStore(tmp_path / "run.zarr", "r")  # the episode so far is kept, marked aborted
    assert store.n_episodes == 1 and store.episode_lengths.tolist() == [len(cmds)]
    assert store.episode_meta(0).success is None and store.episode_meta(0).quality == "policy+aborted"


def test_through_the_servers_a_policy_that_stops_answering_stops_the_robot_within_the_watchdog(servers, tmp_path):
    from policylink.real.deploy import deploy

    hz, watchdog = 25.0, 0.3
    hang = threading.Event()
    robot = StepRobot(time.monotonic, hz=hz, steps=200)
    policy = StepPolicy(time.monotonic, hz=hz, chunk_size=32, n_action_steps=1, hang=hang)  # a chunk lasts 1.28 s
    paddr, raddr = servers(policy, robot, watchdog)
    try:
        out = deploy(_run_config(paddr, raddr, tmp_path, 1))
    finally:
        hang.set()
    (last_reply,) = policy.replies
    cmds = robot.policy_commands()
    stale = cmds[-1][1] - last_reply  # watchdog + one period = 0.34 s here (the old executor ran on for 1.24 s)
    assert watchdog - 1 / hz <= stale <= watchdog + 1 / hz + 0.25, stale
    assert not robot.commands[-1][2].any()  # held
    assert out.code == 1 and "stopped answering" in out.reason and "(limit 300 ms)" in out.reason  # the robot's
    store = EpisodeStore(tmp_path / "run.zarr", "r")
    assert store.n_episodes == 1 and store.episode_meta(0).quality == "policy+aborted"
