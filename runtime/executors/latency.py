"""Simulated inference latency, in control steps, so asynchronous execution can be compared with synchronous
execution in simulation (where inference otherwise takes zero simulated time)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

import numpy as np


class LatencyMode(StrEnum):
    """``none``: zero delay; ``fixed``: always ``steps``; ``uniform``: an integer in ``[low, high]``."""

    NONE = "none"
    FIXED = "fixed"
    UNIFORM = "uniform"


@dataclass(frozen=True)
class LatencyConfig:
    """Inference delay ``d`` in control steps (one step = ``1 / control_frequency`` s).

    Attributes:
        mode: ``none`` (zero delay), ``fixed`` (always ``steps``) or ``uniform`` (an integer in ``[low, high]``).
        steps: the fixed delay (``mode="fixed"``), steps.
        low: lower bound (inclusive) of the uniformly sampled delay (``mode="uniform"``), steps.
        high: upper bound (inclusive) of the uniformly sampled delay (``mode="uniform"``), steps.
        seed: seed of the delay sampler (so evaluations are reproducible).

    Raises:
        ValueError: unknown mode, negative steps, or ``low > high``.
    """

    mode: str = LatencyMode.NONE.value
    steps: int = 0
    low: int = 0
    high: int = 0
    seed: int = 0

    def __post_init__(self) -> None:
        try:
            LatencyMode(self.mode)
        except ValueError:
            raise ValueError(
                f"latency.mode: expected one of {[m.value for m in LatencyMode]}, received {self.mode!r}"
            ) from None
        for name in ("steps", "low", "high"):
            if int(getattr(self, name)) < 0:
                raise ValueError(f"latency.{name}: expected >= 0 steps, received {getattr(self, name)}")
        if self.mode == LatencyMode.UNIFORM.value and self.low > self.high:
            raise ValueError(f"latency.low/high: expected low <= high, received low={self.low} > high={self.high}")

    @property
    def simulated(self) -> bool:
        """True unless ``mode="none"``."""
        return self.mode != LatencyMode.NONE.value

    @property
    def max_steps(self) -> int:
        """The largest delay this config can produce, steps."""
        return {"none": 0, "fixed": int(self.steps), "uniform": int(self.high)}[self.mode]

    def sampler(self) -> Callable[[], int]:
        """A function drawing one delay (int steps) per call; deterministic given ``seed``."""
        if self.mode == LatencyMode.FIXED.value:
            return lambda: int(self.steps)
        if self.mode == LatencyMode.UNIFORM.value:
            rng = np.random.default_rng(self.seed)
            return lambda: int(rng.integers(self.low, self.high + 1))
        return lambda: 0
