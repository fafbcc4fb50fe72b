"""Keyboard takeover (injected key events), the LeRobot robot bridge (a small LeRobot ``Robot`` subclass defined
here, no hardware), and the sim-as-real robot's timing model (ticks driven by the test with a fake clock)."""

import numpy as np
import pytest

from policylink.adapters.registry import make_env
from policylink.real.sim_robot import SimRobot, SimTiming
from policylink.real.teleop import KeyboardTeleop, Teleoperator


def test_keyboard_teleop_with_injected_keys():
    tele = KeyboardTeleop(3, step=0.01)
    assert isinstance(tele, Teleoperator)
    tele.press("w")
    assert not tele.engaged  # motion keys alone do not engage
    tele.press(" ")
    assert tele.engaged
    np.testing.assert_allclose(tele.action({}), [0.01, 0.0, 0.0])  # the w pressed before is kept
    for k in ("a", "a", "f", "q"):  # q is not mapped: ignored
        tele.press(k)
    np.testing.assert_allclose(tele.action({}), [0.0, 0.02, -0.01])
    np.testing.assert_allclose(tele.action({}), [0.0, 0.0, 0.0])  # nothing pressed: hold still
    tele.press(" ")
    assert not tele.engaged and not tele.estop_requested
    tele.press("x")
    assert tele.estop_requested
    with pytest.raises(ValueError, match="keys"):
        KeyboardTeleop(2)  # r/f map to dimension 2


class FakeClock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def test_sim_robot_latencies_holds_and_overwrites():
    clock = FakeClock()
    timing = SimTiming(observation_latency_s=0.15, actuation_latency_s=0.05)
    robot = SimRobot(make_env("reach", obs_mode="state"), timing, clock=clock, realtime=False)
    obs0, _ = robot.reset(seed=1)
    ee0 = obs0["observation.state"][:3].copy()
    robot.send_action([0.02, 0.0, 0.0])
    clock.t = 0.04
    robot.tick()  # the action is not due yet (actuation latency): hold
    assert (robot.ticks, robot.holds) == (1, 1)
    clock.t = 0.1
    robot.send_action([0.0, 0.02, 0.0])  # due at 0.15
    clock.t = 0.16
    robot.tick()  # both are due: the newest acts, the older one is counted as overwritten
    assert (robot.ticks, robot.holds, robot.overwritten) == (2, 1, 1)
    # observation latency 0.15 s: at t = 0.16 only the reset observation is old enough
    np.testing.assert_allclose(robot.get_observation()["observation.state"][:3], ee0)
    clock.t = 0.35
    ee = robot.get_observation()["observation.state"][:3]
    assert ee[1] - ee0[1] > 0.01 and abs(ee[0] - ee0[0]) < 0.005  # moved along +y only
    info = robot.episode_info()
    assert info["ticks"] == 2 and info["terminated"] is False
    robot.disconnect()


def test_sim_timing_refuses_negative_latency():
    with pytest.raises(ValueError, match="jitter_s"):
        SimTiming(jitter_s=-0.01)
    with pytest.raises(ValueError, match=r"time_scale: expected a finite factor > 0, received 0.0"):
        SimTiming(time_scale=0.0)


def test_sim_time_scale_sets_the_wall_clock_period():
    from policylink.adapters.registry import make_env

    robot = SimRobot(make_env("reach"), SimTiming(time_scale=0.5), realtime=False)
    assert robot.period == pytest.approx(0.2)  # reach is 10 Hz: half speed ticks every 0.2 s


@pytest.mark.lerobot
def test_lerobot_robot_bridge_maps_keys_and_units():
    pytest.importorskip("lerobot")
    from dataclasses import dataclass

    from lerobot.robots import Robot as LeRobotBase
    from lerobot.robots import RobotConfig

    from policylink.real.lerobot import LeRobotBridgeConfig, LeRobotRobot

    @RobotConfig.register_subclass("policylink_test_arm")
    @dataclass
    class TwoJointConfig(RobotConfig):
        pass

    class TwoJointArm(LeRobotBase):
        config_class = TwoJointConfig
        name = "two_joint"

        def __init__(self, config, calibration_dir):
            config.calibration_dir = calibration_dir
            super().__init__(config)
            self.joints = {"shoulder.pos": 10.0, "elbow.pos": -20.0}
            self.sent = []
            self._connected = False

        observation_features = {"shoulder.pos": float, "elbow.pos": float, "wrist_cam": (4, 5, 3)}
        action_features = {"shoulder.pos": float, "elbow.pos": float}

        @property
        def is_connected(self):
            return self._connected

        def connect(self, calibrate=True):
            self._connected = True

        @property
        def is_calibrated(self):
            return True

        def calibrate(self):
            pass

        def configure(self):
            pass

        def get_observation(self):
            return {**self.joints, "wrist_cam": np.full((4, 5, 3), 7, np.uint8)}

        def send_action(self, action):
            clipped = {k: float(np.clip(v, -50.0, 50.0)) for k, v in action.items()}  # the arm's own clip
            self.sent.append(clipped)
            return clipped

        def disconnect(self):
            self._connected = False

    import tempfile
    from pathlib import Path

    arm = TwoJointArm(TwoJointConfig(id="t"), Path(tempfile.mkdtemp()))
    bridge = LeRobotRobot(
        arm, LeRobotBridgeConfig(low=-90.0, high=90.0, unit="deg", control_frequency=15.0, task="wave")
    )
    spec = bridge.env_spec
    assert spec.name == "two_joint" and spec.control_frequency == 15.0
    assert spec.observation_features["observation.state"].names == ("shoulder.pos", "elbow.pos")
    assert spec.observation_features["observation.images.wrist_cam"].shape == (4, 5, 3)
    assert spec.action.names == ("shoulder.pos", "elbow.pos") and spec.action.units == ("deg", "deg")
    with bridge:
        assert arm.is_connected
        assert bridge.hold_action() is None  # nothing observed yet
        obs = bridge.get_observation()
        np.testing.assert_array_equal(bridge.hold_action(), [10.0, -20.0])  # hold = the observed pose
        np.testing.assert_array_equal(obs["observation.state"], np.array([10.0, -20.0], np.float32))
        assert obs["observation.images.wrist_cam"].shape == (4, 5, 3) and obs["task"] == "wave"
        sent = bridge.send_action(np.array([70.0, -5.0], np.float32))
        np.testing.assert_array_equal(sent, [50.0, -5.0])  # what LeRobot reports it sent
        assert arm.sent[-1] == {"shoulder.pos": 50.0, "elbow.pos": -5.0}
    assert not arm.is_connected
