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
    """A 2-joint arm that records every command written to its motors and tracks it exactly: in pose modes the
    commanded pose is the measured pose after the write; ``home()`` moves it to ``home_pose``."""

    def __init__(self, mode=ControlMode.JOINT_POSITION):
        self.env_spec = EnvSpec(
            name="motorlog",
            observation_features={"observation.state": FeatureSpec("float32", (2,))},
            action=ActionSpec(("j0", "j1"), mode, ("rad", "rad"), (-1.0, -1.0), (1.0, 1.0)),
            control_frequency=10.0,
            max_episode_steps=100,
        )
        self.pose_mode = ControlMode(mode).value in ("joint_position", "ee_position")
        self.written = []
        self.stops = 0
        self.state = np.zeros(2, np.float32)
        self.home_pose = np.zeros(2, np.float32)

    def get_observation(self):
        return {"observation.state": self.state.copy()}

    def measured_pose(self):
        return self.state.copy()

    def send_action(self, action):
        self.written.append(np.array(action, np.float32))
        if self.pose_mode:
            self.state = np.array(action, np.float32)
        return action

    def home(self):
        self.state = self.home_pose.copy()

    def stop(self):
        self.stops += 1


def _robot(mode=ControlMode.JOINT_POSITION, **cfg):
    clock = FakeClock()
    robot = MotorLog(mode)
    config = SafetyConfig.from_action_spec(robot.env_spec.action, **cfg)
    return SafeRobot(robot, config, clock=clock, watchdog_thread=False), robot, clock


def test_limit_and_step_clamps_absolute_mode():
    safe, motors, _ = _robot(max_step=0.1)
    np.testing.assert_allclose(safe.send_action([5.0, -0.05]), [0.1, -0.05])  # from the measured pose (0, 0)
    assert safe.last_report.reasons == ("limit", "step")
    np.testing.assert_allclose(safe.send_action([-0.5, 0.5]), [0.0, 0.05], atol=1e-6)  # within 0.1 of the pose
    assert safe.last_report.reasons == ("step",)
    assert safe.safety.counts == {"limit": 1, "step": 2}
    np.testing.assert_allclose(motors.written[-1], [0.0, 0.05], atol=1e-6)


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
        np.testing.assert_allclose(sent, [0.3, 0.2])  # hold = the measured pose (absolute mode)
        assert safe.last_report.held and safe.last_report.reasons == ("invalid",)
    assert safe.safety.counts["invalid"] == 6
    assert all(np.isfinite(w).all() and w.shape == (2,) for w in motors.written)


def test_first_step_is_bounded_from_the_pose_the_robot_reports():
    safe, motors, _ = _robot(max_step=0.1)
    motors.state[:] = (0.5, -0.5)  # the robot stands here after connect
    np.testing.assert_allclose(safe.send_action([-1.0, 0.0]), [0.4, -0.4], atol=1e-6)


def test_after_home_the_step_bound_and_the_hold_follow_the_measured_pose():
    """Issue 30.1: after home(), reset() or a motion the layer did not command, holds and the next command are
    bounded around where the robot is, not around the pre-home command."""
    safe, motors, _ = _robot(max_step=0.2)
    for target in (0.2, 0.4, 0.6):
        safe.send_action([target, target])
    motors.home_pose[:] = (-0.5, 0.5)
    safe.home()
    safe.hold()  # a hold keeps the robot where it is now
    np.testing.assert_allclose(motors.written[-1], [-0.5, 0.5])
    np.testing.assert_allclose(safe.send_action([np.nan, 0.0]), [-0.5, 0.5])  # a NaN-hold: the same
    np.testing.assert_allclose(safe.send_action([-0.4, 0.4]), [-0.4, 0.4], atol=1e-6)  # valid: unchanged
    np.testing.assert_allclose(safe.send_action([0.6, 0.6]), [-0.2, 0.6], atol=1e-6)  # within 0.2 of (-0.4, 0.4)
    motors.state[:] = (0.9, -0.9)  # moved by hand (a takeover the layer did not command)
    np.testing.assert_allclose(safe.send_action([0.0, 0.0]), [0.7, -0.7], atol=1e-6)
    motors.home_pose[:] = (0.0, 0.0)
    safe.reset()
    np.testing.assert_allclose(safe.send_action([1.0, 1.0]), [0.2, 0.2], atol=1e-6)


def test_a_pose_mode_driver_without_a_measured_pose_is_refused_with_a_clear_error():
    """Issue 30.2: no reference, no motion."""

    class Blind(Robot):
        env_spec = MotorLog().env_spec

        def get_observation(self):
            return {}

        def send_action(self, action):
            return action

    config = SafetyConfig.from_action_spec(Blind.env_spec.action, max_step=0.2)
    with pytest.raises(SafetyConfigError, match=r"driver Blind reports no measured pose.*measured_pose\(\)"):
        SafeRobot(Blind(), config, watchdog_thread=False)
    SafeRobot(Blind(), SafetyConfig.from_action_spec(Blind.env_spec.action), watchdog_thread=False)  # no max_step


