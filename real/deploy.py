"""The deployment loop: the one rollout loop (:func:`policylink.runtime.rollout.rollout`) stepping the robot itself,
a :class:`~policylink.real.robot.RobotEnv` (it paces its own steps behind its safety layer); plus per-step timing
statistics, crash-safe recording (:mod:`policylink.real.deploy_recorder`), and a stop within the robot's watchdog
(the robot holds, the run says why) when the policy stops answering. ``policylink run --robot tcp://HOST:PORT``
runs it (:func:`run_on_robot`).
"""

from __future__ import annotations

import functools
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from policylink.real.deploy_recorder import DeployRecorder, open_deploy_recorder
from policylink.real.pacing import Pacer, precise_sleep  # noqa: F401 - Pacer: its old import path
from policylink.real.robot import RobotEnv, SafeRobot, WatchdogTripped
from policylink.real.sim_robot import SimRobot
from policylink.real.teleop import Teleoperator
from policylink.runtime.rollout import EpisodeSubscriber


@dataclass
class DeployStats(EpisodeSubscriber):
    """Counters of a deployment run (all episodes): the rollout loop's subscriber reading each step's
    ``info["deploy"]`` (:class:`~policylink.real.robot.RobotEnv`).

    Attributes:
        steps, late, human: steps taken, of which with a late (dropped) action, and by the human.
        latencies_s, period_errors_s, periods_s: per step: observation-to-action time, wake-up error, and the
            time between consecutive observations, seconds.
        active_s: time spent stepping (resets excluded), seconds; ``safety``: the robot's latest safety status.
        startup_steps, startup_late, startup_s: each episode's first step (its first chunk is a blocking
            inference while the robot stands still): counted here, not in the running figures above.
            ``startup_late`` counts first chunks slower than a period; their first action is executed all the same.
        status: called with these stats about once a second (the live status line), or None.
        lockstep: the robot runs on lockstep time (:class:`~policylink.real.lockstep.LockstepClock`, set by
            :func:`run_deployment`): inference takes no simulated time, so :meth:`line` reports no latency.
    """

    steps: int = 0
    late: int = 0
    human: int = 0
    startup_steps: int = 0
    startup_late: int = 0
    startup_s: float = 0.0
    latencies_s: list[float] = field(default_factory=list)
    period_errors_s: list[float] = field(default_factory=list)
    periods_s: list[float] = field(default_factory=list)
    active_s: float = 0.0
    safety: dict[str, Any] = field(default_factory=dict)
    status: Callable[[DeployStats], None] | None = field(default=None, repr=False)
    lockstep: bool = False
    _shown: float = field(default=0.0, repr=False)

    def on_step(self, slot, obs, action, reward, done, info) -> None:
        """Count one step from its ``info["deploy"]`` timing."""
        d = info["deploy"]
        self.human += int(d["source"])
        if d["first"]:
            self.startup_steps += 1
            self.startup_late += int(d["late"])
            self.startup_s += float(d["period_s"])
        else:
            self.steps += 1
            self.late += int(d["late"])
            self.latencies_s.append(float(d["latency_s"]))
            self.period_errors_s.append(float(d["period_error_s"]))
            self.periods_s.append(float(d["period_s"]))
            self.active_s += float(d["period_s"])
        self.safety = dict(info.get("safety") or self.safety)
        if self.status is not None and time.monotonic() - self._shown >= 1.0:
            self._shown = time.monotonic()
            self.status(self)

    def summary(self, period_s: float) -> dict[str, float]:
        """``rate_hz`` (steps / active time), ``rate_error`` (relative to ``1 / period_s``), ``late``,
        ``latency_p50_ms``/``p99``, ``wake_error_p99_ms`` (deadline wake-up error) and ``period_p99_error_ms``
        (``|observation period - nominal|``)."""
        rate = self.steps / self.active_s if self.active_s > 0 else 0.0
        lat = np.asarray(self.latencies_s or [0.0]) * 1e3
        err = np.abs(np.asarray(self.periods_s or [period_s]) - period_s) * 1e3
        wake = np.asarray(self.period_errors_s or [0.0]) * 1e3
        return {
            "steps": self.steps,
            "rate_hz": rate,
            "rate_error": rate * period_s - 1.0,
            "late": self.late,
            "latency_p50_ms": float(np.percentile(lat, 50)),
            "latency_p99_ms": float(np.percentile(lat, 99)),
            "period_p99_error_ms": float(np.percentile(err, 99)),
            "wake_error_p99_ms": float(np.percentile(wake, 99)),
        }

    def line(self, period_s: float) -> str:
        """One status line: rate, overruns (late), latency p50/p99 (``lockstep: latency not measured`` in lockstep
        time, where every latency reads 0), safety clips."""
        s = self.summary(period_s)
        clips = sum((self.safety.get("counts") or {}).values())
        latency = (
            "lockstep: latency not measured"
            if self.lockstep
            else f"latency p50 {s['latency_p50_ms']:.1f} ms p99 {s['latency_p99_ms']:.1f} ms"
        )
        return (
            f"rate {s['rate_hz']:.2f} Hz | late {self.late} (+{self.startup_late} slow first chunks) | {latency} | "
            f"safety clips/holds {clips} | human steps {self.human}"
        )


