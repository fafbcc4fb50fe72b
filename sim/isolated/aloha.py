"""ALOHA sim (gym-aloha), host side: the ``aloha`` env family (``aloha/transfer_cube``, ``aloha/insertion``, served
from the venv that ``policylink envs install aloha`` builds) and its scripted expert. Imports no gym-aloha, dm_control
nor MuJoCo; the env itself is :mod:`policylink.sim.isolated.aloha_env`, run inside the venv.

``gym-aloha`` 0.1.1 pins ``mujoco>=2.3.7,<3`` and ``dm-control>=1.0.14`` (dm-control 1.0.14 is the last one on
MuJoCo 2.x); ours is MuJoCo 4.x, hence the venv. The tasks are the bimanual ViperX scenes of the ACT paper (Zhao et
al. 2023, "Learning Fine-Grained Bimanual Manipulation with Low-Cost Hardware", arXiv 2304.13705, section V-A):
joint-position control at 50 Hz, 400-step episodes. Env kwargs (JSON-serialisable, passed to the venv):
``obs_mode``, ``image_size``, ``env_state``, ``expert_actions``, ``max_episode_steps``, ``render_mode``; see
:class:`~policylink.sim.isolated.aloha_env.AlohaAdapter`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from policylink.sim.isolated.families import IsolatedFamily
from policylink.sim.isolated.info_expert import InfoExpert

ALOHA_TASKS: tuple[str, ...] = ("transfer_cube", "insertion")
"""The two simulated ALOHA tasks (gym-aloha's ``AlohaTransferCube-v0`` and ``AlohaInsertion-v0``); the same tuple as
``aloha_env.TASKS`` (a test checks it), kept here so the host never imports the venv module."""


@dataclass(frozen=True)
class AlohaConfig:
    """Keyword arguments of an ``aloha/<task>`` env (checked on the host before its env server starts; the venv's
    :class:`~policylink.sim.isolated.aloha_env.AlohaAdapter` checks the values).

    Attributes:
        obs_mode: ``"state"`` (the 14 joint positions and the objects' poses: privileged), ``"image+proprio"``
            (the ``top`` camera and the 14 joint positions: the paper's inputs), ``"state+image"`` or ``"image"``.
        image_size: height of the ``top`` camera's frames, pixels (width: 4/3 of it, the camera's 480x640 aspect).
        env_state: also observe the objects' poses as ``observation.environment_state`` (any obs mode).
        expert_actions: roll the ACT paper's scripted policy out at each reset and put its action in every info
            (``record --expert expert`` reads it); off: no expert rollout (evaluation is faster).
        max_episode_steps: truncation, steps (None: the paper's 400).
        render_mode: None or ``"rgb_array"``.
    """

    obs_mode: str = "state"
    image_size: int = 96
    env_state: bool = False
    expert_actions: bool = True
    max_episode_steps: int | None = None
    render_mode: str | None = None


ALOHA = IsolatedFamily(
    name="aloha",
    requirements=("gym-aloha==0.1.1", "dm-control==1.0.14", "mujoco==2.3.7", "numpy<2"),
    factory="policylink.sim.isolated.aloha_env:make_aloha_env",
    tasks=ALOHA_TASKS,
    check="import os; os.environ.setdefault('MUJOCO_GL', 'egl'); import gym_aloha.env",
    env_config=AlohaConfig,
)
"""The ``aloha`` family (entry point ``policylink.env_families``). ``numpy<2``: MuJoCo 2.3.7's wheels are built
against NumPy 1.x."""


NOISE = {"expert": 0.0, "noisy": 0.02, "poor": 0.06}
"""Std (radians) of the Gaussian noise added to the scripted arm joint targets per quality."""


class AlohaExpert(InfoExpert):
    """The ACT paper's scripted policy, replayed in joint space: an env built with ``expert_actions=True`` (the
    default) rolls the end-effector script out at each reset in the mocap-driven twin scene, with the same object
    poses, and carries the resulting joint target for the current step in each reset/step info as
    ``expert_action`` (ACT's ``record_sim_episodes.py`` procedure; see
    :mod:`policylink.sim.isolated.aloha_script`).

    Args:
        quality: ``"expert"``, or ``"noisy"``/``"poor"`` (:data:`NOISE` radians of Gaussian noise on the arm
            joints; the grippers are left as scripted).
        seed: seeds the noise (:meth:`reset` reseeds it).

    Raises:
        ValueError: unknown ``quality``.
    """

    family = "aloha"
    noise_table = NOISE
    missing_hint = "build the env with expert_actions=True (the default)"

    def perturb(self, action: np.ndarray) -> np.ndarray:
        """float32 ``(14,)``: Gaussian noise (radians) on the 12 arm joint targets; the grippers stay as scripted."""
        arms = np.r_[0:6, 7:13]  # the grippers (6, 13) stay as scripted
        action[arms] += self.rng.normal(0.0, self.noise, arms.size).astype(np.float32)
        return action


def make_aloha_expert(env: Any, quality: str = "expert", seed: int | None = None) -> AlohaExpert:
    """The scripted expert for an ``aloha/<task>`` env (``sim.experts.make_expert`` dispatches here).

    Raises:
        ValueError: unknown ``quality``.
    """
    return AlohaExpert(quality, seed)
