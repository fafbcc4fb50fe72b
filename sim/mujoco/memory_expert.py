"""Scripted expert for ``memory``: go to the waypoint, hold there until ``visited``, then go to the correct goal.

It reads the correct goal from the simulator (privileged), so it needs no memory of its own and works in every
observation mode.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from policylink.sim.mujoco.degradation import Degradation, DegradedExpert, degrade
from policylink.sim.mujoco.memory import MAX_DELTA_M, WAYPOINT

GAIN = 0.9  # fraction of the remaining distance commanded per step
MEMORY_DEGRADATIONS = {
    "expert": Degradation(action_noise=0.0, lapse_probability=0.0),
    "noisy": Degradation(action_noise=0.3, lapse_probability=0.03),
    "poor": Degradation(action_noise=0.8, lapse_probability=0.1, lapse_steps=(4, 12)),
}


class MemoryExpert:
    """``act`` returns float32 ``(3,)``: ``clip(0.9 * (aim - ee), +-0.02)`` with ``aim`` the waypoint until the
    env reports ``visited``, then the correct goal (plus ``aim_offset``)."""

    def __init__(self) -> None:
        self.aim_offset = np.zeros(3)

    def reset(self, seed: int | None = None) -> None:
        """Stateless; nothing to reset."""

    def act(self, obs: dict[str, Any], env: Any) -> np.ndarray:
        """Next action; ``env`` is the :class:`~policylink.sim.mujoco.memory.MemoryEnv` (possibly wrapped)."""
        task = env.unwrapped
        ee = np.asarray(task.privileged_state()[:3], np.float64)
        aim = task.correct_goal if task.visited else WAYPOINT
        return np.clip(GAIN * (aim + self.aim_offset - ee), -MAX_DELTA_M, MAX_DELTA_M).astype(np.float32)


def make_memory_expert(env: Any, quality: str = "expert", seed: int | None = None) -> DegradedExpert:
    """Expert for ``memory`` at ``quality`` (``"expert"``, ``"noisy"``, ``"poor"``). Raises ValueError otherwise."""
    return degrade(MemoryExpert(), env, quality, seed, MEMORY_DEGRADATIONS)