def inject_inference_latency(policy: Any, seconds: float) -> Any:
    """Make every chunk request of ``policy`` take at least ``seconds`` (benchmarks: a slower model on the same
    robot); the policy's capabilities are unchanged. Returns ``policy``.

    Raises:
        ValueError: ``seconds < 0``."""
    if not seconds >= 0:
        raise ValueError(f"inject_latency_ms: expected >= 0, received {seconds * 1e3}")
    if seconds == 0:
        return policy
    for name in ("predict_action_chunk", "predict_action_chunk_with_prefix", "sample"):
        fn = getattr(policy, name, None)
        if fn is not None:
            setattr(policy, name, _delayed(fn, seconds))
    return policy


def _delayed(fn: Callable[..., Any], seconds: float) -> Callable[..., Any]:
    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        until = time.monotonic() + seconds
        out = fn(*args, **kwargs)
        precise_sleep(until)
        return out

    return call


def print_status(stats: DeployStats, period_s: float, stream: Any = sys.stderr) -> None:
    """Rewrite the live status line on ``stream``."""
    stream.write("\r" + stats.line(period_s) + "   ")
    stream.flush()


DEFAULT_REPLY_TIMEOUT_S = 0.5
"""Reply timeout of a deployment whose robot reports no watchdog, seconds (``SafetyConfig.watchdog_s``'s default)."""


@dataclass
class DeployOutcome:
    """What :func:`deploy` returns: the exit ``code`` (0 done, 1 the policy or a server stopped answering or the
    robot's watchdog tripped, 130 Ctrl-C), the finished episodes' ``results``
    (:class:`~policylink.runtime.rollout.EpisodeResult`), the :class:`DeployStats`, the control ``period_s``
    (seconds) and the ``reason`` the run ended early (one line; ``""`` when every episode finished)."""

    code: int
    results: list[Any]
    stats: DeployStats
    period_s: float
    reason: str = ""


def summary_line(out: DeployOutcome, episodes: int) -> str:
    """``success: K/N`` over the finished episodes; when the run ended early, also how far it got (``the run
    stopped after N of E episodes``), so a partial run never reads as a complete one."""
    n, n_ok = len(out.results), sum(bool(r.success) for r in out.results)
    line = f"success: {n_ok}/{n}"
    if n < episodes:
        line += f" (the run stopped after {n} of {episodes} episodes)"
    return line


def run_on_robot(cfg: Any) -> int:
    """``policylink run --policy P --robot tcp://HOST:PORT [--hz F] [--record STORE]``: :func:`deploy` with the
    live status line and a final summary; returns the exit code."""
    out = deploy(cfg, status=True)
    print(f"{summary_line(out, cfg.episodes)} | {out.stats.line(out.period_s)}")
    if cfg.record:
        print(f"recorded to {cfg.record}")
    return out.code


