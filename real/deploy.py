"""The deployment loop for robots: fixed-rate control paced by absolute deadlines (:mod:`policylink.real.pacing`:
overruns are counted and skipped, never accumulated), actions stamped with the period they are for and dropped when
late, human takeover, per-step timing, crash-safe recording, and a stop within the robot's watchdog (the robot
holds, the run says why) when the policy stops answering.

It is the one rollout loop (:func:`policylink.runtime.rollout.rollout`) over a one-slot vector env whose env is a
:class:`DeployEnv`: ``step(a)`` sends ``a`` if its period has not ended, sleeps to the next deadline and reads
the next observation. ``policylink run --robot tcp://HOST:PORT`` runs it (:func:`run_on_robot`).
"""

from __future__ import annotations

import functools
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from policylink.adapters.env import EnvAdapter
from policylink.real.pacing import Pacer, precise_sleep
from policylink.real.robot import Clock, Robot
from policylink.real.teleop import STEP_SOURCES, Teleoperator
from policylink.runtime.rollout import RecorderSubscriber

DEPLOY_KEYS = ("deploy.latency_s", "deploy.period_error_s", "deploy.late", "deploy.source")
"""Per-step fields recorded with each deployed step: seconds from the observation to the action (float32), wake-up
error of the period's deadline (float32, s), the action missed its period (bool), who acted (int8, index into
:data:`~policylink.real.teleop.STEP_SOURCES`)."""


