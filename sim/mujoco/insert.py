"""``insert``: pick a 24 mm square peg and insert it into a 26 mm square hole (1 mm clearance per side,
40 mm deep).

State (float32, 10): ee x, y, z (m), gripper opening (1 open), peg centre x, y, z (m), hole centre x, y (m)
and hole top z (m). Action: see :mod:`policylink.sim.mujoco.gripper_task`. Success: the peg's bottom is at
least 20 mm inside the hole (below z = 0.02 m) and its axis within 4 mm of the hole's centre.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from policylink.adapters.env_config import with_env_config
from policylink.sim.mujoco.geometry import euclidean3, sample_separated
from policylink.sim.mujoco.gripper_task import ROBOT_STATE_NAMES, GripperTaskEnv
from policylink.sim.mujoco.task_config import MujocoTaskConfig

PEG_HALF_HEIGHT_M = 0.04
HOLE_TOP_M = 0.04
INSERTED_BOTTOM_M = 0.02
CENTRED_M = 0.004
PEG_LOW, PEG_HIGH = np.array([-0.15, -0.15]), np.array([0.15, -0.02])
HOLE_LOW, HOLE_HIGH = np.array([-0.15, 0.06]), np.array([0.15, 0.15])


def _distance(c, sqrt=math.sqrt):
    """Gripper-to-peg plus peg-to-inserted-pose distance from state columns ``c`` (arrays or floats)."""
    return euclidean3(c[0] - c[4], c[1] - c[5], c[2] - c[6], sqrt) + euclidean3(
        c[4] - c[7], c[5] - c[8], c[6] - PEG_HALF_HEIGHT_M, sqrt
    )


class InsertEnv(GripperTaskEnv):
    """Peg-in-hole with tight clearance: see the module docstring (kwargs: :class:`MujocoTaskEnv`)."""

    name = "insert"
    xml_file = "insert.xml"
    max_episode_steps = 120
    state_names = ROBOT_STATE_NAMES + ("peg_x", "peg_y", "peg_z", "hole_x", "hole_y", "hole_top_z")
    default_cameras = ("front",)
    randomized_geoms = ("peg", "wall_px", "wall_nx", "wall_py", "wall_ny")
    main_object = "peg"
    instructions = ("insert the orange peg into the hole",)

    def _setup(self) -> None:
        super()._setup()
        self._hole_mocap = self.model.body("hole").mocapid[0]
        self._hole_view = self.data.mocap_pos[self._hole_mocap]  # views: MjData buffers are never reallocated
        self._peg_view = self.body_position("peg")

    def _sample_episode(self, rng: np.random.Generator, options: dict[str, Any]) -> None:
        peg = rng.uniform(PEG_LOW, PEG_HIGH)
        (hole,) = sample_separated(rng, HOLE_LOW, HOLE_HIGH, 1, 0.12, avoid=[peg])
        self.set_free_body("peg", np.array([peg[0], peg[1], PEG_HALF_HEIGHT_M]))
        self.data.mocap_pos[self._hole_mocap] = (hole[0], hole[1], 0.0)
        self._reset_robot(rng)

    @property
    def object_position(self) -> np.ndarray:
        """Peg centre, m, ``(3,)``."""
        return self.body_position("peg")

    @property
    def goal_position(self) -> np.ndarray:
        """Peg centre when fully inserted (bottom on the table inside the hole), m, ``(3,)``."""
        h = self.data.mocap_pos[self._hole_mocap]
        return np.array([h[0], h[1], PEG_HALF_HEIGHT_M])

    def _observe(self) -> tuple[list[float], bool]:
        (px, py, pz), (hx, hy, _) = self._peg_view.tolist(), self._hole_view.tolist()
        success = pz - PEG_HALF_HEIGHT_M < INSERTED_BOTTOM_M and math.hypot(px - hx, py - hy) < CENTRED_M
        return [*self._robot_state(), px, py, pz, hx, hy, HOLE_TOP_M], success

    def goal_distance(self, state: np.ndarray) -> np.ndarray:
        """Gripper-to-peg plus peg-to-inserted-pose distance, m, float64 ``(N,)`` from states ``(N, 10)`` (the
        inserted pose is the hole's x, y with the peg's bottom on the table: centre z = its half height)."""
        return _distance(np.asarray(state, np.float64).T, np.sqrt)

    # :meth:`goal_distance` of one state (Python floats), bit for bit: the module function itself (one call a step)
    goal_distance_now = staticmethod(_distance)


@with_env_config(MujocoTaskConfig)
def make_insert_env(**kwargs: Any) -> InsertEnv:
    """Registry factory for ``insert`` (kwargs: :class:`~policylink.sim.mujoco.task_config.MujocoTaskConfig`,
    checked by ``make_env``)."""
    return InsertEnv(**kwargs)