def deploy(cfg: Any, status: bool = False) -> DeployOutcome:
    """Run ``cfg.episodes`` episodes of ``cfg.policy`` on the robot served at ``cfg.robot`` through the rollout
    loop (``cfg``: a :class:`~policylink.evaluate.run.RunConfig`), recording to ``cfg.record`` when set, with
    :func:`run_deployment`; an asynchronous executor stops when a chunk request goes unanswered for longer than
    the robot's watchdog (:func:`reply_timeout_s`).

    Raises:
        IncompatibleSpecError: the policy, robot and executor do not fit (before anything moves).
        TimeoutError: the robot server does not answer ``hello``.
    """
    from policylink.adapters.schema import IncompatibleSpecError
    from policylink.runtime.checks import cell_problems, limit_threads
    from policylink.runtime.executors import make_executor

    if cfg.teleop and cfg.teleop not in TELEOPS:
        from policylink.adapters.registry import UnknownNameError, unknown_name_message

        raise UnknownNameError(unknown_name_message("teleop", cfg.teleop, TELEOPS))
    if cfg.teleop == "expert" and not str(cfg.robot).startswith(SIM_ROBOT_PREFIX):
        raise ValueError(f"teleop: 'expert' (the scripted stand-in operator) needs --robot sim:TASK, received robot="
                         f"{cfg.robot!r}; on a real robot use --teleop keyboard")  # fmt: skip
    if cfg.lockstep and not str(cfg.robot).startswith(SIM_ROBOT_PREFIX):
        raise ValueError(f"lockstep: a simulated robot's option (--robot sim:TASK), received robot={cfg.robot!r}")
    robot, safety = open_robot(cfg)
    spec = robot.env_spec
    policy = _load_deploy_policy(cfg, robot.period, spec)
    limit_threads(cfg.threads)
    problems = cell_problems(cfg.policy, policy.spec, cfg.robot, spec, cfg.executor)
    if problems:
        raise IncompatibleSpecError(problems)
    robot.teleop = _teleop(cfg, spec.action.dim, robot)
    stats = DeployStats(status=(lambda st: print_status(st, robot.period)) if status else None)
    executor = make_executor(policy, cfg.executor)
    recorder = open_deploy_recorder(cfg.record, spec) if cfg.record else None
    timeout = reply_timeout_s(safety)
    return run_deployment(
        robot, executor, cfg.episodes, seed=cfg.seed, recorder=recorder, reply_timeout_s=timeout, stats=stats
    )


def run_deployment(
    robot: RobotEnv,
    executor: Any,
    episodes: int,
    *,
    seed: int = 0,
    recorder: Any = None,
    reply_timeout_s: float | None = DEFAULT_REPLY_TIMEOUT_S,
    stats: DeployStats | None = None,
) -> DeployOutcome:
    """Run ``episodes`` episodes (reset seeds ``seed + i``) of ``executor`` on ``robot``, a
    :class:`~policylink.real.robot.RobotEnv`, through the rollout loop, counting into ``stats`` (default a new
    :class:`DeployStats`; with a ``status`` it also prints a line per episode) and recording to ``recorder`` (from
    :func:`open_deploy_recorder`) when given.

    An :class:`~policylink.runtime.executors.AsyncExecutor` stops at a chunk request unanswered for more than
    ``reply_timeout_s`` seconds of ``robot.clock`` (None = never): after the policy's last reply the robot executes
    the planned actions up to the next request, then at most ``reply_timeout_s`` more. Ctrl-C, a policy that
    stops answering, a dead policy or robot server and a tripped robot watchdog end the run with one message on
    stderr, also in the outcome's ``code`` and ``reason``. Whatever ends it, the robot is asked to hold, an
    unfinished episode is committed (success unknown, quality ``aborted``), and the executor, the recorder and
    the robot (its connection) are closed.

    Raises:
        Exception: any other error (after the same clean-up).
    """
    from policylink.adapters.protocol import RemoteError
    from policylink.runtime.executors import AsyncExecutor
    from policylink.runtime.rollout import make_vector_env, plan_episodes, rollout

    if reply_timeout_s is not None and isinstance(executor, AsyncExecutor):
        executor.watch_replies(reply_timeout_s, robot.clock)
    from policylink.real.lockstep import LockstepClock

    stats = stats if stats is not None else DeployStats()
    stats.lockstep = isinstance(robot.clock, LockstepClock)
    vec = make_vector_env(lambda: robot, plan_episodes(episodes, seed, 1), robot.env_spec.max_episode_steps)
    subs = [stats, DeployRecorder(recorder)] if recorder is not None else [stats]
    out = DeployOutcome(0, [], stats, robot.period)

    def progress(r: Any) -> None:
        out.results.append(r)
        if stats.status is not None:
            line = stats.line(robot.period)
            print(f"\repisode {r.index} seed {r.seed}: success={r.success} steps={r.n_steps} | {line}")

    try:
        rollout(vec, executor, episodes, subscribers=subs, progress=progress)
    except (KeyboardInterrupt, WatchdogTripped, TimeoutError, RemoteError, ConnectionError) as e:
        out.code, out.reason = _ending(e)
        print(f"\n{out.reason}", file=sys.stderr)
    finally:
        try:
            robot.stop()  # hold now; a robot server that is gone already holds by its watchdog
        except Exception as e:  # noqa: BLE001 (the run is ending; the watchdog covers a dead link)
            print(f"hold request failed ({type(e).__name__}); the robot's watchdog holds it", file=sys.stderr)
        executor.close()
        vec.close()  # closes the robot
        if recorder is not None:
            recorder.close()
    return out


