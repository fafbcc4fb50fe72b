"""The safety layer: limits, step bound, workspace, invalid actions, watchdog, e-stop, and the property that
nothing outside the limits or the step bound ever reaches the motors."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policylink.adapters.schema import ActionSpec, ControlMode, EnvSpec, FeatureSpec
from policylink.real.robot import Robot, SafeRobot
from policylink.real.safety import SafetyConfig, SafetyConfigError, SafetyLayer, WatchdogState


class FakeClock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


class MotorLog(Robot):
    """A 2-joint position-controlled arm that records every command written to its motors."""

    def __init__(self, mode=ControlMode.JOINT_POSITION):
        self.env_spec = EnvSpec(
            name="motorlog",
            observation_features={"observation.state": FeatureSpec("float32", (2,))},
            action=ActionSpec(("j0", "j1"), mode, ("rad", "rad"), (-1.0, -1.0), (1.0, 1.0)),
            control_frequency=10.0,
            max_episode_steps=100,
        )
        self.written = []
        self.stops = 0
        self.state = np.zeros(2, np.float32)

    def get_observation(self):
        return {"observation.state": self.state.copy()}

    def send_action(self, action):
        self.written.append(np.array(action, np.float32))
        return action

    def stop(self):
        self.stops += 1


def _robot(mode=ControlMode.JOINT_POSITION, **cfg):
    clock = FakeClock()
    robot = MotorLog(mode)
    config = SafetyConfig.from_action_spec(robot.env_spec.action, **cfg)
    return SafeRobot(robot, config, clock=clock, watchdog_thread=False), robot, clock


def test_limit_and_step_clamps_absolute_mode():
    safe, motors, _ = _robot(max_step=0.1)
    np.testing.assert_allclose(safe.send_action([5.0, -0.05]), [1.0, -0.05])  # first command: limits only
    assert safe.last_report.reasons == ("limit",)
    np.testing.assert_allclose(safe.send_action([0.0, 0.5]), [0.9, 0.05], atol=1e-6)  # within 0.1 of the last
    assert safe.last_report.reasons == ("step",)
    assert safe.safety.counts == {"limit": 1, "step": 1}
    np.testing.assert_allclose(motors.written[-1], [0.9, 0.05], atol=1e-6)


def test_delta_mode_step_bound_and_workspace():
    safe, motors, _ = _robot(
        ControlMode.EE_DELTA,
        max_step=0.2,
        workspace_low=(-0.5, -0.5),
        workspace_high=(0.5, 0.5),
        workspace_action=(0, 1),
        workspace_state=(0, 1),
    )
    motors.state[:] = (0.4, 0.0)
    safe.get_observation()
    # limit 1.0 -> step 0.2 -> workspace: 0.4 + dx <= 0.5
    np.testing.assert_allclose(safe.send_action([0.9, -0.3]), [0.1, -0.2], atol=1e-6)
    assert safe.last_report.reasons == ("workspace",)


def test_invalid_actions_are_held_not_sent():
    safe, motors, _ = _robot()
    safe.send_action([0.3, 0.2])
    for bad in ([np.nan, 0.0], [0.0, np.inf], [0.1, 0.2, 0.3], "left", None, [[0.1, 0.2]]):
        sent = safe.send_action(bad)
        np.testing.assert_allclose(sent, [0.3, 0.2])  # hold = the last command (absolute mode)
        assert safe.last_report.held and safe.last_report.reasons == ("invalid",)
    assert safe.safety.counts["invalid"] == 6
    assert all(np.isfinite(w).all() and w.shape == (2,) for w in motors.written)


def test_first_step_is_bounded_from_the_pose_the_robot_reports():
    safe, motors, _ = _robot(max_step=0.1)
    motors.hold_action = lambda: np.array([0.5, -0.5], np.float32)  # a driver reporting its current pose
    np.testing.assert_allclose(safe.send_action([-1.0, 0.0]), [0.4, -0.4], atol=1e-6)


def test_invalid_first_action_in_absolute_mode_sends_nothing():
    safe, motors, _ = _robot()
    safe.send_action([np.nan, 0.0])
    assert motors.written == []  # no previous command: the motors keep their own target


def test_watchdog_not_armed_before_first_action_then_trips_and_needs_rearm():
    safe, motors, clock = _robot(watchdog_s=0.2)
    clock.t += 10.0
    assert not safe.poll_watchdog() and safe.safety.watchdog is WatchdogState.UNARMED
    safe.send_action([0.1, 0.1])
    assert safe.safety.watchdog is WatchdogState.ARMED
    clock.t += 0.19
    assert not safe.poll_watchdog()  # within T: not yet
    clock.t += 0.02
    assert safe.poll_watchdog() and safe.safety.watchdog is WatchdogState.TRIPPED
    np.testing.assert_allclose(motors.written[-1], [0.1, 0.1])  # held
    n = len(motors.written)
    sent = safe.send_action([0.5, 0.5])  # a late action after the trip is refused
    np.testing.assert_allclose(sent, [0.1, 0.1])
    assert safe.last_report.reasons == ("tripped",) and len(motors.written) == n + 1
    safe.rearm()
    np.testing.assert_allclose(safe.send_action([0.5, 0.5]), [0.5, 0.5])
    assert safe.safety.watchdog is WatchdogState.ARMED


def test_watchdog_stop_mode_calls_stop():
    safe, motors, clock = _robot(watchdog_s=0.1, on_timeout="stop")
    safe.send_action([0.0, 0.0])
    clock.t += 0.5
    assert safe.poll_watchdog() and motors.stops == 1


def test_estop_latches_until_reset():
    safe, motors, _ = _robot()
    safe.send_action([0.2, 0.2])
    safe.estop("operator")
    assert motors.stops == 1
    for _ in range(3):
        np.testing.assert_allclose(safe.send_action([0.9, 0.9]), [0.2, 0.2])
        assert safe.last_report.reasons == ("estop",)
    with pytest.raises(RuntimeError, match="e-stop is latched"):
        safe.reset()
    safe.reset_estop()
    np.testing.assert_allclose(safe.send_action([0.25, 0.25]), [0.25, 0.25])


@pytest.mark.parametrize(
    "fields, names",
    [
        ({"low": (0.0, math.nan), "high": (1.0, 1.0)}, "low"),
        ({"low": (0.0, 1.0), "high": (1.0, 1.0)}, r"low\[1\]/high\[1\]"),
        ({"low": (0.0, 2.0), "high": (1.0, 1.0)}, r"low\[1\]/high\[1\]"),
        ({"low": (0.0,), "high": (1.0, 1.0)}, "high"),
        ({"low": (0.0,), "high": (1.0,), "max_step": 0.0}, "max_step"),
        ({"low": (0.0,), "high": (1.0,), "max_step": -1.0}, "max_step"),
        ({"low": (0.0,), "high": (1.0,), "watchdog_s": 0.0}, "watchdog_s"),
        ({"low": (0.0,), "high": (1.0,), "watchdog_s": math.nan}, "watchdog_s"),
        ({"low": (0.0,), "high": (1.0,), "on_timeout": "panic"}, "on_timeout"),
        ({"low": (0.0,), "high": (1.0,), "workspace_low": (0.0,)}, "workspace_low/workspace_high"),
        (
            {
                "low": (0.0,),
                "high": (1.0,),
                "workspace_low": (1.0,),
                "workspace_high": (0.0,),
                "workspace_action": (0,),
            },
            r"workspace_low\[0\]",
        ),
    ],
)
def test_invalid_configs_are_refused_naming_the_field(fields, names):
    with pytest.raises(SafetyConfigError, match=names):
        SafetyConfig(**fields)


_values = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True, width=32),
    st.floats(min_value=-1e6, max_value=1e6),
)
_actions = st.one_of(
    st.lists(_values, min_size=2, max_size=2),
    st.lists(_values, min_size=0, max_size=4),
    st.none(),
    st.text(max_size=3),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(_actions, min_size=1, max_size=30), st.sampled_from(["joint_position", "ee_delta"]))
def test_property_everything_reaching_the_motors_is_within_limits_and_step(actions, mode):
    safe, motors, _ = _robot(ControlMode(mode), max_step=0.25)
    for a in actions:
        safe.send_action(a)
    previous = None
    for w in motors.written:
        assert w.shape == (2,) and np.all(np.isfinite(w))
        assert np.all(w >= -1.0) and np.all(w <= 1.0)
        if mode == "ee_delta":
            assert np.all(np.abs(w) <= 0.25 + 1e-6)
        elif previous is not None:
            assert np.all(np.abs(w - previous) <= 0.25 + 1e-6)
        previous = w


def test_layer_status_is_plain_data():
    layer = SafetyLayer(SafetyConfig(low=(-1.0,), high=(1.0,)))
    layer.command([3.0], now=0.0)
    assert layer.status() == {"watchdog": "armed", "estopped": False, "estop_reason": "", "counts": {"limit": 1}}
