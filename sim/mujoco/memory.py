"""``memory``: a task that needs memory. A cue shown only during the first second names which of two goals is right;
the gripper must first dwell at a fixed waypoint (far from the start), then touch the named goal. The cue is gone
long before the decision, so no short observation window holds both the cue and the decision.

State (float32, 5): ee x, y, z (m), ``cue`` (+1 = left goal, -1 = right goal during the first :data:`CUE_STEPS`
observations, 0 after) and ``dwell``, the dwell progress at the waypoint: steps spent within
:data:`WAYPOINT_RADIUS_M` of it / :data:`DWELL_STEPS`, capped at 1 (1 = ``visited``). The progress is observed so
that the cue is the only thing a policy has to remember (how long it has waited is in the state). Images: the
correct goal is lit green during the cue, both goals are grey after it. Action: ``ee_delta`` (dx, dy, dz), m per 0.1
s step, within +-0.02 m. Success: after ``visited``, the ee within :data:`GOAL_RADIUS_M` of the correct goal.
Touching the wrong goal after ``visited`` ends the episode as a failure (``terminated``, ``info["is_success"]``
False, ``info["wrong_goal"]`` True), so a policy that forgot the cue scores about 50 %.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from policylink.adapters.env_config import with_env_config
from policylink.adapters.schema import ActionSpec
from policylink.sim.mujoco.base import CONTROL_FREQUENCY_HZ, MujocoTaskEnv
from policylink.sim.mujoco.robot import GantryController, xyz_delta_spec
from policylink.sim.mujoco.task_config import MujocoTaskConfig

MAX_DELTA_M = 0.02
CUE_STEPS = int(CONTROL_FREQUENCY_HZ)  # the first second: observations 0 .. 9
DWELL_STEPS = 15
WAYPOINT_RADIUS_M = 0.03
GOAL_RADIUS_M = 0.03
WAYPOINT = np.array([0.0, -0.17, 0.12])
GOALS = np.array([[-0.15, 0.1, 0.12], [0.15, 0.1, 0.12]])  # left, right
WORKSPACE_LOW = np.array([-0.2, -0.2, 0.03])
WORKSPACE_HIGH = np.array([0.2, 0.2, 0.3])
START_LOW = np.array([-0.04, 0.12, 0.1])
START_HIGH = np.array([0.04, 0.17, 0.14])
CUE_RGBA = np.array([0.1, 0.85, 0.2, 1.0], np.float32)
IDLE_RGBA = np.array([0.6, 0.6, 0.6, 0.9], np.float32)


class MemoryEnv(MujocoTaskEnv):
    """Remember a cue across a detour: see the module docstring (kwargs: :class:`MujocoTaskEnv`).

    ``options={"goal": 0 | 1}`` in :meth:`reset` fixes the correct goal (0 = left, 1 = right); otherwise it is
    drawn uniformly from the seeded generator.
    """

    name = "memory"
    xml_file = "memory.xml"
    max_episode_steps = 80
    state_names = ("ee_x", "ee_y", "ee_z", "cue", "dwell")
    state_unit = "m (cue, dwell: 1)"
    n_proprio = 3
    default_cameras = ("top",)
    main_object = "waypoint"
    instructions = ("visit the blue waypoint, then touch the goal that was lit at the start",)

    def _setup(self) -> None:
        self.robot = GantryController(self.model, self.data, WORKSPACE_LOW, WORKSPACE_HIGH)
        self._goal_geoms = [self.model.geom(n).id for n in ("goal_left", "goal_right")]
        self.goal_index = 0
        self._dwell = 0
        self._phase_step = -1  # elapsed_steps at which the dwell counter was last advanced
        self.wrong_goal = False

    def _action_spec(self) -> ActionSpec:
        return xyz_delta_spec(MAX_DELTA_M)

    def _sample_episode(self, rng: np.random.Generator, options: dict[str, Any]) -> None:
        goal = options.get("goal")
        if goal is not None and goal not in (0, 1):
            raise ValueError(f"options['goal']: expected 0 (left) or 1 (right), received {goal!r}")
        self.goal_index = int(rng.integers(2)) if goal is None else int(goal)
        self.robot.reset(rng.uniform(START_LOW, START_HIGH))
        self._dwell, self._phase_step, self.wrong_goal = 0, -1, False
        self._show_cue(True)

    def _apply_action(self, action: list[float] | np.ndarray) -> None:
        self.robot.command(action)
        if self.elapsed_steps + 1 >= CUE_STEPS:  # the observation after this step is past the first second
            self._show_cue(False)

    def _show_cue(self, on: bool) -> None:
        for i, g in enumerate(self._goal_geoms):
            self.model.geom_rgba[g] = CUE_RGBA if on and i == self.goal_index else IDLE_RGBA

    @property
    def visited(self) -> bool:
        """True once the ee has dwelt :data:`DWELL_STEPS` steps at the waypoint this episode."""
        self._advance_phase()
        return self._dwell >= DWELL_STEPS

    @property
    def correct_goal(self) -> np.ndarray:
        """Position of the goal the cue names, m, ``(3,)``."""
        return GOALS[self.goal_index]

    def _advance_phase(self) -> None:
        """Count the dwell at the waypoint once per control step (idempotent within a step)."""
        if self._phase_step == self.elapsed_steps:
            return
        self._phase_step = self.elapsed_steps
        if self._dwell < DWELL_STEPS and np.linalg.norm(self.robot.ee_position - WAYPOINT) < WAYPOINT_RADIUS_M:
            self._dwell += 1

    def _observe(self) -> tuple[list[float], bool]:
        cue = (1.0 if self.goal_index == 0 else -1.0) if self.elapsed_steps < CUE_STEPS else 0.0
        self._advance_phase()
        dwell = min(self._dwell, DWELL_STEPS) / DWELL_STEPS
        return [*self.robot.ee_position.tolist(), cue, dwell], self._is_success()

    def _near(self, goal: int) -> bool:
        return bool(np.linalg.norm(self.robot.ee_position - GOALS[goal]) < GOAL_RADIUS_M)

    def _is_success(self) -> bool:
        return self.visited and self._near(self.goal_index)

    def step(self, action: np.ndarray):
        """As :meth:`MujocoTaskEnv.step`, plus: touching the wrong goal after the waypoint terminates the episode
        as a failure (``info["wrong_goal"]`` True)."""
        obs, reward, terminated, truncated, info = super().step(action)
        self.wrong_goal = self.wrong_goal or (self.visited and self._near(1 - self.goal_index))
        info["wrong_goal"] = self.wrong_goal
        return obs, reward, terminated or self.wrong_goal, truncated, info

    def goal_distance(self, state: np.ndarray) -> None:
        """None: the goal is not a function of the current state alone (it depends on the cue seen earlier)."""
        return None


@with_env_config(MujocoTaskConfig)
def make_memory_env(**kwargs: Any) -> gym.Env:
    """Registry factory for ``memory`` (kwargs: :class:`~policylink.sim.mujoco.task_config.MujocoTaskConfig`,
    checked by ``make_env``)."""
    return MemoryEnv(**kwargs)
