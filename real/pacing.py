"""Fixed-rate pacing for real-time loops (diffusion_policy's real-robot timing): a precise sleep to absolute
deadlines ``t0 + k * period``, so a loop never drifts with its own work time; overruns are counted."""

from __future__ import annotations

import math
import time
from collections.abc import Callable

Clock = Callable[[], float]
"""A monotonic clock, seconds (``time.monotonic``; tests inject a fake one)."""


def precise_sleep(until: float, clock: Clock = time.monotonic, spin_s: float = 0.0015) -> None:
    """Sleep until ``clock() >= until``: ``time.sleep`` to ``spin_s`` before, then spin (OS sleeps overshoot)."""
    left = until - clock()
    if left > spin_s:
        time.sleep(left - spin_s)
    while clock() < until:
        pass


class Pacer:
    """Absolute-deadline pacing: deadline ``k`` is ``t0 + k * period``; waking never drifts with the work time.

    Two ways to handle an overrun (a wait that finds its deadline already passed; always counted):

    - ``catch_up=False`` (the robot loop): move to the first deadline after now; the missed periods are skipped
      (counted in ``skipped``), never run back to back, and the grid stays ``t0 + k * period``.
    - ``catch_up=True`` (diffusion_policy's loop): return at once and keep every deadline, so ``N`` waits take
      ``N * period`` in total whatever the overruns (periods after a stall run back to back until caught up).

    Args:
        period_s: control period, seconds (> 0).
        clock: monotonic clock; sleep: ``sleep(until, clock)`` (default :func:`precise_sleep`).
        catch_up: see above.

    Attributes:
        t0: start time; ``k``: the index of the last deadline reached; ``overruns``, ``skipped``: see above.

    Raises:
        ValueError: ``period_s <= 0`` or not finite.
    """

    def __init__(
        self,
        period_s: float,
        clock: Clock = time.monotonic,
        sleep: Callable[..., None] = precise_sleep,
        catch_up: bool = False,
    ):
        if not (math.isfinite(period_s) and period_s > 0):
            raise ValueError(f"period_s: expected a finite number of seconds > 0, received {period_s}")
        self.period, self.clock, self._sleep, self.catch_up = float(period_s), clock, sleep, bool(catch_up)
        self.start()
        self.overruns = self.skipped = 0

    def start(self, t0: float | None = None) -> None:
        """Restart the grid at ``t0`` (default now)."""
        self.t0 = self.clock() if t0 is None else float(t0)
        self.k = 0

    @property
    def deadline(self) -> float:
        """The next deadline, ``t0 + (k + 1) * period``."""
        return self.t0 + (self.k + 1) * self.period

    def wait(self) -> float:
        """Sleep to the next deadline (see the class for overruns). Returns the wake-up error, seconds (how late
        the loop resumes after the deadline it was waiting for)."""
        now = self.clock()
        self.k += 1
        target = self.t0 + self.k * self.period
        if now > target:
            self.overruns += 1
            if self.catch_up:
                return now - target
            missed = int((now - target) // self.period) + 1
            self.skipped += missed
            self.k += missed
            target = self.t0 + self.k * self.period
        self._sleep(target, self.clock)
        return self.clock() - target