SIM_ROBOT_PREFIX = "sim:"
TELEOPS = ("keyboard", "expert")  # --teleop names
"""``run --robot sim:TASK``: the sim-as-real robot of ``TASK`` in this process (no robot server)."""
SIM_WATCHDOG_PERIODS = 10
"""The in-process sim robot's watchdog, in control periods (at least 500 ms)."""


def open_robot(cfg: Any) -> tuple[RobotEnv, dict[str, Any]]:
    """The robot env of ``cfg.robot`` and its safety status: a :class:`~policylink.real.server.RemoteRobot` for a
    server address (re-armed: starting a run is the operator's explicit re-arm after an earlier watchdog trip), or
    for ``sim:TASK`` the sim-as-real robot of ``TASK`` (built as ``policylink robot --sim TASK`` builds it, with
    ``cfg.env_kwargs`` as the task's kwargs, ``gap`` included) behind a :class:`~policylink.real.robot.SafeRobot` in
    this process, paced at ``cfg.hz`` (default the task's rate; another rate runs the simulated world at
    ``time_scale = hz / control_frequency``, the same physics per step: a loaded machine can deploy at half speed
    with ``--hz 5`` on a 10 Hz task). Its watchdog is ``max(500 ms, SIM_WATCHDOG_PERIODS periods)``: a shared
    machine stalls longer than a robot computer, and a trip ends the run. ``cfg.lockstep``: the simulated world's
    time advances only while the loop waits (:class:`~policylink.real.lockstep.LockstepClock`).

    Raises:
        ValueError: ``sim:`` without a task name, or an address with no scheme (``pick_place``: did you mean
            ``sim:pick_place``?).
        UnknownNameError: an unknown task.
    """
    if not str(cfg.robot).startswith(SIM_ROBOT_PREFIX):
        if "://" not in str(cfg.robot):  # a bare task name: the sim-as-real robot was meant
            raise ValueError(
                f"robot: expected tcp://HOST:PORT, ipc://PATH or sim:TASK, received {cfg.robot!r}; "
                f"did you mean {SIM_ROBOT_PREFIX + str(cfg.robot)!r}?"
            )
        from policylink.real.server import RemoteRobot

        robot = RemoteRobot(cfg.robot, hz=cfg.hz)
        return robot, robot.rearm()
    from policylink.real.robot import SafeRobot
    from policylink.real.robots import RobotConfig, build_robot, safety_config

    task = str(cfg.robot)[len(SIM_ROBOT_PREFIX) :]
    if not task:
        raise ValueError(f"robot: expected 'sim:TASK' (e.g. sim:pick_place) or tcp://HOST:PORT, received {cfg.robot!r}")
    kwargs = dict(cfg.env_kwargs)
    rcfg = RobotConfig(sim=task, gap=kwargs.pop("gap", None), sim_kwargs=kwargs)
    clock = None
    if cfg.lockstep:
        from policylink.real.lockstep import LockstepClock

        clock = LockstepClock()
    sim = build_robot(rcfg, clock)
    hz = float(cfg.hz or sim.env_spec.control_frequency)
    if hz != float(sim.env_spec.control_frequency):  # the simulated world runs at the asked rate
        sim.disconnect()
        rcfg.time_scale = hz / float(sim.env_spec.control_frequency)
        sim = build_robot(rcfg, clock)
    rcfg.watchdog_ms = max(rcfg.watchdog_ms, SIM_WATCHDOG_PERIODS * 1e3 / hz)
    if clock is None:
        robot = SafeRobot(sim, safety_config(rcfg, sim), hz=hz)
    else:
        from policylink.real.pacing import Pacer

        clock.robot = sim
        robot = SafeRobot(sim, safety_config(rcfg, sim), hz=hz, clock=clock)
        robot.pacer = Pacer(robot.period, clock, sleep=clock.sleep)
    robot.connect()
    return robot, robot.safety.status()


