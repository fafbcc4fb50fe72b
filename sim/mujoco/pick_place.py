"""``pick_place``: pick a 4 cm cube with the parallel-jaw gripper and place it on a target pad.

State (float32, 10): ee x, y, z (m), gripper opening (1 open), cube x, y, z (m), target x, y, z (m). Action:
see :mod:`policylink.sim.mujoco.gripper_task`. Success: the cube rests within 0.03 m of the target centre
(cube centre below 0.025 m) and the gripper is open.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from policylink.adapters.env_config import with_env_config
from policylink.sim.mujoco.geometry import euclidean3, sample_separated
from policylink.sim.mujoco.gripper_task import ROBOT_STATE_NAMES, GripperTaskEnv, placed_at
from policylink.sim.mujoco.task_config import MujocoTaskConfig

CUBE_HALF_M = 0.02
SUCCESS_RADIUS_M = 0.03
CUBE_LOW, CUBE_HIGH = np.array([-0.15, -0.15]), np.array([0.15, 0.0])
TARGET_LOW, TARGET_HIGH = np.array([-0.15, 0.05]), np.array([0.15, 0.15])


def _distance(c, sqrt=math.sqrt):
    """Gripper-to-cube plus cube-to-goal distance from state columns ``c`` (arrays or floats); the goal is the
    pad centre raised by the cube's half size (``+ 0.0`` keeps the float operations of the array form)."""
    gx, gy, gz = c[7] + 0.0, c[8] + 0.0, c[9] + CUBE_HALF_M
    return euclidean3(c[0] - c[4], c[1] - c[5], c[2] - c[6], sqrt) + euclidean3(c[4] - gx, c[5] - gy, c[6] - gz, sqrt)


class PickPlaceEnv(GripperTaskEnv):
    """Pick the cube, place it on the pad: see the module docstring (kwargs: :class:`MujocoTaskEnv`)."""

    name = "pick_place"
    xml_file = "pick_place.xml"
    max_episode_steps = 100
    state_names = ROBOT_STATE_NAMES + ("cube_x", "cube_y", "cube_z", "target_x", "target_y", "target_z")
    default_cameras = ("front",)
    randomized_geoms = ("cube", "target")
    main_object = "cube"
    instructions = ("pick up the red cube and place it on the blue target",)

    def _setup(self) -> None:
        super()._setup()
        self._target_mocap = self.model.body("target").mocapid[0]
        self._target_view = self.data.mocap_pos[self._target_mocap]  # views: MjData buffers are never reallocated
        self._cube_view = self.body_position("cube")

    def _sample_episode(self, rng: np.random.Generator, options: dict[str, Any]) -> None:
        cube = rng.uniform(CUBE_LOW, CUBE_HIGH)
        (target,) = sample_separated(rng, TARGET_LOW, TARGET_HIGH, 1, 0.1, avoid=[cube])
        self.set_free_body("cube", np.array([cube[0], cube[1], CUBE_HALF_M]), rng.uniform(-0.3, 0.3))
        self.data.mocap_pos[self._target_mocap] = (target[0], target[1], 0.0005)
        self._reset_robot(rng)

    @property
    def object_position(self) -> np.ndarray:
        """Cube centre, m, ``(3,)``."""
        return self.body_position("cube")

    @property
    def goal_position(self) -> np.ndarray:
        """Where the cube centre should end: the pad centre raised by the cube's half size, m, ``(3,)``."""
        t = self.data.mocap_pos[self._target_mocap]
        return np.array([t[0], t[1], CUBE_HALF_M])

    def _observe(self) -> tuple[list[float], bool]:
        robot, cube, target = self._robot_state(), self._cube_view.tolist(), self._target_view.tolist()
        return robot + cube + target, placed_at(cube, target, robot[3], SUCCESS_RADIUS_M, CUBE_HALF_M + 0.005)

    def goal_distance(self, state: np.ndarray) -> np.ndarray:
        """Gripper-to-cube plus cube-to-goal distance, m, float64 ``(N,)`` from states ``(N, 10)`` (the goal is the
        pad centre raised by the cube's half size)."""
        return _distance(np.asarray(state, np.float64).T, np.sqrt)

    # :meth:`goal_distance` of one state (Python floats), bit for bit: the module function itself (one call a step)
    goal_distance_now = staticmethod(_distance)


@with_env_config(MujocoTaskConfig)
def make_pick_place_env(**kwargs: Any) -> PickPlaceEnv:
    """Registry factory for ``pick_place`` (kwargs: :class:`~policylink.sim.mujoco.task_config.MujocoTaskConfig`,
    checked by ``make_env``)."""
    return PickPlaceEnv(**kwargs)
