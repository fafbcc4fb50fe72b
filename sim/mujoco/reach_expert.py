"""Scripted expert for ``reach``: a saturated proportional controller toward the target."""

from __future__ import annotations

from typing import Any

import numpy as np

from policylink.adapters.schema import STATE_KEY
from policylink.sim.mujoco.degradation import Degradation, DegradedExpert, degrade
from policylink.sim.mujoco.reach import MAX_DELTA_M

GAIN = 0.9  # fraction of the remaining distance commanded per step
REACH_DEGRADATIONS = {
    "expert": Degradation(action_noise=0.0, lapse_probability=0.0),
    "noisy": Degradation(action_noise=0.15, lapse_probability=0.03, aim_error_m=0.026),
    "poor": Degradation(action_noise=0.6, lapse_probability=0.1, lapse_steps=(4, 12), aim_error_m=0.04),
}
"""Reach is forgiving (success ends the episode), so degraded experts also aim beside the target."""


class ReachExpert:
    """``act`` returns float32 ``(3,)``: ``clip(0.9 * (target + aim_offset - ee), +-max)`` from the state."""

    def __init__(self) -> None:
        self.aim_offset = np.zeros(3)

    def reset(self, seed: int | None = None) -> None:
        """Stateless; nothing to reset."""

    def act(self, obs: dict[str, Any], env: Any = None) -> np.ndarray:
        """Next action from ``obs["observation.state"]`` = (ee xyz, target xyz)."""
        s = np.asarray(obs[STATE_KEY], dtype=np.float64)
        return np.clip(GAIN * (s[3:6] + self.aim_offset - s[0:3]), -MAX_DELTA_M, MAX_DELTA_M).astype(np.float32)


def make_reach_expert(env: Any, quality: str = "expert", seed: int | None = None) -> DegradedExpert:
    """Expert for ``reach`` at ``quality`` (``"expert"``, ``"noisy"``, ``"poor"``). Raises ValueError otherwise."""
    return degrade(ReachExpert(), env, quality, seed, REACH_DEGRADATIONS)