def test_a_pose_that_is_not_known_yet_holds_instead_of_jumping():
    safe, motors, _ = _robot(max_step=0.2)
    motors.measured_pose = lambda: None  # e.g. before the first sensor read
    sent = safe.send_action([1.0, 1.0])
    assert motors.written == [] and safe.last_report.reasons == ("no_pose",)
    np.testing.assert_allclose(sent, [0.0, 0.0])
    motors.measured_pose = lambda: np.array([0.3, np.nan], np.float32)  # a broken read is no pose either
    safe.send_action([0.3, 0.0])
    assert motors.written == [] and safe.safety.counts["no_pose"] == 2

    def broken():
        raise OSError("bus timeout")

    motors.measured_pose = broken  # a failing read holds, it does not crash the server
    safe.send_action([0.3, 0.0])
    assert motors.written == [] and safe.safety.counts["no_pose"] == 3


def test_a_pose_outside_the_limits_by_more_than_a_step_holds_without_moving():
    safe, motors, _ = _robot(max_step=0.1)
    motors.state[:] = (1.5, 0.0)  # the limit is 1.0: no command is both within limits and within 0.1
    safe.send_action([0.9, 0.0])
    assert motors.written == [] and safe.last_report.reasons == ("unreachable",)


MALFORMED = [
    ([[0.0], 0.0], "ragged"),
    ([[0.0, 0.0], 0.0], "ragged"),
    ("0.1 0.2", "str"),
    (b"\x00\x01", "bytes"),
    (None, "none"),
    ({"j0": 0.1, "j1": 0.2}, "mapping"),
    ([0.1, 0.2, 0.3], "shape"),
    ([0.1], "shape"),
    (np.zeros((1, 2)), "shape"),
    ([[0.1, 0.2]], "ragged"),
    (np.float32(0.1), "type:float32"),
    ([np.nan, 0.0], "nonfinite"),
    (np.array([0.0, -np.inf]), "nonfinite"),
    ([1e300, 0.0], "overflow"),
    ([10**400, 0], "overflow"),
    ([10**39, 0], "overflow"),
    ([1 + 2j, 0.0], "complex"),
    (np.array([0.1, 0.2], np.complex64), "complex"),
    ([True, False], "bool"),
    (["0.1", "0.2"], "non_numeric"),
    (np.array(["0.1", "0.2"]), "non_numeric"),
    ([object(), 0.0], "non_numeric"),
    ({0.1, 0.2}, "type:set"),
]


def test_garbage_never_raises_never_moves_is_counted_and_logged_once_per_kind(caplog):
    """Issue 30.3: every malformed action becomes the hold command (the measured pose), is counted and logged once
    per kind; the ragged list used to raise ValueError inside the error formatter."""
    safe, motors, _ = _robot(max_step=0.2)
    safe.send_action([0.1, -0.1])
    caplog.set_level("WARNING", logger="policylink.real.safety")
    for _ in range(2):
        for bad, _kind in MALFORMED:
            np.testing.assert_array_equal(safe.send_action(bad), np.float32([0.1, -0.1]))
            assert safe.last_report.held and safe.last_report.reasons == ("invalid",)
    expected = {}
    for _, kind in MALFORMED:
        expected[kind] = expected.get(kind, 0) + 2
    assert dict(safe.safety.invalid_kinds) == expected
    assert safe.safety.counts["invalid"] == 2 * len(MALFORMED)
    logged = [r.getMessage() for r in caplog.records if "malformed action" in r.getMessage()]
    assert len(logged) == len(expected)  # once per kind
    np.testing.assert_array_equal(np.stack(motors.written[1:]), np.float32([[0.1, -0.1]] * (2 * len(MALFORMED))))
    assert safe.safety.status()["invalid_kinds"]["ragged"] == 6


def test_valid_numeric_forms_are_accepted():
    safe, _, _ = _robot()
    for good in ([0.1, 0.2], (0.1, 0.2), np.array([0.1, 0.2]), np.array([0, 1], np.int64), [np.float64(0.1), 1]):
        sent = safe.send_action(good)
        assert not safe.last_report.held
        np.testing.assert_allclose(sent, np.asarray(good, np.float64), atol=1e-7)


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
    assert layer.status() == {
        "watchdog": "armed",
        "estopped": False,
        "estop_reason": "",
        "counts": {"limit": 1},
        "invalid_kinds": {},
    }