def reply_timeout_s(safety: dict[str, Any]) -> float:
    """The longest a deployment waits for a chunk it asked for while the robot executes the old one, seconds: the
    robot's watchdog ``watchdog_s`` from the safety status ``safety`` (a robot server's ``rearm`` reply), or
    :data:`DEFAULT_REPLY_TIMEOUT_S` when it reports none (watchdog off, or an older server)."""
    w = safety.get("watchdog_s")
    return float(w) if w else DEFAULT_REPLY_TIMEOUT_S


def _ending(e: BaseException) -> tuple[int, str]:
    """The exit code and the one-line reason of a deployment ended by ``e``."""
    from policylink.runtime.executors import PolicyStoppedAnswering

    if isinstance(e, KeyboardInterrupt):
        return 130, "interrupted: the robot is holding"
    if isinstance(e, PolicyStoppedAnswering):
        return 1, (
            f"{e}; the robot holds (the limit is the robot's watchdog: a longer --watchdog-ms on the robot server "
            "tolerates slower inference)"
        )
    if isinstance(e, WatchdogTripped):
        return 1, (
            f"{e}: the run ends here; start it again to re-arm (a longer --watchdog-ms on the robot server "
            "tolerates slower inference)"
        )
    return 1, f"policy or robot server stopped answering ({type(e).__name__}: {e}); the robot holds"


def _load_deploy_policy(cfg: Any, period: float, env_spec: Any = None) -> Any:
    """The policy of ``cfg.policy`` (a server address gets a short timeout: a dead server ends the run within
    ``max(5 s, 20 periods)``; an ``xpl://`` server without a spec of its own takes ``env_spec``, the robot's), with
    ``cfg.inject_latency_ms`` added to its inference."""
    from policylink.policies import load_policy

    ref = str(cfg.policy)
    if ref.startswith(("tcp://", "ipc://")):
        from policylink.adapters.transport import RemotePolicy

        policy = RemotePolicy(ref, timeout_s=max(5.0, 20 * period))
    elif ref.startswith("xpl://"):
        from policylink.adapters.xpolicylab import load_remote

        policy = load_remote(ref, env_spec, timeout_s=max(5.0, 20 * period))
    else:
        policy = load_policy(ref, cfg.device, cfg.seed, cfg.cfg_scale)
    return inject_inference_latency(policy, float(cfg.inject_latency_ms) / 1e3)


def _teleop(cfg: Any, action_dim: int, robot: Any = None) -> Teleoperator | None:
    """The human takeover device of ``cfg.teleop`` (``keyboard``: this terminal; ``expert``: the scripted expert of
    a ``sim:TASK`` robot's task under ``cfg.takeover``, :class:`policylink.runtime.operator.ScriptedOperator`), or
    None.

    Raises:
        ValueError: an unknown ``teleop`` name, or ``expert`` on a robot that is not ``sim:TASK``."""
    if not cfg.teleop:
        return None
    if cfg.teleop == "expert":
        driver = robot.robot if isinstance(robot, SafeRobot) else None
        if not isinstance(driver, SimRobot):
            raise ValueError(
                f"teleop: 'expert' needs the simulated robot in this process (--robot sim:TASK), received robot="
                f"{cfg.robot!r}"
            )
        from policylink.runtime.operator import ScriptedOperator

        return ScriptedOperator(driver.env, cfg.takeover)
    if cfg.teleop != "keyboard":
        raise ValueError(f"teleop: expected 'keyboard', 'expert' or None, received {cfg.teleop!r}")
    from policylink.real.teleop import KeyboardTeleop

    tele = KeyboardTeleop(action_dim, step=cfg.teleop_step)
    tele.start_terminal()
    print("keyboard takeover: space toggles, w/s a/d r/f move, x = e-stop", file=sys.stderr)
    return tele
