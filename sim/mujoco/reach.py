"""``reach``: move the gripper's end-effector site to a random target point above the table.

State (float32, 6): ee x, y, z and target x, y, z (m). Action: ``ee_delta`` (dx, dy, dz), m per 0.1 s step,
within +-0.02 m. Success: the ee site within 0.02 m of the target.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from policylink.adapters.env_config import with_env_config
from policylink.adapters.schema import ActionSpec
from policylink.sim.mujoco.base import MujocoTaskEnv
from policylink.sim.mujoco.geometry import euclidean3
from policylink.sim.mujoco.robot import GantryController, xyz_delta_spec
from policylink.sim.mujoco.task_config import MujocoTaskConfig

MAX_DELTA_M = 0.02
SUCCESS_RADIUS_M = 0.02
WORKSPACE_LOW = np.array([-0.2, -0.2, 0.03])
WORKSPACE_HIGH = np.array([0.2, 0.2, 0.3])
TARGET_LOW = np.array([-0.15, -0.15, 0.05])
TARGET_HIGH = np.array([0.15, 0.15, 0.25])
START_LOW = np.array([-0.05, -0.05, 0.15])
START_HIGH = np.array([0.05, 0.05, 0.22])


def _distance(c, sqrt=math.sqrt):
    """End-effector-to-target distance from state columns ``c`` (arrays or floats)."""
    return euclidean3(c[0] - c[3], c[1] - c[4], c[2] - c[5], sqrt)


class ReachEnv(MujocoTaskEnv):
    """Reach a target: see the module docstring for state, action and success (kwargs: :class:`MujocoTaskEnv`)."""

    name = "reach"
    xml_file = "reach.xml"
    max_episode_steps = 50
    state_names = ("ee_x", "ee_y", "ee_z", "target_x", "target_y", "target_z")
    n_proprio = 3  # end-effector x, y, z
    default_cameras = ("front",)
    randomized_geoms = ("target",)
    main_object = "target"
    instructions = ("move the gripper to the red ball",)

    def _setup(self) -> None:
        self.robot = GantryController(self.model, self.data, WORKSPACE_LOW, WORKSPACE_HIGH)
        self._target_mocap = self.model.body("target").mocapid[0]
        self._target_view = self.data.mocap_pos[self._target_mocap]
        self._ee_view = self.robot.ee_position  # views: MjData buffers are never reallocated

    def _action_spec(self) -> ActionSpec:
        return xyz_delta_spec(MAX_DELTA_M)

    def _sample_episode(self, rng: np.random.Generator, options: dict[str, Any]) -> None:
        start = rng.uniform(START_LOW, START_HIGH)
        target = rng.uniform(TARGET_LOW, TARGET_HIGH)
        while np.linalg.norm(target - start) < 3 * SUCCESS_RADIUS_M:
            target = rng.uniform(TARGET_LOW, TARGET_HIGH)
        self.robot.reset(start)
        self.data.mocap_pos[self._target_mocap] = target

    def _apply_action(self, action: list[float] | np.ndarray) -> None:
        self.robot.command(action)

    @property
    def target(self) -> np.ndarray:
        """Target position, m, ``(3,)``."""
        return self._target_view

    def _observe(self) -> tuple[list[float], bool]:
        ee, target = self._ee_view.tolist(), self._target_view.tolist()
        return ee + target, math.dist(ee, target) < SUCCESS_RADIUS_M

    def goal_distance(self, state: np.ndarray) -> np.ndarray:
        """End-effector-to-target distance, m, float64 ``(N,)`` from states ``(N, 6)``."""
        return _distance(np.asarray(state, np.float64).T, np.sqrt)

    # :meth:`goal_distance` of one state (Python floats), bit for bit: the module function itself (one call a step)
    goal_distance_now = staticmethod(_distance)


@with_env_config(MujocoTaskConfig)
def make_reach_env(**kwargs: Any) -> ReachEnv:
    """Registry factory for ``reach`` (kwargs: :class:`~policylink.sim.mujoco.task_config.MujocoTaskConfig`,
    checked by ``make_env``)."""
    return ReachEnv(**kwargs)
