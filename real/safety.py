"""The safety layer between a policy and the motors: limits, per-period step bound, workspace box, invalid-action
rejection, a watchdog and a latching e-stop. :class:`SafetyLayer` is the pure logic (an injected clock, no
threads); :class:`~policylink.real.robot.SafeRobot` puts it in front of a robot's motors inside the robot server,
where no client can bypass it.

Every command that reaches the motors has passed :meth:`SafetyLayer.command`: it is finite, of shape ``(A,)``,
within ``[low, high]``, within ``max_step`` of the previous command (absolute control modes) or of zero (delta
modes, where the command *is* the step), and its workspace target is inside the box. Anything else is clipped
(counted and logged) or, when it cannot be repaired (NaN/inf, wrong shape, watchdog tripped, e-stop), replaced by
the hold command. Timing rules follow diffusion_policy's real-robot loop (late commands are never executed late).
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import numpy as np

from policylink.adapters.schema import ActionSpec, ControlMode

log = logging.getLogger(__name__)

DELTA_MODES = frozenset({ControlMode.EE_DELTA.value, ControlMode.JOINT_VELOCITY.value, ControlMode.EE_VELOCITY.value})
"""Control modes whose command is itself a displacement or rate per period (hold = zeros)."""


class SafetyConfigError(ValueError):
    """A safety configuration that cannot be honoured; the message names the field, expected and received value."""


class WatchdogState(StrEnum):
    """``unarmed``: no action yet this session (or after :meth:`SafetyLayer.rearm`); ``armed``: actions are
    arriving; ``tripped``: no fresh action within ``watchdog_s``; commands are refused until re-armed."""

    UNARMED = "unarmed"
    ARMED = "armed"
    TRIPPED = "tripped"


class TimeoutAction(StrEnum):
    """What the watchdog does when it trips: ``hold`` (send the hold command) or ``stop`` (``Robot.stop()``)."""

    HOLD = "hold"
    STOP = "stop"


@dataclass(frozen=True)
class SafetyConfig:
    """Limits and timing of the safety layer, in the ActionSpec's units.

    Attributes:
        low, high: per-dimension command limits ``(A,)`` (joint-position limits for ``joint_position``; per-period
            displacement limits for ``ee_delta``).
        control_mode: a :class:`~policylink.adapters.schema.ControlMode` value; delta modes bound the command
            itself by ``max_step``, absolute modes bound its change from the previous command.
        max_step: largest change per control period ``(A,)`` (or one float for every dimension); None = off.
        workspace_low, workspace_high: a box ``(K,)`` the commanded target of dimensions ``workspace_action``
            must stay in (absolute modes: the command; delta modes: ``state[workspace_state] + command``).
        workspace_action, workspace_state: the ``K`` action dimensions and ``observation.state`` indices of the
            workspace box.
        watchdog_s: hold (or stop) when no fresh action arrives within this many seconds once armed; None = off.
        on_timeout: a :class:`TimeoutAction` value.

    Raises:
        SafetyConfigError: a limit is NaN/inf, ``low >= high``, ``max_step <= 0``, ``watchdog_s <= 0``, lengths
            differ, or an unknown ``control_mode``/``on_timeout`` (the message names the field).
    """

    low: tuple[float, ...]
    high: tuple[float, ...]
    control_mode: str = ControlMode.JOINT_POSITION.value
    max_step: tuple[float, ...] | float | None = None
    workspace_low: tuple[float, ...] | None = None
    workspace_high: tuple[float, ...] | None = None
    workspace_action: tuple[int, ...] = ()
    workspace_state: tuple[int, ...] = ()
    watchdog_s: float | None = 0.5
    on_timeout: str = TimeoutAction.HOLD.value

    def __post_init__(self) -> None:
        low, high = _vector("low", self.low), _vector("high", self.high)
        if low.shape != high.shape:
            raise SafetyConfigError(f"high: expected {low.size} values (as low), received {high.size}")
        bad = np.flatnonzero(~(low < high))
        if bad.size:
            i = int(bad[0])
            raise SafetyConfigError(f"low[{i}]/high[{i}]: expected low < high, received {low[i]} >= {high[i]}")
        _member("control_mode", self.control_mode, ControlMode)
        _member("on_timeout", self.on_timeout, TimeoutAction)
        if self.max_step is not None:
            step = _vector("max_step", self.max_step, low.size)
            if np.any(step <= 0):
                raise SafetyConfigError(f"max_step: expected > 0 per dimension, received {step.tolist()}")
        if self.watchdog_s is not None and not (math.isfinite(self.watchdog_s) and self.watchdog_s > 0):
            raise SafetyConfigError(
                f"watchdog_s: expected a finite number of seconds > 0 or None, received {self.watchdog_s}"
            )
        self._check_workspace(low.size)

    def _check_workspace(self, a_dim: int) -> None:
        if self.workspace_low is None and self.workspace_high is None:
            return
        if self.workspace_low is None or self.workspace_high is None:
            raise SafetyConfigError("workspace_low/workspace_high: expected both or neither, received one")
        wl, wh = _vector("workspace_low", self.workspace_low), _vector("workspace_high", self.workspace_high)
        k = len(self.workspace_action)
        if not (wl.size == wh.size == k) or k == 0:
            raise SafetyConfigError(
                f"workspace_action: expected {wl.size} action dims (as workspace_low/high), received {k}"
            )
        if any(not 0 <= i < a_dim for i in self.workspace_action):
            raise SafetyConfigError(
                f"workspace_action: expected indices in 0..{a_dim - 1}, received {self.workspace_action}"
            )
        if self.delta and len(self.workspace_state) != k:
            raise SafetyConfigError(
                f"workspace_state: expected {k} state indices for a delta control mode, "
                f"received {len(self.workspace_state)}"
            )
        bad = np.flatnonzero(~(wl < wh))
        if bad.size:
            i = int(bad[0])
            raise SafetyConfigError(
                f"workspace_low[{i}]/workspace_high[{i}]: expected low < high, received {wl[i]} >= {wh[i]}"
            )

    @property
    def delta(self) -> bool:
        """True for delta/rate control modes (the command is the step)."""
        return self.control_mode in DELTA_MODES

    @classmethod
    def from_action_spec(cls, spec: ActionSpec, **overrides: Any) -> SafetyConfig:
        """Limits and control mode from an :class:`ActionSpec` (``overrides`` set any other field).

        Raises:
            SafetyConfigError: the spec has no finite limits, or an override is invalid.
        """
        fields = {"low": tuple(map(float, spec.low_array)), "high": tuple(map(float, spec.high_array))}
        fields["control_mode"] = ControlMode(spec.control_mode).value
        fields.update(overrides)
        return cls(**fields)


@dataclass
class SafetyReport:
    """What :meth:`SafetyLayer.command` did to one action.

    Attributes:
        command: float32 ``(A,)`` sent to the motors, or None when nothing may be sent (watchdog ``stop``).
        held: the action was rejected and replaced by the hold command.
        reasons: why it was changed: ``limit``, ``step``, ``workspace`` (clipped) or ``invalid``, ``estop``,
            ``tripped`` (held).
    """

    command: np.ndarray | None
    held: bool = False
    reasons: tuple[str, ...] = ()


@dataclass
class SafetyLayer:
    """The safety state machine of one robot session (not thread-safe: :class:`SafeRobot` holds a lock).

    Args:
        config: the :class:`SafetyConfig`.

    Attributes:
        counts: ``Counter`` of every clip / hold reason since construction.
        watchdog: the :class:`WatchdogState`.
        estopped: the e-stop latch; ``estop_reason`` says who pressed it.
        last_command: float32 ``(A,)`` last command sent to the motors (None before the first).
    """

    config: SafetyConfig
    counts: Counter = field(default_factory=Counter)
    watchdog: WatchdogState = WatchdogState.UNARMED
    estopped: bool = False
    estop_reason: str = ""
    last_command: np.ndarray | None = None
    _last_action_t: float = -math.inf

    def __post_init__(self) -> None:
        c = self.config
        self.low, self.high = np.asarray(c.low, np.float32), np.asarray(c.high, np.float32)
        self.step = None if c.max_step is None else _vector("max_step", c.max_step, self.low.size).astype(np.float32)
        self.dim = self.low.size

    # -- commands ----------------------------------------------------------------------------------------------
    def command(
        self, action: Any, now: float, state: np.ndarray | None = None, hold: np.ndarray | None = None
    ) -> SafetyReport:
        """Turn a client's action into the command for the motors.

        Args:
            action: the proposed action, any array-like (``(A,)`` float expected).
            now: the clock reading, seconds (monotonic); arms / refreshes the watchdog.
            state: float ``observation.state`` ``(D,)`` for a delta-mode workspace (None: workspace unchecked).
            hold: the robot's hold command ``(A,)`` (None: zeros in delta modes, else the last command); in
                absolute modes also the step bound's reference before the first command (the robot's pose).

        Returns:
            A :class:`SafetyReport`; ``command`` satisfies every limit (hold commands are clamped as well).
        """
        if self.estopped:
            return self._hold("estop", state, hold)
        if self.watchdog is WatchdogState.TRIPPED:
            return self._hold("tripped", state, hold)
        a = _finite_vector(action, self.dim)
        self.watchdog, self._last_action_t = WatchdogState.ARMED, now
        if a is None:
            log.warning("safety: invalid action %s held", _describe(action))
            return self._hold("invalid", state, hold)
        if self.last_command is None and not self.config.delta and hold is not None:
            h = _finite_vector(hold, self.dim)  # the first step is bounded from the robot's pose when it reports one
            if h is not None:
                self.last_command = np.clip(h, self.low, self.high).astype(np.float32)
        cmd, reasons = self._clamp(a, state)
        for r in reasons:
            self.counts[r] += 1
        if reasons:
            log.info("safety: action clipped (%s)", ", ".join(reasons))
        self.last_command = cmd
        return SafetyReport(cmd, False, reasons)

    def hold_command(self, state: np.ndarray | None = None, hold: np.ndarray | None = None) -> np.ndarray | None:
        """The clamped hold command ``(A,)``: ``hold`` if given, else zeros (delta modes) or the last command
        (absolute modes; None before any command: the motors keep their own target)."""
        if hold is None:
            hold = np.zeros(self.dim, np.float32) if self.config.delta else self.last_command
        if hold is None:
            return None
        h = _finite_vector(hold, self.dim)
        if h is None:  # a broken hold from the driver: zeros / the last command
            h = np.zeros(self.dim, np.float32) if self.config.delta or self.last_command is None else self.last_command
        cmd, _ = self._clamp(h, state)
        self.last_command = cmd
        return cmd

    def _hold(self, reason: str, state: np.ndarray | None, hold: np.ndarray | None) -> SafetyReport:
        self.counts[reason] += 1
        return SafetyReport(self.hold_command(state, hold), True, (reason,))

    def _clamp(self, a: np.ndarray, state: np.ndarray | None) -> tuple[np.ndarray, tuple[str, ...]]:
        """Limits, then step bound, then workspace; each only narrows the box, so the result meets all three."""
        lo, hi = self.low.copy(), self.high.copy()
        if self.step is not None:
            ref = np.zeros(self.dim, np.float32) if self.config.delta else self.last_command
            if ref is not None:
                lo, hi = np.maximum(lo, ref - self.step), np.minimum(hi, ref + self.step)
        ws_lo, ws_hi = self._workspace_box(state)
        if ws_lo is not None:  # clipped into the limit/step box: outside the workspace, move back within bounds
            idx = list(self.config.workspace_action)
            lo[idx], hi[idx] = np.clip(ws_lo, lo[idx], hi[idx]), np.clip(ws_hi, lo[idx], hi[idx])
        cmd = np.clip(a, lo, hi).astype(np.float32)
        reasons = []
        if np.any((a < self.low) | (a > self.high)):
            reasons.append("limit")
        changed = cmd != np.clip(a, self.low, self.high)
        if changed.any():
            reasons.append(
                "workspace" if ws_lo is not None and changed[list(self.config.workspace_action)].any() else "step"
            )
        return cmd, tuple(reasons)

    def _workspace_box(self, state: np.ndarray | None) -> tuple[np.ndarray | None, np.ndarray | None]:
        c = self.config
        if c.workspace_low is None:
            return None, None
        wl, wh = np.asarray(c.workspace_low, np.float32), np.asarray(c.workspace_high, np.float32)
        if not c.delta:
            return wl, wh
        if state is None:
            return None, None
        pos = np.asarray(state, np.float32)[list(c.workspace_state)]
        return wl - pos, wh - pos

    # -- watchdog and e-stop -----------------------------------------------------------------------------------
    def check_watchdog(self, now: float) -> bool:
        """Trip the watchdog when armed and no action arrived within ``watchdog_s`` of ``now``; True when it
        tripped on this call (the caller then holds or stops the robot)."""
        t = self.config.watchdog_s
        if t is None or self.watchdog is not WatchdogState.ARMED or now - self._last_action_t <= t:
            return False
        self.watchdog = WatchdogState.TRIPPED
        self.counts["watchdog"] += 1
        log.warning(
            "safety: watchdog tripped: no action for %.0f ms (limit %.0f ms)",
            1e3 * (now - self._last_action_t),
            1e3 * t,
        )
        return True

    def rearm(self) -> None:
        """Clear a tripped watchdog; it arms again at the next action."""
        self.watchdog = WatchdogState.UNARMED

    def estop(self, reason: str = "") -> None:
        """Latch the e-stop: every command is held until :meth:`reset_estop`."""
        self.estopped, self.estop_reason = True, reason or "e-stop"
        log.warning("safety: E-STOP (%s)", self.estop_reason)

    def reset_estop(self) -> None:
        """Release the e-stop latch; the watchdog restarts unarmed."""
        self.estopped, self.estop_reason = False, ""
        self.watchdog = WatchdogState.UNARMED

    def status(self) -> dict[str, Any]:
        """JSON-ready status: ``watchdog``, ``estopped``, ``estop_reason`` and the ``counts``."""
        return {
            "watchdog": self.watchdog.value,
            "estopped": self.estopped,
            "estop_reason": self.estop_reason,
            "counts": dict(self.counts),
        }


def _vector(name: str, value: Any, size: int | None = None) -> np.ndarray:
    """``value`` as a finite float64 vector (a scalar broadcast to ``size``)."""
    try:
        v = np.asarray(value, np.float64)
    except (TypeError, ValueError):
        raise SafetyConfigError(f"{name}: expected numbers, received {value!r}") from None
    if v.ndim == 0 and size is not None:
        v = np.full(size, float(v))
    if v.ndim != 1 or v.size == 0 or (size is not None and v.size != size):
        want = f"{size} values" if size is not None else "a non-empty vector"
        raise SafetyConfigError(f"{name}: expected {want}, received {value!r}")
    if not np.all(np.isfinite(v)):
        raise SafetyConfigError(f"{name}: expected finite values, received {v.tolist()}")
    return v


def _member(name: str, value: Any, enum: type[StrEnum]) -> None:
    try:
        enum(value)
    except ValueError:
        raise SafetyConfigError(f"{name}: expected one of {[m.value for m in enum]}, received {value!r}") from None


def _finite_vector(action: Any, dim: int) -> np.ndarray | None:
    """float32 ``(dim,)`` when ``action`` is a finite numeric vector of that shape, else None."""
    try:
        a = np.asarray(action, dtype=np.float32)
    except (TypeError, ValueError, OverflowError):
        return None
    if a.shape != (dim,) or not np.all(np.isfinite(a)):
        return None
    return a


def _describe(action: Any) -> str:
    a = np.asarray(action) if isinstance(action, (np.ndarray, Sequence)) else action
    return f"shape {a.shape}" if isinstance(a, np.ndarray) else type(action).__name__


__all__ = [
    "DELTA_MODES",
    "SafetyConfig",
    "SafetyConfigError",
    "SafetyLayer",
    "SafetyReport",
    "TimeoutAction",
    "WatchdogState",
]
