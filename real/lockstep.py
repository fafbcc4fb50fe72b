"""Lockstep time for the sim-as-real robot: a virtual clock that advances only while the deployment loop waits for
its next period, ticking the simulated robot at each of its deadlines on the way. Inference then takes no
simulated time (a robot computer infinitely fast), so a deployment on a loaded machine is deterministic and
matches the task's own rollouts; everything else of the robot path (the safety layer, the pacing grid, late-action
rules, takeovers, the deployment recorder) runs unchanged. ``policylink run --robot sim:TASK --lockstep true``.
"""

from __future__ import annotations

from typing import Any


class LockstepClock:
    """A monotonic clock, seconds, that moves only in :meth:`sleep` (starts at 0).

    Attributes:
        robot: the :class:`~policylink.real.sim_robot.SimRobot` (built with this clock and ``realtime=False``) it
            ticks; set after the robot is built.
    """

    def __init__(self) -> None:
        self.t = 0.0
        self.robot: Any = None

    def __call__(self) -> float:
        """The virtual time, seconds."""
        return self.t

    def sleep(self, until: float, clock: Any = None) -> None:
        """Advance to ``until``, ticking the robot at each of its tick deadlines ``t0 + k * period`` (its episode
        grid, jitter ignored) up to ``until``. ``clock`` is ignored (the :class:`~policylink.real.pacing.Pacer`
        sleep signature)."""
        r = self.robot
        while r is not None and r._active:  # noqa: SLF001 - the sim robot's episode grid, read in lockstep
            due = r._t0 + (r.ticks + 1) * r.period  # noqa: SLF001
            if due > until + 1e-12:
                break
            self.t = max(self.t, due)
            r.tick()
        self.t = max(self.t, float(until))


__all__ = ["LockstepClock"]
