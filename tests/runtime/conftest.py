"""Fixtures of the runtime tests: a fake clock and robots paced on it."""

from __future__ import annotations

import pytest


class FakeClock:
    """A monotonic clock that moves only when told: ``clock()`` reads :attr:`t` (seconds); ``sleep(until, clock)``
    (a :class:`~policylink.real.pacing.Pacer`'s sleep) jumps to ``until``."""

    def __init__(self, t: float = 1000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t

    def sleep(self, until: float, clock=None) -> None:
        self.t = max(self.t, until)


@pytest.fixture
def fake_clock() -> FakeClock:
    """A :class:`FakeClock` at 1000 s."""
    return FakeClock()


@pytest.fixture
def on_fake_clock(fake_clock):
    """``on_fake_clock(driver, **kw) -> SafeRobot``: ``driver`` behind its safety layer (``kw``: SafetyConfig
    overrides; no watchdog thread: the layer checks its watchdog at every action) as a robot env paced on
    ``fake_clock``."""
    from policylink.real.robot import SafeRobot
    from policylink.real.safety import SafetyConfig

    def make(driver, **kw):
        config = SafetyConfig.from_action_spec(driver.env_spec.action, **kw)
        robot = SafeRobot(driver, config, clock=fake_clock, watchdog_thread=False)
        robot.pacer._sleep = fake_clock.sleep
        return robot

    return make
