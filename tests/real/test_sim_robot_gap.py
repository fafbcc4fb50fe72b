"""The sim-as-real robot with a reality gap (issue 34): ``policylink robot --sim TASK --gap NAME`` builds the task
with the gap's dynamics and sensing, takes the gap's timing for the latency flags left at 0, and reports each
episode's drawn parameters (``reality_gap``) so that a deployment recorder keeps them."""

import json

import pytest

from policylink.adapters.schema import REALITY_GAP_INFO
from policylink.real.robots import RobotConfig, build_robot
from policylink.real.sim_robot import SimTiming


def test_gap_timing_and_parameters_reach_the_robot():
    robot = build_robot(RobotConfig(sim="reach", gap="lab_robot"))
    try:
        assert robot.timing.observation_latency_s == pytest.approx(0.030)
        assert robot.timing.actuation_latency_s == pytest.approx(0.020)
        assert robot.timing.jitter_s == pytest.approx(0.005)
        _, info = robot.reset(seed=3)
        gap = json.loads(info[REALITY_GAP_INFO])
        assert gap["name"] == "lab_robot" and gap["dynamics"]["actuator_gain_scale"] == 0.6
        assert json.loads(robot.episode_info()[REALITY_GAP_INFO]) == gap
        kp = robot.env.unwrapped.model.actuator_gainprm[:, 0]
        assert kp[0] == pytest.approx(0.6 * 1500.0)
    finally:
        robot.disconnect()


def test_a_latency_flag_wins_over_the_gap_and_no_gap_reports_none():
    robot = build_robot(RobotConfig(sim="reach", gap="lab_robot", observation_latency_ms=80.0))
    try:
        assert robot.timing.observation_latency_s == pytest.approx(0.080)
        assert robot.timing.actuation_latency_s == pytest.approx(0.020)
    finally:
        robot.disconnect()
    plain = build_robot(RobotConfig(sim="reach"))
    try:
        plain.reset(seed=0)
        assert REALITY_GAP_INFO not in plain.episode_info() and plain.timing == SimTiming()
    finally:
        plain.disconnect()


def test_from_ms_checks_like_the_constructor():
    assert SimTiming.from_ms(10.0, 20.0, 5.0, seed=2) == SimTiming(0.01, 0.02, 0.005, 2)
    with pytest.raises(ValueError, match="actuation_latency_s"):
        SimTiming.from_ms(actuation_latency_ms=-1.0)
