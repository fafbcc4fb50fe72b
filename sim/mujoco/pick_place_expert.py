"""Scripted pick-and-place expert shared by ``pick_place``, ``insert`` and ``multitask``: a phase machine
(approach, descend, close, lift, carry, lower, release, retreat) driving a saturated proportional controller.

It reads the privileged object and goal positions (``env.unwrapped.object_position`` / ``goal_position``)
and corrects the place point by the object's offset in the hand, so a grasp that slipped a few millimetres
still lands on target (the insert task needs this for its 1 mm clearance). A grasp that failed on lifting, an
object that left the hand while carrying or lowering, or one that lies off the goal after the release (a
displacement or a force pulse, :mod:`policylink.sim.mujoco.perturbations`) sends it back to the approach, so
demos recorded under perturbations show recoveries.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from policylink.sim.mujoco.degradation import Degradation, DegradedExpert, degrade
from policylink.sim.mujoco.gripper_task import MAX_DELTA_M


@dataclass(frozen=True)
class PickPlaceParams:
    """Geometry and speeds of one task's script (all metres, or metres per 0.1 s step).

    Attributes:
        grasp_dz: height of the grasp point above the object's centre.
        hover: approach height above the grasp point.
        carry_z: ee height while carrying.
        place_dz: extra height above the goal at which the object is released.
        lower_speed: max descent per step while placing.
        align_tol: object-to-goal planar error allowed before lowering.
    """

    grasp_dz: float = 0.0
    hover: float = 0.07
    carry_z: float = 0.12
    place_dz: float = 0.005
    lower_speed: float = MAX_DELTA_M
    align_tol: float = 0.004


PICK_PLACE = PickPlaceParams()
INSERT = PickPlaceParams(grasp_dz=0.02, carry_z=0.16, place_dz=0.0, lower_speed=0.01, align_tol=0.0015)
_CLOSE_STEPS, _RELEASE_STEPS = 4, 3
_LOST_M = 0.03  # object this far from its grasp point while held: it left the hand
_OFF_GOAL_M = 0.01  # object this far (planar) from the goal once released: place it again


class PickPlaceExpert:
    """Phase-machine expert; ``act(obs, env)`` returns float32 ``(4,)``: dx, dy, dz (m) and gripper (0/1)."""

    def __init__(self, params: PickPlaceParams):
        self.p = params
        self.aim_offset = np.zeros(3)
        self.reset()

    def reset(self, seed: int | None = None) -> None:
        """Start from the approach phase (``seed`` unused: the script is deterministic)."""
        self.phase, self.counter = "approach", 0

    def act(self, obs: dict[str, Any], env: Any) -> np.ndarray:
        """Next action, from the env's privileged object/goal positions and the current ee position."""
        u = env.unwrapped
        ee, obj = u.robot.ee_position.copy(), u.object_position.copy()
        goal = u.goal_position + self.aim_offset
        p = self.p
        grasp = obj + np.array([0.0, 0.0, p.grasp_dz])
        grip, target, speed = 0.0, ee, MAX_DELTA_M
        if self.phase == "approach":
            target = grasp + np.array([0.0, 0.0, p.hover])
            if np.linalg.norm((target - ee)[:2]) < 0.006 and abs(target[2] - ee[2]) < 0.015:
                self.phase = "descend"
        if self.phase == "descend":
            target = grasp
            if np.linalg.norm(target - ee) < 0.005:
                self.phase, self.counter = "close", 0
        if self.phase == "close":
            grip, target = 1.0, grasp
            self.counter += 1
            if self.counter > _CLOSE_STEPS:
                self.phase = "lift"
        if self.phase == "lift":
            grip, target = 1.0, np.array([ee[0], ee[1], p.carry_z])
            if (ee - obj)[2] > p.grasp_dz + 0.03:  # the object stayed behind: grasp failed
                self.phase = "approach"
                grip = 0.0
            elif ee[2] > p.carry_z - 0.01:
                self.phase = "carry"
        hand_offset = obj - ee  # where the object sits relative to the ee site
        if self.phase in ("carry", "lower") and np.linalg.norm(grasp - ee) > _LOST_M:
            self.phase, target = "approach", grasp + np.array([0.0, 0.0, p.hover])  # dropped or knocked out
        if self.phase == "carry":
            grip = 1.0
            target = np.array([goal[0] - hand_offset[0], goal[1] - hand_offset[1], p.carry_z])
            if np.linalg.norm((goal - obj)[:2]) < p.align_tol:
                self.phase = "lower"
        if self.phase == "lower":
            grip, speed = 1.0, p.lower_speed
            target = goal - hand_offset + np.array([0.0, 0.0, p.place_dz])
            if obj[2] - goal[2] < p.place_dz + 0.003:
                self.phase, self.counter = "release", 0
        if self.phase == "release":
            grip, target = 0.0, ee
            self.counter += 1
            if self.counter > _RELEASE_STEPS:
                self.phase = "retreat"
        if self.phase == "retreat":
            target = np.array([ee[0], ee[1], p.carry_z])
            if np.linalg.norm((goal - obj)[:2]) > _OFF_GOAL_M:  # not placed: pick it up again from above
                self.phase = "approach"
        delta = np.clip(target - ee, -MAX_DELTA_M, MAX_DELTA_M)
        delta[2] = np.clip(delta[2], -speed, speed)
        return np.append(delta, grip).astype(np.float32)


GRIPPER_DEGRADATIONS = {
    "expert": Degradation(action_noise=0.0, lapse_probability=0.0),
    "noisy": Degradation(action_noise=0.2, lapse_probability=0.02, aim_error_m=0.02),
    "poor": Degradation(action_noise=0.5, lapse_probability=0.08, lapse_steps=(3, 10), aim_error_m=0.04),
}
"""Degraded gripper experts also aim beside the goal (the place tolerance forgives small noise)."""
INSERT_DEGRADATIONS = {
    "expert": GRIPPER_DEGRADATIONS["expert"],
    "noisy": Degradation(action_noise=0.2, lapse_probability=0.02, aim_error_m=0.0025),
    "poor": Degradation(action_noise=0.5, lapse_probability=0.08, lapse_steps=(3, 10), aim_error_m=0.006),
}
"""The hole leaves 1 mm per side, so degraded insert experts miss by millimetres, not centimetres."""


def make_pick_place_expert(env: Any, quality: str = "expert", seed: int | None = None) -> DegradedExpert:
    """Expert for ``pick_place`` at ``quality`` (``"expert"``, ``"noisy"``, ``"poor"``). Raises ValueError."""
    return degrade(PickPlaceExpert(PICK_PLACE), env, quality, seed, GRIPPER_DEGRADATIONS)


def make_insert_expert(env: Any, quality: str = "expert", seed: int | None = None) -> DegradedExpert:
    """Expert for ``insert`` at ``quality`` (``"expert"``, ``"noisy"``, ``"poor"``). Raises ValueError."""
    return degrade(PickPlaceExpert(INSERT), env, quality, seed, INSERT_DEGRADATIONS)


def make_multitask_expert(env: Any, quality: str = "expert", seed: int | None = None) -> DegradedExpert:
    """Expert for ``multitask`` (the cube and pad named by the instruction). Raises ValueError on quality."""
    return degrade(PickPlaceExpert(PICK_PLACE), env, quality, seed, GRIPPER_DEGRADATIONS)
