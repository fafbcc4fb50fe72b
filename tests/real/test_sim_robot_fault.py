"""The sim-as-real robot faults when its physics diverges (issue 34, deploy -> record -> improve): a MuJoCo contact
solve that blows up (``worn_gantry`` flings the cube at 37-1400 m/s in a few per cent of grasps) ends the episode as
a failure, and the diverged observation is never served, so a deployment recording holds no teleported objects.
The check itself (``sim/mujoco/gap_runtime.physics_fault``) is tested in ``tests/sim/test_gap_fault.py``."""

import numpy as np

from policylink.adapters.registry import make_env
from policylink.real.sim_robot import SimRobot


def test_a_diverged_step_ends_the_episode_as_a_failure_without_serving_its_observation():
    env = make_env("reach", obs_mode="state")
    robot = SimRobot(env, realtime=False)
    try:
        obs0, _ = robot.reset(seed=0)
        assert robot.tick() and env.unwrapped.physics_fault() is None and robot.episode_info()["terminated"] is False
        served = robot.get_observation()
        step = env.step

        def diverging_step(action):
            out = step(action)
            env.unwrapped.data.qvel[0] = 250.0
            return out

        env.step = diverging_step
        assert robot.tick() is True
        info = robot.episode_info()
        assert info["terminated"] is True and info["is_success"] is False and "250.0" in info["fault"]
        np.testing.assert_array_equal(robot.get_observation()["observation.state"], served["observation.state"])
        assert robot.tick() is False  # the episode is over
        env.step = step
        robot.reset(seed=1)
        assert "fault" not in robot.episode_info() and robot.tick()
    finally:
        robot.disconnect()
