"""A stand-in for a MetaWorld ``SawyerXYZEnv`` with its API (``seed``, ``reset``, ``step`` with ``info["success"]``,
``dt``, ``max_path_length``, ``model``/``data`` with the ``corner2`` camera) and for a ``metaworld.policies`` policy,
so the venv-side adapter runs through the same code path without MetaWorld. Imported by the tests and, through
``PYTHONPATH``, by an env server subprocess (factory ``fake_metaworld:make_fake_metaworld_env``).
"""

from __future__ import annotations

import os
from typing import Any

import mujoco
import numpy as np

from policylink.sim.isolated.metaworld_env import MetaWorldAdapter

_XML = """
<mujoco>
  <worldbody>
    <light pos="0 0 2"/>
    <geom type="plane" size="1 1 0.1" rgba="0.6 0.6 0.6 1"/>
    <body name="hand" mocap="true" pos="0 0.6 0.2"><geom type="sphere" size="0.03" rgba="1 0 0 1"/></body>
    <camera name="corner2" pos="0.8 0.2 0.6" xyaxes="-0.6 0.8 0 -0.3 -0.2 0.9"/>
  </worldbody>
</mujoco>
"""
SUCCESS_RADIUS = 0.05  # m


class FakeSawyer:
    """Reach task: the hand (a mocap body) moves ``action[:3] / 100`` m a step; success within 5 cm of the goal,
    which each reset draws from the seeded generator (``seed``), as MetaWorld's ``seeded_rand_vec`` does."""

    max_path_length = 500
    dt = 0.0125

    def __init__(self, crash_at_step: int | None = None):
        self.model = mujoco.MjModel.from_xml_string(_XML)
        self.data = mujoco.MjData(self.model)
        self.rng = np.random.default_rng(0)
        self.crash_at_step = crash_at_step
        self.goal = np.zeros(3)
        self.t = 0

    def seed(self, seed: int) -> list[int]:
        self.rng = np.random.default_rng(seed)
        return [seed]

    def reset(self) -> tuple[np.ndarray, dict[str, Any]]:
        self.data.mocap_pos[0] = (0.0, 0.6, 0.2)
        self.goal = self.rng.uniform((-0.1, 0.8, 0.05), (0.1, 0.9, 0.3))
        mujoco.mj_forward(self.model, self.data)
        self.t = 0
        return self._obs(), {}

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        self.t += 1
        if self.crash_at_step is not None and self.t == self.crash_at_step:
            os._exit(3)  # a simulator that dies mid-episode (segfault, OOM kill)
        self.data.mocap_pos[0] += np.clip(action[:3], -1, 1) / 100.0
        mujoco.mj_forward(self.model, self.data)
        dist = float(np.linalg.norm(self.data.mocap_pos[0] - self.goal))
        info = {"success": float(dist < SUCCESS_RADIUS), "near_object": 0.0}
        return self._obs(), -dist, False, self.t >= self.max_path_length, info

    def close(self) -> None:
        pass

    def _obs(self) -> np.ndarray:
        obs = np.zeros(39)
        obs[:3] = self.data.mocap_pos[0]
        obs[18:21] = self.data.mocap_pos[0]
        obs[36:] = self.goal
        return obs


class FakeReachPolicy:
    """``get_action(obs)``: move the hand toward the goal (``metaworld.policies`` style, gain 25)."""

    def get_action(self, obs: np.ndarray) -> np.ndarray:
        return np.concatenate([25.0 * (obs[36:39] - obs[:3]), [-1.0]])


def make_fake_metaworld_env(task: str = "reach", crash_at_step: int | None = None, **kwargs: Any) -> MetaWorldAdapter:
    """The adapter around :class:`FakeSawyer` with :class:`FakeReachPolicy` as its expert (the venv factory's
    signature: ``task`` plus the adapter's keyword arguments; ``expert_actions`` defaults off, as there)."""
    return MetaWorldAdapter(FakeSawyer(crash_at_step), task, expert=FakeReachPolicy(), **kwargs)
