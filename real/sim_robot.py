"""The sim-as-real robot: any of our gymnasium tasks behind the :class:`~policylink.real.robot.Robot` protocol,
advanced by its own clock at the task's control frequency (not by the client), with configurable observation
latency, actuation latency and tick jitter. It tests the whole deployment path -- server, safety layer, pacing,
late actions -- on any laptop. ``real`` never imports ``sim``: the caller builds the env (``policylink robot
--sim <task>`` does).

Each tick (absolute deadlines ``t0 + k / f`` plus a uniform jitter) applies the newest action whose actuation
time has come, or the hold command when none arrived since the last tick (a late or dropped action means the
robot stood still that period), then steps the env once. The episode ends (ticks stop) when the env terminates
or truncates, or when its physics diverged (the task env's ``physics_fault``, the one check of
``sim/mujoco/gap_runtime.py``, or a gapped env's own ``info["fault"]``: the robot faults, the episode ends as a
failure and the diverged observation is never served, so a recording holds no teleported objects);
:meth:`SimRobot.reset` starts the next one.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

import numpy as np

from policylink.adapters.env import EnvAdapter
from policylink.adapters.schema import FAULT_INFO, REALITY_GAP_INFO
from policylink.real.robot import Clock, Robot
from policylink.real.safety import DELTA_MODES

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SimTiming:
    """Timing imperfections of the sim-as-real robot, seconds.

    Attributes:
        observation_latency_s: an observation read at ``t`` shows the state at ``t - observation_latency_s``.
        actuation_latency_s: an action received at ``t`` can act from the first tick after ``t + actuation_latency_s``.
        jitter_s: each tick fires up to this much after its deadline (uniform, seeded).
        seed: seed of the jitter.
        time_scale: wall-clock speed of the simulated world: ticks come every ``1 / (f * time_scale)`` s for a
            task of control frequency ``f`` Hz (0.5 = half speed, for a slow or loaded machine; the deployment
            loop then runs at ``--hz f * time_scale``).

    Raises:
        ValueError: a negative or non-finite value, or ``time_scale <= 0`` (names the field).
    """

    observation_latency_s: float = 0.0
    actuation_latency_s: float = 0.0
    jitter_s: float = 0.0
    seed: int = 0
    time_scale: float = 1.0

    def __post_init__(self) -> None:
        if not (np.isfinite(self.time_scale) and self.time_scale > 0):
            raise ValueError(f"time_scale: expected a finite factor > 0, received {self.time_scale}")
        for name in ("observation_latency_s", "actuation_latency_s", "jitter_s"):
            v = float(getattr(self, name))
            if not (np.isfinite(v) and v >= 0):
                raise ValueError(f"{name}: expected a finite number of seconds >= 0, received {v}")

    @classmethod
    def from_ms(
        cls,
        observation_latency_ms: float = 0.0,
        actuation_latency_ms: float = 0.0,
        jitter_ms: float = 0.0,
        seed: int = 0,
        time_scale: float = 1.0,
    ) -> SimTiming:
        """The timing from milliseconds (the units of ``policylink robot``'s flags and of a reality gap's
        ``timing`` section). Raises ValueError as the constructor (the field names end in ``_s``)."""
        return cls(observation_latency_ms / 1e3, actuation_latency_ms / 1e3, jitter_ms / 1e3, seed, time_scale)


TIMING_MS_FIELDS = ("observation_latency_ms", "actuation_latency_ms", "jitter_ms")


def gap_timing_ms(env: Any) -> dict[str, float] | None:
    """The ``timing`` section of a task env's reality gap (``env.unwrapped.reality_gap``, set by the MuJoCo tasks'
    ``gap`` kwarg: :class:`policylink.sim.mujoco.gap.TimingGap`) as ``{field: ms}`` for :meth:`SimTiming.from_ms`;
    None when the env has no gap. Read by attribute, so ``real`` needs no import of ``sim``."""
    gap = getattr(getattr(env, "unwrapped", env), "reality_gap", None)
    if gap is None:
        return None
    return {k: float(getattr(gap.timing, k)) for k in TIMING_MS_FIELDS}


class SimRobot(Robot):
    """A gymnasium task (an :class:`EnvAdapter` with ``env_spec``) run in real time as a robot.

    Args:
        env: the task env (owned: closed by :meth:`disconnect`).
        timing: :class:`SimTiming`.
        clock: monotonic clock, seconds.
        realtime: start the tick thread (False: the caller calls :meth:`tick` itself, for tests).
        max_speed: the linear speed limit of the env's ``physics_fault(max_speed)`` check, m/s (None: the env's
            default, 10); a step past it ends the episode as a failure, ``episode_info`` then carries ``fault`` (the
            message). A gapped MuJoCo task checks every step at its default itself (``info["fault"]``); an env
            without ``physics_fault`` (not MuJoCo) is never judged.

    Attributes:
        ticks, holds, overwritten: steps taken in this episode, of which with the hold command, and actions
            replaced by a newer one before any tick used them.

    A task built with a reality gap (``policylink robot --sim push --gap worn_gantry``) applies its dynamics and
    sensing inside the env; :meth:`reset`'s info and :meth:`episode_info` carry the episode's drawn parameters
    as JSON under ``"reality_gap"``, so a deployment recorder keeps them with the episode.
    """

    def __init__(
        self,
        env: EnvAdapter,
        timing: SimTiming | None = None,
        *,
        clock: Clock = time.monotonic,
        realtime: bool = True,
        max_speed: float | None = None,
    ):
        self.env, self.timing, self.clock = env, timing or SimTiming(), clock
        self.max_speed = None if max_speed is None else float(max_speed)
        self._check = getattr(getattr(env, "unwrapped", env), "physics_fault", None)
        self.env_spec = env.env_spec
        self.period = 1.0 / (float(self.env_spec.control_frequency) * self.timing.time_scale)
        self._rng = np.random.default_rng(self.timing.seed)
        self._lock = threading.Lock()
        self._pending: deque[tuple[float, np.ndarray]] = deque()
        self._history: deque[tuple[float, dict[str, Any]]] = deque(maxlen=256)
        self._last_applied = np.zeros(self.env_spec.action.dim, np.float32)
        self._active = False
        self._info: dict[str, Any] = {"is_success": False, "terminated": False, "truncated": False}
        self._gap_json: str | None = None
        self.ticks = self.holds = self.overwritten = 0
        self._t0 = clock()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread = (
            threading.Thread(target=self._run, daemon=True, name="policylink-sim-robot") if realtime else None
        )
        if self._thread is not None:
            self._thread.start()

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
        """Start an episode from ``seed``; ticks resume one period from now."""
        with self._lock:
            obs, info = self.env.reset(seed=seed, options=options)
            now = self.clock()
            self._t0, self._active = now, True
            self._pending.clear()
            self._history.clear()
            self._history.append((now, obs))
            self.ticks = self.holds = self.overwritten = 0
            self._last_applied = self._hold()
            self._info = {"is_success": bool(info.get("is_success", False)), "terminated": False, "truncated": False}
            self._gap_json = info.get(REALITY_GAP_INFO)
        self._wake.set()
        return obs, dict(info)

    def get_observation(self) -> dict[str, Any]:
        """The newest observation at least ``observation_latency_s`` old (the oldest kept when none is).

        Raises:
            RuntimeError: before the first :meth:`reset`."""
        with self._lock:
            if not self._history:
                raise RuntimeError("get_observation: the sim-as-real robot has no episode yet; call reset first")
            cutoff = self.clock() - self.timing.observation_latency_s
            for t, obs in reversed(self._history):
                if t <= cutoff:
                    return obs
            return self._history[0][1]

    def send_action(self, action: np.ndarray) -> np.ndarray:
        """Queue float32 ``(A,)`` to act from ``now + actuation_latency_s``; returns it."""
        a = np.asarray(action, np.float32).copy()
        with self._lock:
            self._pending.append((self.clock() + self.timing.actuation_latency_s, a))
        return a

    def hold_action(self) -> np.ndarray:
        """Zeros in delta control modes, else the last applied command."""
        return self._hold()

    def episode_info(self) -> dict[str, Any]:
        """``is_success``, ``terminated``, ``truncated`` of the episode; ``ticks``, ``holds``, ``overwritten``; and
        ``reality_gap`` (JSON) when the task has a gap."""
        with self._lock:
            gap = {} if self._gap_json is None else {REALITY_GAP_INFO: self._gap_json}
            return {**self._info, "ticks": self.ticks, "holds": self.holds, "overwritten": self.overwritten, **gap}

    def tick(self) -> bool:
        """Apply the newest due action (or hold) and step the env once; False when no episode is running."""
        with self._lock:
            if not self._active:
                return False
            now, due = self.clock(), []
            while self._pending and self._pending[0][0] <= now:
                due.append(self._pending.popleft()[1])
            if due:
                action = due[-1]
                self.overwritten += len(due) - 1
            else:
                action = self._hold()
                self.holds += 1
            self._last_applied = action
            obs, _, terminated, truncated, info = self.env.step(action)
            self.ticks += 1
            fault = info.get(FAULT_INFO) or self._physics_fault()
            if fault is not None:  # the robot faults: end the episode as a failure, never serve the diverged obs
                log.warning("sim-as-real robot: %s; episode ended as a failure", fault)
                self._info = {"is_success": False, "terminated": True, "truncated": False, FAULT_INFO: fault}
                self._active = False
                return True
            self._history.append((self.clock(), obs))
            done = bool(terminated or truncated)
            self._info = {
                "is_success": bool(info.get("is_success", False)) or self._info["is_success"],
                "terminated": bool(terminated),
                "truncated": bool(truncated),
            }
            self._active = not done
            return True

    def _physics_fault(self) -> str | None:
        """The env's diverged-physics check (its ``physics_fault`` method), None when it has none."""
        if self._check is None:
            return None
        return self._check() if self.max_speed is None else self._check(self.max_speed)

    def disconnect(self) -> None:
        """Stop the tick thread and close the env."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=2.0)
        self.env.close()

    def _hold(self) -> np.ndarray:
        if self.env_spec.action.control_mode.value in DELTA_MODES:
            return np.zeros(self.env_spec.action.dim, np.float32)
        return self._last_applied.copy()

    def _run(self) -> None:
        """Tick at ``t0 + k * period`` (+ jitter) while an episode runs; sleep until a reset otherwise."""
        while not self._stop.is_set():
            with self._lock:
                active, t0, k = self._active, self._t0, self.ticks
            if not active:
                self._wake.wait(0.05)
                self._wake.clear()
                continue
            deadline = t0 + (k + 1) * self.period + float(self._rng.uniform(0.0, self.timing.jitter_s))
            delay = deadline - self.clock()
            if delay > 0 and self._wake.wait(delay):
                self._wake.clear()
                continue  # a reset moved the clock: recompute the deadline
            try:
                self.tick()
            except Exception:  # the env broke: stop this episode, keep the process alive
                log.exception("sim-as-real robot: env step failed; episode stopped")
                with self._lock:
                    self._active = False


__all__ = ["TIMING_MS_FIELDS", "SimRobot", "SimTiming", "gap_timing_ms"]
