"""Shared base of the gripper tasks (``pick_place``, ``insert``, ``multitask``): the xyz gantry with a
parallel-jaw gripper, a 4-D ``ee_delta`` + gripper action, and the "placed and released" predicate.

Action (float32, 4): dx, dy, dz (m per 0.1 s step, within +-0.03 m) and the gripper command (0 = open,
1 = closed; fractional values close partially). State starts with ee x, y, z (m) and the gripper opening (1 =
open, 0 = closed); each task appends its object and goal positions.
"""

from __future__ import annotations

import math

import numpy as np

from policylink.adapters.schema import ActionSpec, ControlMode
from policylink.sim.mujoco.base import MujocoTaskEnv
from policylink.sim.mujoco.robot import GantryController

MAX_DELTA_M = 0.03
WORKSPACE_LOW = np.array([-0.25, -0.25, 0.015])
WORKSPACE_HIGH = np.array([0.25, 0.25, 0.3])
EE_START_LOW = np.array([-0.05, -0.05, 0.16])
EE_START_HIGH = np.array([0.05, 0.05, 0.2])
ROBOT_STATE_NAMES = ("ee_x", "ee_y", "ee_z", "gripper_opening")
RELEASED_OPENING = 0.5  # the object counts as released when the gripper is at least this open


class GripperTaskEnv(MujocoTaskEnv):
    """Base of the gripper tasks (kwargs: :class:`~policylink.sim.mujoco.base.MujocoTaskEnv`)."""

    state_unit = "m (positions); 1 (gripper_opening)"
    n_proprio = len(ROBOT_STATE_NAMES)  # end effector x, y, z and gripper opening
    proprio_unit = "m (positions); 1 (gripper_opening)"

    def _setup(self) -> None:
        self.robot = GantryController(self.model, self.data, WORKSPACE_LOW, WORKSPACE_HIGH)
        self._ee_view = self.robot.ee_position  # a view: MjData buffers are never reallocated

    def _action_spec(self) -> ActionSpec:
        return ActionSpec(
            names=("dx", "dy", "dz", "gripper"),
            control_mode=ControlMode.EE_DELTA,
            units=("m", "m", "m", "1"),
            low=(-MAX_DELTA_M,) * 3 + (0.0,),
            high=(MAX_DELTA_M,) * 3 + (1.0,),
            gripper_index=3,
        )

    def _apply_action(self, action: list[float] | np.ndarray) -> None:
        self.robot.command(action[:3], grip=float(action[3]))

    def _reset_robot(self, rng: np.random.Generator) -> None:
        self.robot.reset(rng.uniform(EE_START_LOW, EE_START_HIGH))

    def _robot_state(self) -> list[float]:
        """ee x, y, z (m) and gripper opening (1 open, 0 closed), 4 floats."""
        state = self._ee_view.tolist()
        state.append(self.robot.opening)
        return state


def placed_at(position: list[float], goal_xy: list[float], opening: float, radius: float, max_height: float) -> bool:
    """The "placed and released" predicate on Python floats: an object at ``position`` (m, x, y, z) lies within
    ``radius`` (m) of ``goal_xy`` (m, x, y) below ``max_height`` (m) and the gripper ``opening`` (1 open, 0 closed)
    exceeds :data:`RELEASED_OPENING`."""
    x, y, z = position
    return math.hypot(x - goal_xy[0], y - goal_xy[1]) < radius and z < max_height and opening > RELEASED_OPENING
