"""The safety layer between a policy and the motors: limits, per-period step bound, workspace box, invalid-action
rejection, a watchdog and a latching e-stop. :class:`SafetyLayer` is the pure logic (an injected clock, no
threads); :class:`~policylink.real.robot.SafeRobot` puts it in front of a robot's motors inside the robot server,
where no client can bypass it. The rules, in one page: ``real/README.md``.

Every command that reaches the motors has passed :meth:`SafetyLayer.command`: it is finite, of shape ``(A,)``,
within ``[low, high]``, and within ``max_step`` of its reference: the robot's *measured pose* in absolute pose
modes (``joint_position``, ``ee_position``; so a home, a reset or a motion the layer did not command moves the
reference with the robot), zero in delta modes (the command *is* the step), the previous command in other absolute
modes (``joint_torque``; zero after a reset). Its workspace target is inside the box. Anything else is clipped
(counted and logged) or, when it cannot be repaired (malformed, NaN/inf, no measured pose, watchdog tripped,
e-stop), replaced by the hold command. Timing rules follow diffusion_policy's real-robot loop (late commands are
never executed late).
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import numpy as np

from policylink.adapters.schema import ActionSpec, ControlMode

log = logging.getLogger(__name__)

DELTA_MODES = frozenset({ControlMode.EE_DELTA.value, ControlMode.JOINT_VELOCITY.value, ControlMode.EE_VELOCITY.value})
"""Control modes whose command is itself a displacement or rate per period (hold = zeros)."""

POSE_MODES = frozenset({ControlMode.JOINT_POSITION.value, ControlMode.EE_POSITION.value})
"""Absolute pose modes: the step bound is measured from the robot's measured pose, and a hold is that pose."""


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

    @property
    def needs_pose(self) -> bool:
        """True when the step bound is measured from the robot's pose (an absolute pose mode with ``max_step``)."""
        return self.max_step is not None and self.control_mode in POSE_MODES

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
        command: float32 ``(A,)`` sent to the motors, or None when nothing may be sent (watchdog ``stop``, or no
            hold command is known: the motors keep their own target).
        held: the action was rejected and replaced by the hold command.
        reasons: why it was changed: ``limit``, ``step``, ``workspace`` (clipped) or ``invalid``, ``no_pose``,
            ``unreachable``, ``estop``, ``tripped`` (held).
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
        invalid_kinds: ``Counter`` of malformed actions by kind (``ragged``, ``str``, ``nonfinite``, ...); each
            kind is logged once (the first time it is seen), counted every time.
        watchdog: the :class:`WatchdogState`.
        estopped: the e-stop latch; ``estop_reason`` says who pressed it.
        last_command: float32 ``(A,)`` last command the layer sent since the last :meth:`forget_reference` (None
            before the first): the step reference of ``joint_torque``, a fallback hold of pose modes.
    """

    config: SafetyConfig
    counts: Counter = field(default_factory=Counter)
    invalid_kinds: Counter = field(default_factory=Counter)
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
        self,
        action: Any,
        now: float,
        state: np.ndarray | None = None,
        hold: np.ndarray | None = None,
        pose: np.ndarray | None = None,
    ) -> SafetyReport:
        """Turn a client's action into the command for the motors. Never raises on a bad ``action``.

        Args:
            action: the proposed action, any value (a finite real ``(A,)`` vector is valid; anything else is
                held and counted under ``invalid_kinds``).
            now: the clock reading, seconds (monotonic); a valid action arms / refreshes the watchdog.
            state: float ``observation.state`` ``(D,)`` for a delta-mode workspace (None: workspace unchecked).
            hold: the driver's hold command ``(A,)`` or None (see :meth:`hold_command`).
            pose: the robot's measured pose ``(A,)`` in the action's units (pose modes): the step bound's
                reference and the hold. None in a pose mode with ``max_step``: the action is held (``no_pose``).

        Returns:
            A :class:`SafetyReport`; ``command`` satisfies every limit.
        """
        if self.estopped:
            return self._hold("estop", state, hold, pose)
        if self.watchdog is WatchdogState.TRIPPED:
            return self._hold("tripped", state, hold, pose)
        a, kind = parse_action(action, self.dim)
        if a is None:
            self._invalid(kind, action)
            return self._hold("invalid", state, hold, pose)
        self.watchdog, self._last_action_t = WatchdogState.ARMED, now
        box = self._box(self._reference(pose))
        if box is None:
            return self._hold("no_pose", state, hold, pose)
        lo, hi = box
        if np.any(lo > hi):  # the robot stands outside [low, high] by more than max_step: no command meets both
            log.warning("safety: the robot's pose is outside the limits by more than max_step; holding")
            return self._hold("unreachable", state, hold, pose)
        cmd, reasons = self._clamp(a, lo, hi, state)
        for r in reasons:
            self.counts[r] += 1
        if reasons:
            log.info("safety: action clipped (%s)", ", ".join(reasons))
        self.last_command = cmd
        return SafetyReport(cmd, False, reasons)

    def hold_command(
        self, state: np.ndarray | None = None, hold: np.ndarray | None = None, pose: np.ndarray | None = None
    ) -> np.ndarray | None:
        """The hold command ``(A,)``, or None when nothing should be sent (the motors keep their own target).

        Delta modes: ``hold`` if valid, else zeros. Pose modes: the measured ``pose`` (the robot stays where it is),
        else ``hold``, else the layer's last command since :meth:`forget_reference`, else None. Other absolute
        modes: ``hold``, else the last command, else None. The result is clipped to the limits and the step bound
        (never to the workspace: holding still is allowed outside it); None when that box is empty.
        """
        c = self.config
        candidates = [hold] if c.delta or c.control_mode not in POSE_MODES else [pose, hold]
        h = next((v for v in (parse_action(x, self.dim)[0] for x in candidates) if v is not None), None)
        if h is None:
            h = np.zeros(self.dim, np.float32) if c.delta else self.last_command
        box = self._box(self._reference(pose))
        if h is None or box is None or np.any(box[0] > box[1]):
            return None
        cmd = np.clip(h, *box).astype(np.float32)
        self.last_command = cmd
        return cmd

    def forget_reference(self) -> None:
        """Drop the last command (after a home, a reset or any motion the layer did not command): the next
        reference and hold come from the robot's measured pose (pose modes) or zero (other modes)."""
        self.last_command = None

    def _hold(
        self, reason: str, state: np.ndarray | None, hold: np.ndarray | None, pose: np.ndarray | None
    ) -> SafetyReport:
        self.counts[reason] += 1
        return SafetyReport(self.hold_command(state, hold, pose), True, (reason,))

    def _invalid(self, kind: str, action: Any) -> None:
        self.invalid_kinds[kind] += 1
        if self.invalid_kinds[kind] == 1:
            log.warning(
                "safety: malformed action held (%s: %s); further %s actions are counted, not logged",
                kind,
                _preview(action),
                kind,
            )

    def _reference(self, pose: Any) -> np.ndarray | None | bool:
        """The step bound's reference ``(A,)``; ``False`` when none is needed (no ``max_step``); None when a
        pose mode's measured pose is missing or malformed."""
        c = self.config
        if self.step is None:
            return False
        if c.delta:
            return np.zeros(self.dim, np.float32)
        if c.control_mode in POSE_MODES:
            return parse_action(pose, self.dim)[0]
        return np.zeros(self.dim, np.float32) if self.last_command is None else self.last_command

    def _box(self, ref: np.ndarray | None | bool) -> tuple[np.ndarray, np.ndarray] | None:
        """Limits intersected with ``ref +- max_step`` (may be empty); None without a needed reference."""
        if ref is None:
            return None
        if ref is False:
            return self.low.copy(), self.high.copy()
        return np.maximum(self.low, ref - self.step), np.minimum(self.high, ref + self.step)

    def _clamp(
        self, a: np.ndarray, lo: np.ndarray, hi: np.ndarray, state: np.ndarray | None
    ) -> tuple[np.ndarray, tuple[str, ...]]:
        """Limits and step bound (``lo``, ``hi``), then workspace; each only narrows the box, so the result meets
        all three (a target outside the workspace moves back toward it within the step bound)."""
        ws_lo, ws_hi = self._workspace_box(state)
        if ws_lo is not None:
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
        """JSON-ready status: ``watchdog``, ``estopped``, ``estop_reason``, the ``counts`` and ``invalid_kinds``."""
        return {
            "watchdog": self.watchdog.value,
            "estopped": self.estopped,
            "estop_reason": self.estop_reason,
            "counts": dict(self.counts),
            "invalid_kinds": dict(self.invalid_kinds),
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


_F32_MAX = float(np.finfo(np.float32).max)
_REAL_SCALARS = (int, float, np.integer, np.floating)


def parse_action(action: Any, dim: int) -> tuple[np.ndarray | None, str]:
    """Check an action strictly, never raising: ``(float32 (dim,), "")`` for a finite real vector, else
    ``(None, kind)``.

    Valid: a 1-D ``np.ndarray`` of integer/float dtype, or a flat list/tuple of real numbers (Python or numpy; not
    bool), of length ``dim``, every value finite and within float32's range. ``kind`` names what was wrong:
    ``none``, ``str``, ``bytes``, ``mapping``, ``type:<name>`` (any other object), ``ragged`` (nested
    sequences), ``bool``, ``complex``, ``non_numeric`` (an element or dtype that is no real number), ``shape``
    (wrong length or not 1-D), ``overflow`` (beyond float32), ``nonfinite`` (NaN/inf).
    """
    if action is None:
        return None, "none"
    if isinstance(action, (str, bytes, bytearray, memoryview)):
        return None, "str" if isinstance(action, str) else "bytes"
    if isinstance(action, Mapping):
        return None, "mapping"
    if isinstance(action, np.ndarray):
        kind = {"b": "bool", "c": "complex"}.get(action.dtype.kind, "" if action.dtype.kind in "iuf" else "non_numeric")
        if kind:
            return None, kind
        if action.shape != (dim,):
            return None, "shape"
        try:
            values = action.astype(np.float64)
        except OverflowError:  # pragma: no cover - integer dtypes always fit float64
            return None, "overflow"
    elif isinstance(action, (list, tuple)):
        kind = next((k for k in map(_element_kind, action) if k), "")
        if kind:
            return None, kind
        if len(action) != dim:
            return None, "shape"
        try:
            values = np.array([float(x) for x in action], np.float64)
        except OverflowError:  # a Python int beyond float64
            return None, "overflow"
    else:
        return None, f"type:{type(action).__name__}"
    if not np.all(np.isfinite(values)):
        return None, "nonfinite"
    if np.any(np.abs(values) > _F32_MAX):
        return None, "overflow"
    return values.astype(np.float32), ""


def _element_kind(x: Any) -> str:
    """'' for a real number, else why not (see :func:`parse_action`)."""
    if isinstance(x, (bool, np.bool_)):
        return "bool"
    if isinstance(x, _REAL_SCALARS):
        return ""
    if isinstance(x, (complex, np.complexfloating)):
        return "complex"
    if isinstance(x, (list, tuple, np.ndarray)):
        return "ragged"
    return "non_numeric"


def _preview(action: Any, limit: int = 60) -> str:
    """A short, never-raising description of a value for a log line."""
    try:
        text = repr(action)
    except Exception:  # a broken __repr__ must not take the safety layer down
        text = f"<{type(action).__name__}>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


__all__ = [
    "DELTA_MODES",
    "POSE_MODES",
    "SafetyConfig",
    "SafetyConfigError",
    "SafetyLayer",
    "SafetyReport",
    "TimeoutAction",
    "WatchdogState",
    "parse_action",
]
