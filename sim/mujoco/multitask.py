"""``multitask``: red, green and blue cubes and two pads (left, right); the language instruction says which
cube goes onto which pad, with several phrasings per goal (``env_spec.tasks`` lists all 18).

State (float32, 13): ee x, y, z (m), gripper opening (1 open), then red, green and blue cube centres x, y, z
(m). The goal is given only by ``obs["task"]``. ``reset(options={"task": ...})`` picks the instruction;
otherwise it is drawn uniformly. Success: the named cube rests within 0.035 m of the named pad's centre and the
gripper is open.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from policylink.adapters.env_config import with_env_config
from policylink.sim.mujoco.geometry import sample_separated
from policylink.sim.mujoco.gripper_task import ROBOT_STATE_NAMES, GripperTaskEnv, placed_at
from policylink.sim.mujoco.task_config import MujocoTaskConfig

COLOURS = ("red", "green", "blue")
SIDES = ("left", "right")
PHRASINGS = (
    "put the {colour} block on the {side} pad",
    "place the {colour} cube onto the {side} target",
    "move the {colour} block to the {side} side",
)
GOALS: dict[str, tuple[str, str]] = {
    p.format(colour=c, side=s): (c, s) for c in COLOURS for s in SIDES for p in PHRASINGS
}
"""Instruction -> (cube colour, pad side)."""
CUBE_HALF_M = 0.02
SUCCESS_RADIUS_M = 0.035
PAD_XY = {"left": np.array([-0.15, 0.13]), "right": np.array([0.15, 0.13])}
CUBE_LOW, CUBE_HIGH = np.array([-0.16, -0.16]), np.array([0.16, 0.0])
_PAD_XY = {side: xy.tolist() for side, xy in PAD_XY.items()}  # Python floats (the per-step success check)


class MultitaskEnv(GripperTaskEnv):
    """Language-conditioned pick and place: see the module docstring (kwargs: :class:`MujocoTaskEnv`)."""

    name = "multitask"
    xml_file = "multitask.xml"
    max_episode_steps = 100
    state_names = ROBOT_STATE_NAMES + tuple(f"{c}_{a}" for c in COLOURS for a in "xyz")
    default_cameras = ("front",)
    randomized_geoms = ("cube_red", "cube_green", "cube_blue")
    main_object = "cube_red"
    _cube_bodies = tuple(f"cube_{c}" for c in COLOURS)  # in state order
    instructions = tuple(GOALS)
    goal_keys = tuple(f"{c}/{s}" for c in COLOURS for s in SIDES)
    """Every goal an episode can draw, as instruction-file keys (``"<colour>/<side>"``)."""

    def _setup(self) -> None:
        super()._setup()
        self._cube_views = [self.body_position(name) for name in self._cube_bodies]  # xpos views, state order

    def _sample_episode(self, rng: np.random.Generator, options: dict[str, Any]) -> None:
        task = options.get("task")
        if task is None:
            task = self.instructions[int(rng.integers(len(self.instructions)))]
        elif task not in GOALS:
            raise ValueError(
                f"options['task']: expected one of env_spec.tasks (e.g. {self.instructions[0]!r}), received {task!r}"
            )
        self.task = task
        for colour, xy in zip(COLOURS, sample_separated(rng, CUBE_LOW, CUBE_HIGH, len(COLOURS), 0.08)):
            self.set_free_body(f"cube_{colour}", np.array([xy[0], xy[1], CUBE_HALF_M]), rng.uniform(-0.3, 0.3))
        self._reset_robot(rng)

    @property
    def goal(self) -> tuple[str, str]:
        """(cube colour, pad side) of the current instruction."""
        return GOALS[self.task]

    @property
    def object_position(self) -> np.ndarray:
        """Centre of the cube named by the instruction, m, ``(3,)``."""
        return self.body_position(f"cube_{self.goal[0]}")

    @property
    def goal_position(self) -> np.ndarray:
        """Where that cube's centre should end, m, ``(3,)``."""
        xy = PAD_XY[self.goal[1]]
        return np.array([xy[0], xy[1], CUBE_HALF_M])

    def _observe(self) -> tuple[list[float], bool]:
        robot = self._robot_state()
        cubes = [view.tolist() for view in self._cube_views]
        colour, side = self.goal
        cube = cubes[COLOURS.index(colour)]
        success = placed_at(cube, _PAD_XY[side], robot[3], SUCCESS_RADIUS_M, CUBE_HALF_M + 0.005)
        return robot + [v for cube in cubes for v in cube], success


@with_env_config(MujocoTaskConfig)
def make_multitask_env(**kwargs: Any) -> MultitaskEnv:
    """Registry factory for ``multitask`` (kwargs: :class:`~policylink.sim.mujoco.task_config.MujocoTaskConfig`,
    checked by ``make_env``)."""
    return MultitaskEnv(**kwargs)
