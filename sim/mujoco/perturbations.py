"""Switchable perturbations for robustness tests: action noise, actuation delay, a one-off object displacement
at a random mid-episode step, and external force pulses on the task's main object.

:class:`PerturbationConfig` is the frozen, serialisable switchboard; :class:`Perturber` is its per-env runtime
state, reset at every episode so nothing leaks between episodes.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from policylink.sim.mujoco.env_kwargs import checked_mapping


@dataclass(frozen=True)
class PerturbationConfig:
    """Which perturbations an env applies (all off by default).

    Attributes:
        action_noise_std: Gaussian noise std added to each action, as a fraction of that dimension's half
            range ``(high - low) / 2``; the noisy action is clipped to the limits.
        action_delay_steps: actions take effect this many control steps late (the first ones hold the robot).
        displacement: planar distance (m) by which the main object is moved once, in a random direction.
        displacement_steps: ``(first, last)`` control steps between which the displacement step is drawn.
        force: magnitude (N) of horizontal external force pulses on the main object (0 disables).
        force_probability: chance per control step that a pulse starts.
        force_duration_steps: control steps a pulse lasts.
    """

    action_noise_std: float = 0.0
    action_delay_steps: int = 0
    displacement: float = 0.0
    displacement_steps: tuple[int, int] = (10, 30)
    force: float = 0.0
    force_probability: float = 0.05
    force_duration_steps: int = 2

    def __post_init__(self) -> None:
        for name in ("action_noise_std", "displacement", "force", "force_probability"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)) or not math.isfinite(v):
                raise ValueError(f"PerturbationConfig.{name}: expected a finite number, received {v!r}")
        for name in ("action_delay_steps", "force_duration_steps"):
            if not _is_int(getattr(self, name)):
                raise ValueError(f"PerturbationConfig.{name}: expected an integer, received {getattr(self, name)!r}")
        steps = self.displacement_steps
        if not isinstance(steps, (tuple, list)) or not all(map(_is_int, steps)):
            raise ValueError(
                f"PerturbationConfig.displacement_steps: expected (first, last) integers, received {steps!r}"
            )
        object.__setattr__(self, "displacement_steps", tuple(int(s) for s in steps))
        checks = [
            ("action_noise_std", self.action_noise_std >= 0, "a value >= 0"),
            ("action_delay_steps", self.action_delay_steps >= 0, "an integer >= 0"),
            ("displacement", self.displacement >= 0, "a distance >= 0 m"),
            (
                "displacement_steps",
                len(self.displacement_steps) == 2 and 0 <= self.displacement_steps[0] <= self.displacement_steps[-1],
                "(first, last) with 0 <= first <= last",
            ),
            ("force", self.force >= 0, "a magnitude >= 0 N"),
            ("force_probability", 0 <= self.force_probability <= 1, "a probability in [0, 1]"),
            ("force_duration_steps", self.force_duration_steps >= 1, "an integer >= 1"),
        ]
        for name, ok, expected in checks:
            if not ok:
                raise ValueError(f"PerturbationConfig.{name}: expected {expected}, received {getattr(self, name)!r}")

    @classmethod
    def coerce(cls, value: PerturbationConfig | Mapping[str, Any] | None) -> PerturbationConfig | None:
        """A config from itself, a mapping of its fields (env kwargs from YAML/JSON, e.g. ``policylink eval
        --env_kwargs '{perturbation: {displacement: 0.03, force: 2.0}}'``), or None.

        Raises:
            ValueError: another type, an unknown field (the message lists the fields), or a field whose value is
                out of range or of the wrong type (``PerturbationConfig.<field>: expected ..., received ...``).
        """
        checked = checked_mapping(cls, value, "perturbation")
        return value if checked is None else cls(**checked)

    @property
    def active(self) -> bool:
        """True when at least one perturbation is switched on."""
        return bool(self.action_noise_std or self.action_delay_steps or self.displacement or self.force)


def perturbation_on(value: PerturbationConfig | Mapping[str, Any] | None) -> bool:
    """True when ``value`` (a config, a mapping of its fields, or None) switches a perturbation on; what a recorded
    episode's ``quality`` tag says. Raises ValueError as :meth:`PerturbationConfig.coerce`."""
    pert = PerturbationConfig.coerce(value)
    return pert is not None and pert.active


def _is_int(v: Any) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool)


class Perturber:
    """Runtime of a :class:`PerturbationConfig` for one env (delay queue, displacement step, force pulse).

    Args:
        config: the switchboard.
        low, high: action limits, float32 ``(A,)``.
        hold_action: the action that keeps the robot still, float32 ``(A,)`` (fills the delay queue).
    """

    def __init__(self, config: PerturbationConfig, low: np.ndarray, high: np.ndarray, hold_action: np.ndarray):
        self.config = config
        self.low, self.high = low, high
        self.half_range = (high - low) / 2.0
        self.hold_action = hold_action
        self._queue: deque[np.ndarray] = deque()
        self._displace_at = -1
        self._force_left = 0
        self._force = np.zeros(3)

    def reset(self, rng: np.random.Generator) -> None:
        """Start an episode: empty delay queue, draw the displacement step, no force pulse running."""
        c = self.config
        self._queue = deque([self.hold_action.copy() for _ in range(c.action_delay_steps)])
        self._displace_at = (
            int(rng.integers(c.displacement_steps[0], c.displacement_steps[1] + 1)) if c.displacement > 0 else -1
        )
        self._force_left = 0
        self._force = np.zeros(3)

    def action(self, action: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """The action actually executed this step: noisy, clipped, delayed. float32 ``(A,)``."""
        c = self.config
        if c.action_noise_std > 0:
            noise = rng.normal(0.0, c.action_noise_std, action.shape) * self.half_range
            action = np.clip(action + noise, self.low, self.high).astype(np.float32)
        if c.action_delay_steps > 0:
            self._queue.append(action)
            action = self._queue.popleft()
        return action

    def displacement(self, step: int, rng: np.random.Generator) -> np.ndarray | None:
        """The planar offset ``(2,)`` metres to apply to the main object at control step ``step``, else None."""
        if step != self._displace_at:
            return None
        angle = rng.uniform(-np.pi, np.pi)
        return self.config.displacement * np.array([np.cos(angle), np.sin(angle)])

    def force(self, rng: np.random.Generator) -> np.ndarray:
        """The external force ``(3,)`` N on the main object during this control step (zeros when none)."""
        c = self.config
        if c.force <= 0:
            return self._force
        if self._force_left <= 0 and rng.random() < c.force_probability:
            angle = rng.uniform(-np.pi, np.pi)
            self._force = c.force * np.array([np.cos(angle), np.sin(angle), 0.0])
            self._force_left = c.force_duration_steps
        if self._force_left <= 0:
            return np.zeros(3)
        self._force_left -= 1
        return self._force
