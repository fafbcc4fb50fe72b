"""Quality levels of the scripted experts: ``expert`` acts as scripted; ``noisy`` and ``poor`` add Gaussian
action noise and random-action lapses, which gives the mixed-quality datasets offline-RL style methods need.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

QUALITIES = ("expert", "noisy", "poor")


class ScriptedPolicy(Protocol):
    """A deterministic scripted controller: ``reset(seed)`` then ``act(obs, env) -> float32 (A,)``.

    ``aim_offset`` (m, ``(3,)``) is added to the point it steers the object or end effector to (zeros for the
    expert; a per-episode random offset for degraded qualities).
    """

    aim_offset: np.ndarray

    def reset(self, seed: int | None = None) -> None: ...

    def act(self, obs: dict[str, Any], env: Any) -> np.ndarray: ...


@dataclass(frozen=True)
class Degradation:
    """How a quality level spoils the scripted actions.

    Attributes:
        action_noise: std of Gaussian noise on every action dimension, as a fraction of its half range.
        lapse_probability: chance per step that a lapse starts (uniformly random actions).
        lapse_steps: ``(min, max)`` length of a lapse, control steps.
        aim_error_m: length of a per-episode planar offset (random direction) of the aimed goal point, m.
    """

    action_noise: float
    lapse_probability: float
    lapse_steps: tuple[int, int] = (2, 6)
    aim_error_m: float = 0.0


DEGRADATIONS = {
    "expert": Degradation(action_noise=0.0, lapse_probability=0.0),
    "noisy": Degradation(action_noise=0.3, lapse_probability=0.03),
    "poor": Degradation(action_noise=0.8, lapse_probability=0.1, lapse_steps=(4, 12)),
}
"""Per-quality degradations; measured success rates are in ``benchmarks/results/expert_success.md``."""


class DegradedExpert:
    """A scripted policy acted out at a given quality level.

    Args:
        policy: the scripted controller.
        low, high: action limits, float32 ``(A,)`` (noisy actions are clipped to them).
        quality: ``"expert"``, ``"noisy"`` or ``"poor"``.
        seed: seeds the noise generator (``reset(seed)`` reseeds it).
        degradations: quality -> :class:`Degradation` table (default :data:`DEGRADATIONS`).

    Raises:
        ValueError: unknown ``quality``.
    """

    def __init__(
        self,
        policy: ScriptedPolicy,
        low: np.ndarray,
        high: np.ndarray,
        quality: str = "expert",
        seed: int | None = None,
        degradations: dict[str, Degradation] | None = None,
    ):
        table = degradations if degradations is not None else DEGRADATIONS
        if quality not in table:
            raise ValueError(f"quality: expected one of {QUALITIES}, received {quality!r}")
        self.policy, self.quality, self.degradation = policy, quality, table[quality]
        self.low, self.high = np.asarray(low, np.float32), np.asarray(high, np.float32)
        self.rng = np.random.default_rng(seed)
        self._lapse_left = 0
        self._lapse_action = np.zeros_like(self.low)

    def reset(self, seed: int | None = None) -> None:
        """Start an episode: reset the scripted controller; a given ``seed`` reseeds the noise."""
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self.policy.reset(seed)
        self._lapse_left = 0
        angle = self.rng.uniform(-np.pi, np.pi)
        self.policy.aim_offset = self.degradation.aim_error_m * np.array([np.cos(angle), np.sin(angle), 0.0])

    def act(self, obs: dict[str, Any], env: Any) -> np.ndarray:
        """The action for ``obs``: float32 ``(A,)`` within the limits."""
        action = np.asarray(self.policy.act(obs, env), dtype=np.float32)
        d = self.degradation
        if d.action_noise == 0.0 and d.lapse_probability == 0.0:
            return action
        if self._lapse_left == 0 and self.rng.random() < d.lapse_probability:
            self._lapse_left = int(self.rng.integers(d.lapse_steps[0], d.lapse_steps[1] + 1))
            self._lapse_action = self.rng.uniform(self.low, self.high).astype(np.float32)
        if self._lapse_left > 0:
            self._lapse_left -= 1
            return self._lapse_action.copy()
        noise = self.rng.normal(0.0, d.action_noise, action.shape) * (self.high - self.low) / 2.0
        return np.clip(action + noise, self.low, self.high).astype(np.float32)


def degrade(
    policy: ScriptedPolicy, env: Any, quality: str, seed: int | None, degradations: dict[str, Degradation] | None = None
) -> DegradedExpert:
    """Wrap ``policy`` for ``env`` (reads the action limits from ``env.unwrapped.env_spec``) at ``quality``."""
    spec = env.unwrapped.env_spec.action
    return DegradedExpert(policy, spec.low_array, spec.high_array, quality, seed, degradations)
