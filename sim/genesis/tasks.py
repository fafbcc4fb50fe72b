"""``genesis_reach`` and ``genesis_pick_place``: the MuJoCo ``reach`` and ``pick_place`` tasks with Genesis
(genesis-world, CPU backend) physics.

Each env keeps the MuJoCo task as its *task mirror*: the mirror samples episodes (so a seed gives the same
start, cube and target as the MuJoCo env), turns actions into actuator targets (the same
:class:`~policylink.sim.mujoco.robot.GantryController`), assembles observations and judges success; Genesis
alone integrates the physics, and after every control step its joint and cube positions are copied into the
mirror. The EnvSpec is therefore the MuJoCo one (renamed), the scripted experts of
:func:`policylink.sim.experts.make_expert` work unchanged, and image observations are rendered by MuJoCo's
renderer from the Genesis state.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, ClassVar

import mujoco
import numpy as np

from policylink.adapters.env import EnvAdapter
from policylink.adapters.env_config import with_env_config
from policylink.adapters.validation import coerce_action
from policylink.sim.genesis.scene import GANTRY_JOINTS, GantryScene
from policylink.sim.mujoco.base import MujocoTaskEnv
from policylink.sim.mujoco.perturbations import PerturbationConfig
from policylink.sim.mujoco.pick_place import PickPlaceEnv
from policylink.sim.mujoco.randomization import RandomizationConfig
from policylink.sim.mujoco.reach import ReachEnv
from policylink.sim.mujoco.robot import GantryController
from policylink.sim.mujoco.task_config import RenderedTaskConfig


@dataclasses.dataclass(frozen=True)
class GenesisTaskConfig(RenderedTaskConfig):
    """Keyword arguments of a Genesis task (:class:`GenesisTaskEnv`): those of
    :class:`~policylink.sim.mujoco.task_config.RenderedTaskConfig` (``perturbation`` inactive only) plus

    Attributes:
        scene: a built :class:`~policylink.sim.genesis.scene.GantryScene` to share, or None to build one.
    """

    scene: GantryScene | None = None


class GenesisTaskEnv(EnvAdapter):
    """A MuJoCo task (class attribute ``mujoco_task``) simulated by Genesis; see the module docstring.

    Args:
        scene: a built :class:`~policylink.sim.genesis.scene.GantryScene` to use (envs used one after another
            may share one, which saves its build); None builds a new one (about 130 s with a cold kernel
            cache, 5-30 s warm, on a 2-core CPU).
        obs_mode, image_size, cameras, render_quality, render_mode, randomization, render_size: as for
            :class:`~policylink.sim.mujoco.base.MujocoTaskEnv` (images come from MuJoCo's renderer).
        perturbation: must be None or inactive (MuJoCo's perturbations would act on the mirror, not on Genesis).

    Raises:
        ValueError: an active ``perturbation``, or a bad argument of the MuJoCo task (``obs_mode``...).
        ImportError: genesis-world is not installed (the ``genesis`` extra).
    """

    name: ClassVar[str]
    mujoco_task: ClassVar[type[MujocoTaskEnv]]

    def __init__(
        self,
        scene: GantryScene | None = None,
        obs_mode: str = "state",
        image_size: int | tuple[int, int] = 96,
        cameras: tuple[str, ...] | None = None,
        render_quality: str = "fast",
        perturbation: PerturbationConfig | Mapping[str, Any] | None = None,
        render_mode: str | None = None,
        randomization: RandomizationConfig | Mapping[str, Any] | None = None,
        render_size: int = 256,
    ):
        perturbation = PerturbationConfig.coerce(perturbation)
        if perturbation is not None and perturbation.active:
            raise ValueError(
                f"perturbation: expected None for {self.name} (the MuJoCo perturbations act on MuJoCo's "
                f"state, which only mirrors Genesis here), received {perturbation}"
            )
        self.mirror = self.mujoco_task(
            obs_mode=obs_mode,
            image_size=image_size,
            cameras=cameras,
            render_quality=render_quality,
            render_mode=render_mode,
            randomization=randomization,
            render_size=render_size,
        )
        self.env_spec = dataclasses.replace(self.mirror.env_spec, name=self.name)
        self._init_spaces()
        self.render_mode = render_mode
        self.metadata = dict(self.mirror.metadata)
        m = self.mirror.model
        self._qadr = np.array([m.joint(n).qposadr[0] for n in GANTRY_JOINTS])
        self._dadr = np.array([m.joint(n).dofadr[0] for n in GANTRY_JOINTS])
        self._act = np.array([m.actuator(n).id for n in GANTRY_JOINTS])
        cube = mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_JOINT, "cube")
        self._cube_adr = int(m.jnt_qposadr[cube]) if cube >= 0 else None
        self._low, self._high = self.env_spec.action.low_array, self.env_spec.action.high_array
        self.scene = scene if scene is not None else GantryScene()
        self.elapsed_steps = 0
        self.reset(seed=None)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        """Sample an episode with the MuJoCo task (same seed, same episode) and teleport Genesis there, at rest.

        Returns:
            ``(observation, info)`` with ``info["is_success"]`` (bool).
        """
        super().reset(seed=seed)
        obs, info = self.mirror.reset(seed=seed, options=options)
        d = self.mirror.data
        cube = d.qpos[self._cube_adr : self._cube_adr + 7] if self._cube_adr is not None else None
        self.scene.set_state(d.qpos[self._qadr], d.ctrl[self._act], cube)
        self.elapsed_steps = 0
        return obs, info

    def step(self, action: np.ndarray):
        """Advance one control step (``1 / 10`` s) in Genesis.

        Args:
            action: float32-convertible ``(A,)`` in the ActionSpec's units; clipped to its limits.

        Returns:
            ``(obs, reward, terminated, truncated, info)`` as the MuJoCo task: reward 1.0 on success else 0.0,
            terminated on success, truncated at ``max_episode_steps``, ``info["is_success"]``.

        Raises:
            ActionError: wrong shape or non-finite values.
        """
        a = coerce_action(self.env_spec.action, action)
        self.mirror._apply_action(a)  # the MuJoCo task's controller -> ctrl
        self.scene.control(self.mirror.data.ctrl[self._act])
        self.scene.step()
        self._pull_state()
        self.elapsed_steps += 1
        success = bool(self.mirror._is_success())
        truncated = self.elapsed_steps >= self.env_spec.max_episode_steps
        return self.mirror._observation(), float(success), success, truncated, {"is_success": success}

    def render(self) -> np.ndarray | None:
        """A ``render_size`` RGB uint8 frame of the Genesis state (MuJoCo renderer), or None without render_mode."""
        return self.mirror.render()

    def close(self) -> None:
        """Free the mirror's renderers (the Genesis scene stays alive for other envs sharing it)."""
        self.mirror.close()

    @property
    def task(self) -> str:
        """The current instruction (str)."""
        return self.mirror.task

    @property
    def robot(self) -> GantryController:
        """The gantry controller of the mirror; its ``ee_position`` / ``opening`` follow Genesis (privileged)."""
        return self.mirror.robot

    def body_position(self, body: str) -> np.ndarray:
        """World position of the MuJoCo body ``body`` as simulated by Genesis, m, ``(3,)``."""
        return self.mirror.body_position(body)

    def _pull_state(self) -> None:
        """Copy Genesis's gantry joints (positions, velocities) and cube pose into the mirror; refresh kinematics."""
        d = self.mirror.data
        d.qpos[self._qadr] = self.scene.robot_qpos()
        d.qvel[self._dadr] = self.scene.robot_qvel()
        if self._cube_adr is not None:
            d.qpos[self._cube_adr : self._cube_adr + 7] = self.scene.cube_qpos()
        mujoco.mj_kinematics(self.mirror.model, d)


class GenesisReachEnv(GenesisTaskEnv):
    """``reach`` on Genesis: state (ee xyz, target xyz), ``ee_delta`` action, success within 0.02 m."""

    name = "genesis_reach"
    mujoco_task = ReachEnv

    @property
    def target(self) -> np.ndarray:
        """Target position, m, ``(3,)``."""
        return self.mirror.target


class GenesisPickPlaceEnv(GenesisTaskEnv):
    """``pick_place`` on Genesis: pick the 4 cm cube with the parallel-jaw gripper and place it on the pad."""

    name = "genesis_pick_place"
    mujoco_task = PickPlaceEnv

    @property
    def object_position(self) -> np.ndarray:
        """Cube centre as simulated by Genesis, m, ``(3,)``."""
        return self.mirror.object_position

    @property
    def goal_position(self) -> np.ndarray:
        """Where the cube centre should end (pad centre raised by the cube's half size), m, ``(3,)``."""
        return self.mirror.goal_position


@with_env_config(GenesisTaskConfig)
def make_genesis_reach(**kwargs: Any) -> GenesisReachEnv:
    """Registry factory for ``genesis_reach`` (kwargs: :class:`GenesisTaskConfig`, checked by ``make_env``)."""
    return GenesisReachEnv(**kwargs)


@with_env_config(GenesisTaskConfig)
def make_genesis_pick_place(**kwargs: Any) -> GenesisPickPlaceEnv:
    """Registry factory for ``genesis_pick_place`` (kwargs: :class:`GenesisTaskConfig`, checked by ``make_env``)."""
    return GenesisPickPlaceEnv(**kwargs)