@dataclass
class DeployStats:
    """Counters of a deployment run (all episodes).

    Attributes:
        steps, late, human: steps taken, of which with a late (dropped) action, and by the human.
        latencies_s, period_errors_s, periods_s: per step: observation-to-action time, wake-up error, and the
            time between consecutive observations, seconds.
        active_s: time spent stepping (resets excluded), seconds; ``safety``: the robot's latest safety status.
        startup_steps, startup_late, startup_s: each episode's first step (its first chunk is a blocking
            inference while the robot stands still): counted here, not in the running figures above.
            ``startup_late`` counts first chunks slower than a period; their first action is executed all the same.
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
        """One status line: rate, overruns (late), latency p50/p99, safety clips."""
        s = self.summary(period_s)
        clips = sum((self.safety.get("counts") or {}).values())
        return (
            f"rate {s['rate_hz']:.2f} Hz | late {self.late} (+{self.startup_late} slow first chunks) | latency p50 "
            f"{s['latency_p50_ms']:.1f} ms p99 {s['latency_p99_ms']:.1f} ms | safety clips/holds {clips} | "
            f"human steps {self.human}"
        )


class WatchdogTripped(RuntimeError):
    """The robot's watchdog tripped (no fresh action within its period): it holds and refuses commands until an
    explicit re-arm, so the run ends rather than feeding a robot that executes nothing."""


class DeployEnv(EnvAdapter):
    """A robot as a gymnasium env stepped in real time (one slot of the rollout loop's vector env).

    ``reset`` begins an episode on the robot and restarts the pacing grid at the returned observation. ``step(a)``:
    a human's action replaces ``a`` while ``teleop`` is engaged; ``a`` is sent unless its period (the one that
    began at the observation it answers) has already ended -- then it is dropped and counted late; then the loop
    sleeps to the next deadline and reads ``(observation, info)``. An episode's first action is never late: the
    robot held while the first chunk was inferred, so when that took longer than a period the pacing grid restarts
    at the reply and the chunk is executed from its first action ``a_0`` (counted in ``stats.startup_late``).
    ``terminated``/``truncated`` come from the robot (a simulator's episode end); hardware episodes end at the
    plan's ``max_episode_steps``. Reward is 1 on success.

    Args:
        robot: the robot (a :class:`~policylink.real.server.RemoteRobot` or an in-process one).
        hz: control rate (default the robot's ``control_frequency``).
        teleop: an optional :class:`~policylink.real.teleop.Teleoperator`.
        stats: the :class:`DeployStats` to fill (shared across episodes).
        status: called with :attr:`stats` about once a second (the live status line).
        clock: monotonic clock, seconds.
    """

    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(
        self,
        robot: Robot,
        hz: float | None = None,
        *,
        teleop: Teleoperator | None = None,
        stats: DeployStats | None = None,
        status: Callable[[DeployStats], None] | None = None,
        clock: Clock = time.monotonic,
    ):
        self.robot, self.teleop, self.clock = robot, teleop, clock
        self.env_spec = robot.env_spec
        self._init_spaces()
        self.period = 1.0 / float(hz or self.env_spec.control_frequency)
        self.pacer = Pacer(self.period, clock)
        self.stats = stats if stats is not None else DeployStats()
        self._status, self._last_status = status, clock()
        self._obs: dict[str, Any] = {}
        self._obs_t, self._first = clock(), True

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[dict[str, Any], dict]:
        """Begin an episode on the robot; the pacing grid starts now."""
        super().reset(seed=seed)
        obs, info = self.robot.reset(seed=seed, options=options)
        self.pacer.start()
        self._obs, self._obs_t, self._first = obs, self.pacer.t0, True
        return obs, {"is_success": bool(info.get("is_success", False))}

    def step(self, action: Any) -> tuple[dict[str, Any], float, bool, bool, dict]:
        """Send (or drop) ``action``, wait for the next deadline, observe. ``info["deploy"]`` holds this step's
        timing, who acted, whether it was late, and ``sent``: float32 ``(A,)`` the command the robot executes."""
        source = 0
        if self.teleop is not None:
            if self.teleop.estop_requested and hasattr(self.robot, "estop"):
                self.robot.estop("operator (keyboard)")
            if self.teleop.engaged:
                action, source = self.teleop.action(self._obs), 1
        now = self.clock()
        latency = now - self._obs_t
        slow = now > self._obs_t + self.period
        late = slow and not self._first
        if slow and self._first:  # the robot held for the episode's first chunk: a_0 starts now, for a whole period
            self.pacer.start(now)
        if late:
            hold = self.robot.hold_action()
            sent = np.zeros(self.env_spec.action.dim, np.float32) if hold is None else np.asarray(hold, np.float32)
        else:
            sent = np.asarray(self.robot.send_action(action), np.float32)
            if "tripped" in getattr(self.robot, "last_reasons", ()):
                raise WatchdogTripped(
                    "the robot's watchdog tripped (no fresh action within its period); it holds until re-armed"
                )
        wake_error = self.pacer.wait()
        obs, info = self.robot.observe()
        t = self.clock()
        s = self.stats
        s.human += source
        if self._first:
            s.startup_steps += 1
            s.startup_late += int(slow)
            s.startup_s += t - self._obs_t
        else:
            s.steps += 1
            s.late += int(late)
            s.latencies_s.append(latency)
            s.period_errors_s.append(wake_error)
            s.periods_s.append(t - self._obs_t)
            s.active_s += t - self._obs_t
        self._first = False
        s.safety = dict(info.get("safety") or s.safety)
        self._obs, self._obs_t = obs, t
        if self._status is not None and t - self._last_status >= 1.0:
            self._last_status = t
            self._status(s)
        success = bool(info.get("is_success", False))
        step_info = {
            "is_success": success,
            "deploy": {
                "latency_s": latency,
                "period_error_s": wake_error,
                "late": late,
                "source": source,
                "sent": sent,
            },
        }
        return obs, float(success), bool(info.get("terminated", False)), bool(info.get("truncated", False)), step_info


class DeployRecorder(RecorderSubscriber):
    """The rollout loop's recorder subscriber for deployments: records the command the robot actually executed
    (the human's, the policy's after safety, or the hold for a late action) with the :data:`DEPLOY_KEYS` per-step
    fields, and commits an interrupted episode (Ctrl-C, a dead policy server) with success unknown and quality
    ``aborted`` instead of discarding it.

    Args:
        recorder: an ``EpisodeRecorder`` whose keys include :data:`DEPLOY_KEYS` (see :func:`open_deploy_recorder`).
        meta: the episode metadata template (source ``policy``; ``human`` when every step was a human's).
    """

    def on_step(self, slot, obs, action, reward, done, info) -> None:
        """Buffer the step with its deployment fields."""
        d = info.get("deploy")
        row = dict(obs)
        if d is not None:
            row.update(
                {
                    "deploy.latency_s": np.float32(d["latency_s"]),
                    "deploy.period_error_s": np.float32(d["period_error_s"]),
                    "deploy.late": np.bool_(d["late"]),
                    "deploy.source": np.int8(d["source"]),
                }
            )
            action = d["sent"]
        self.recorder.add_step(row, action, reward, done, slot=slot)

    def on_abort(self, slot: int) -> None:
        """Commit the unfinished episode when it has steps: success unknown, ``aborted`` added to its quality tag."""
        if self.recorder.n_steps(slot) > 0:
            quality = "+".join(q for q in (self.meta.quality, "aborted") if q)
            self.recorder.end_episode(success=None, slot=slot, quality=quality)
            self._reset_success.pop(slot, None)
        else:
            self.recorder.abort_episode(slot=slot)


def open_deploy_recorder(path: str, env_spec: Any) -> Any:
    """An ``EpisodeRecorder`` on ``path`` for a deployment of ``env_spec``: its numeric observation features plus
    :data:`DEPLOY_KEYS`; the store's info gets the fps, feature and action specs and ``step_sources``."""
    from policylink.data.recorder import EpisodeRecorder

    keys = [k for k, f in env_spec.observation_features.items() if not f.is_string]
    rec = EpisodeRecorder(path, keys=[*keys, *DEPLOY_KEYS])
    rec.store.update_info(
        fps=float(env_spec.control_frequency),
        env=env_spec.name,
        features={k: f.to_dict() for k, f in env_spec.observation_features.items()},
        action=env_spec.action.to_dict(),
        step_sources=list(STEP_SOURCES),
    )
    return rec


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


def run_on_robot(cfg: Any) -> int:
    """``policylink run --policy P --robot tcp://HOST:PORT [--hz F] [--record STORE]``: :func:`deploy` with the
    live status line and a final summary; returns the exit code."""
    out = deploy(cfg, status=True)
    n_ok = sum(r.success for r in out.results)
    print(f"success: {n_ok}/{len(out.results)} | {out.stats.line(out.period_s)}")
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
    from policylink.real.server import RemoteRobot
    from policylink.runtime.checks import cell_problems, limit_threads
    from policylink.runtime.executors import make_executor

    robot = RemoteRobot(cfg.robot)
    safety = robot.rearm()  # starting a run is the operator's explicit re-arm after an earlier watchdog trip
    spec = robot.env_spec
    period = 1.0 / float(cfg.hz or spec.control_frequency)
    policy = _load_deploy_policy(cfg, period, spec)
    limit_threads(cfg.threads)
    problems = cell_problems(cfg.policy, policy.spec, cfg.robot, spec, cfg.executor)
    if problems:
        raise IncompatibleSpecError(problems)
    line = (lambda st: print_status(st, period)) if status else None
    env = DeployEnv(robot, 1.0 / period, teleop=_teleop(cfg, spec.action.dim), stats=DeployStats(), status=line)
    executor = make_executor(policy, cfg.executor)
    recorder = open_deploy_recorder(cfg.record, spec) if cfg.record else None
    timeout = reply_timeout_s(safety)
    return run_deployment(
        robot, env, executor, cfg.episodes, seed=cfg.seed, recorder=recorder, reply_timeout_s=timeout, status=status
    )


def run_deployment(
    robot: Robot,
    env: DeployEnv,
    executor: Any,
    episodes: int,
    *,
    seed: int = 0,
    recorder: Any = None,
    reply_timeout_s: float | None = DEFAULT_REPLY_TIMEOUT_S,
    status: bool = False,
) -> DeployOutcome:
    """Run ``episodes`` episodes (reset seeds ``seed + i``) of ``executor`` on ``env``, a :class:`DeployEnv` of
    ``robot``, through the rollout loop, recording to ``recorder`` (from :func:`open_deploy_recorder`) when given.

    An :class:`~policylink.runtime.executors.AsyncExecutor` stops at a chunk request unanswered for more than
    ``reply_timeout_s`` seconds of ``env.clock`` (None = never): after the policy's last reply the robot executes
    the planned actions up to the next request, then at most ``reply_timeout_s`` more. Ctrl-C, a policy that
    stops answering, a dead policy or robot server and a tripped robot watchdog end the run with one message on
    stderr, also in the outcome's ``code`` and ``reason``. Whatever ends it, the robot is asked to hold, an
    unfinished episode is committed (success unknown, quality ``aborted``), and the executor, the recorder and
    the robot connection are closed.

    Raises:
        Exception: any other error (after the same clean-up).
    """
    from policylink.adapters.protocol import RemoteError
    from policylink.runtime.executors import AsyncExecutor
    from policylink.runtime.rollout import BorrowedEnv, make_vector_env, plan_episodes, rollout

    if reply_timeout_s is not None and isinstance(executor, AsyncExecutor):
        executor.watch_replies(reply_timeout_s, env.clock)
    vec = make_vector_env(lambda: BorrowedEnv(env), plan_episodes(episodes, seed, 1), env.env_spec.max_episode_steps)
    subs = [DeployRecorder(recorder)] if recorder is not None else []
    out = DeployOutcome(0, [], env.stats, env.period)

    def progress(r: Any) -> None:
        out.results.append(r)
        if status:
            line = env.stats.line(env.period)
            print(f"\repisode {r.index} seed {r.seed}: success={r.success} steps={r.n_steps} | {line}")

    try:
        rollout(vec, executor, episodes, subscribers=subs, progress=progress)
    except (KeyboardInterrupt, WatchdogTripped, TimeoutError, RemoteError, ConnectionError) as e:
        out.code, out.reason = _ending(e)
        print(f"\n{out.reason}", file=sys.stderr)
    finally:
        _hold_quietly(robot)
        executor.close()
        vec.close()
        if recorder is not None:
            recorder.close()
        robot.disconnect()
    return out


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


def _teleop(cfg: Any, action_dim: int) -> Teleoperator | None:
    """The human takeover device of ``cfg.teleop`` (``keyboard``: this terminal), or None.

    Raises:
        ValueError: an unknown ``teleop`` name."""
    if not cfg.teleop:
        return None
    if cfg.teleop != "keyboard":
        raise ValueError(f"teleop: expected 'keyboard' or None, received {cfg.teleop!r}")
    from policylink.real.teleop import KeyboardTeleop

    tele = KeyboardTeleop(action_dim, step=cfg.teleop_step)
    tele.start_terminal()
    print("keyboard takeover: space toggles, w/s a/d r/f move, x = e-stop", file=sys.stderr)
    return tele


def _hold_quietly(robot: Any) -> None:
    """Ask the robot to hold; a robot server that is gone already holds by its watchdog."""
    try:
        robot.stop()
    except Exception as e:  # noqa: BLE001 (the run is ending; the watchdog covers a dead link)
        print(f"hold request failed ({type(e).__name__}); the robot's watchdog holds it", file=sys.stderr)
