"""ALOHA sim (gym-aloha 0.1.1's scenes and tasks; Zhao et al. 2023, arXiv 2304.13705, section V-A) as an
EnvAdapter. Runs INSIDE the ALOHA venv (``policylink envs install aloha``), served by
:mod:`policylink.sim.isolated.server`: it imports the contract (``policylink.adapters``), numpy, dm_control and
gym-aloha (MuJoCo 2.3.7), never torch or our own MuJoCo tasks. The host side is :mod:`policylink.sim.isolated.aloha`.

The env is gym-aloha's joint-position scene driven through dm_control as gym-aloha's ``AlohaEnv`` does (same XML,
``control_timestep`` 0.02 s, the task's ``before_step`` and contact-based reward), with three differences: the task
renders nothing unless an image is observed (gym-aloha's tasks render three 480x640 cameras every step); the ``top``
camera is rendered at the chosen size with ``physics.render``, without shadows or multisampling; seeding is kept in
the adapter (gym-aloha draws the object poses from ``sample_box_pose(seed)`` / ``sample_insertion_pose(seed)``; so
does :meth:`reset`, so a seed gives gym-aloha's own initial state). Success is gym-aloha's: the task's reward reaches
its ``max_reward`` (4: cube held by the left gripper off the table; peg touching the socket's pin).
"""

from __future__ import annotations

import collections
from typing import Any

import numpy as np

from policylink.adapters.env import EnvAdapter
from policylink.adapters.obs_modes import check_obs_mode
from policylink.adapters.schema import (
    ENV_STATE_KEY,
    FAULT_INFO,
    IMAGE_PREFIX,
    STATE_KEY,
    TASK_KEY,
    ActionSpec,
    ControlMode,
    EnvSpec,
    FeatureSpec,
)
from policylink.adapters.validation import STEP_BEFORE_RESET, coerce_action
from policylink.sim.isolated.aloha_script import EPISODE_STEPS, SCRIPTS, ee_action, joint_actions

TASKS: tuple[str, ...] = ("transfer_cube", "insertion")
"""The simulated ALOHA tasks."""

INSTRUCTIONS: dict[str, str] = {
    "transfer_cube": "pick up the red cube with the right arm and hand it over to the left arm",
    "insertion": "pick up the socket with the left arm and the peg with the right arm and insert the peg in the socket",
}
"""Language instruction per task, from the ACT paper's task descriptions (section V-A)."""

OBS_MODES: tuple[str, ...] = ("state", "image", "state+image", "image+proprio")
"""The observation modes this env takes."""

CAMERA = "top"
"""The camera observed in the image modes (the ACT paper's sim setting)."""

DT = 0.02
"""Control period, seconds (50 Hz; gym-aloha's ``DT``)."""

_ARM = ("waist", "shoulder", "elbow", "forearm_roll", "wrist_angle", "wrist_rotate")
JOINT_NAMES: tuple[str, ...] = tuple(f"{side}_{j}" for side in ("left", "right") for j in (*_ARM, "gripper"))
"""The 14-d joint state and action (gym-aloha's ``agent_pos`` and action order): per arm (left first) 6 joint
angles (rad) and the gripper opening, normalised (0 closed, 1 open)."""
_ARM_LOW = (-3.14158, -1.85005, -1.76278, -3.14158, -1.8675, -3.14158)
_ARM_HIGH = (3.14158, 1.25664, 1.6057, 3.14158, 2.23402, 3.14158)

ACTION_SPEC = ActionSpec(
    names=JOINT_NAMES,
    control_mode=ControlMode.JOINT_POSITION,
    units=(("rad",) * 6 + ("1",)) * 2,
    low=(*_ARM_LOW, 0.0) * 2,
    high=(*_ARM_HIGH, 1.0) * 2,
)
"""Absolute joint targets (the position actuators' control ranges of gym-aloha's XML) and normalised gripper
openings (gym-aloha maps them to finger positions)."""

_POSE = ("x", "y", "z", "qw", "qx", "qy", "qz")
OBJECT_NAMES: dict[str, tuple[str, ...]] = {
    "transfer_cube": tuple(f"cube_{c}" for c in _POSE),
    "insertion": tuple(f"{o}_{c}" for o in ("peg", "socket") for c in _POSE),
}
"""The objects' pose dimensions per task (free-joint qpos: position in m, orientation wxyz)."""


def image_shape(image_size: int) -> tuple[int, int, int]:
    """``(H, W, 3)`` of a ``top`` frame of height ``image_size``: the width keeps the camera's 640x480 aspect
    (``round(4 H / 3)``). Raises ValueError when ``image_size < 1``."""
    if int(image_size) < 1:
        raise ValueError(f"image_size: expected a positive number of pixels, received {image_size}")
    h = int(image_size)
    return h, int(round(h * 4 / 3)), 3


def observation_features(task: str, obs_mode: str, image_size: int, env_state: bool) -> dict[str, FeatureSpec]:
    """The observation features of ``task`` in ``obs_mode``: ``observation.state`` (``state`` modes: the 14 joints
    and the objects' poses; ``image+proprio``: the 14 joints), ``observation.images.top``, optionally
    ``observation.environment_state`` (the objects' poses) and ``task``.

    Raises:
        ValueError: unknown ``task``, ``obs_mode`` or a bad ``image_size``.
    """
    if task not in TASKS:
        raise ValueError(f"task: expected one of {list(TASKS)}, received {task!r}")
    check_obs_mode(obs_mode, OBS_MODES)
    objects = OBJECT_NAMES[task]
    pose_units = ("m",) * 3 + ("1",) * 4
    joint_units = (("rad",) * 6 + ("1",)) * 2
    features: dict[str, FeatureSpec] = {}
    if obs_mode in ("state", "state+image"):
        names = JOINT_NAMES + objects
        units = joint_units + pose_units * (len(objects) // 7)
        features[STATE_KEY] = FeatureSpec("float32", (len(names),), names=names, unit=",".join(units))
    elif obs_mode == "image+proprio":
        features[STATE_KEY] = FeatureSpec("float32", (14,), names=JOINT_NAMES, unit=",".join(joint_units))
    if "image" in obs_mode:
        features[IMAGE_PREFIX + CAMERA] = FeatureSpec("uint8", image_shape(image_size), unit="rgb")
    if env_state:
        units = pose_units * (len(objects) // 7)
        features[ENV_STATE_KEY] = FeatureSpec("float32", (len(objects),), names=objects, unit=",".join(units))
    features[TASK_KEY] = FeatureSpec("string", ())
    return features


class AlohaAdapter(EnvAdapter):
    """One simulated ALOHA task behind the contract.

    Observations: see :func:`observation_features` (``observation.images.top`` uint8 ``(H, 4H/3, 3)``,
    ``observation.state`` float32, ``task``). ``info["is_success"]``: the task's reward reached its maximum (4)
    at this step; the episode terminates there (gym-aloha's ``AlohaEnv`` does the same) and is truncated at
    ``max_episode_steps``; ``info["reward_stage"]``: the reward (0-4: touched, lifted, transfer attempted,
    transferred; or both touched, both grasped, peg in contact, inserted). With ``expert_actions`` each reset rolls
    the scripted end-effector policy (:mod:`.aloha_script`) out in the mocap twin scene with the same object poses
    and every reset/step info carries ``info["expert_action"]``: float32 ``(14,)``, the joint target for the
    current step (the last one once the script's 401 are used up).

    Args:
        env: the joint-position dm_control ``control.Environment`` (its task renders nothing).
        ee_env: the mocap twin ``control.Environment``, needed for ``expert_actions``.
        task: ``"transfer_cube"`` or ``"insertion"``.
        sample_pose: ``seed -> float (7,) or (14,)`` the objects' initial poses (gym-aloha's samplers).
        set_pose: ``pose -> None`` stores the pose the next ``env.reset()`` / ``ee_env.reset()`` uses.
        obs_mode, image_size, env_state, expert_actions, max_episode_steps, render_mode: see
            :class:`~policylink.sim.isolated.aloha.AlohaConfig`.
        physics_error: the exception ``env.step`` raises on unstable physics (dm_control's ``PhysicsError``):
            such a step ends the episode as a failure (terminated, reward 0, ``info["fault"]`` saying why, the
            previous observation), as a gapped MuJoCo task's diverged step does.

    Raises:
        ValueError: unknown ``task``/``obs_mode``, ``image_size < 1``, ``max_episode_steps`` outside
            ``1..400``, ``expert_actions`` without ``ee_env``, a ``render_mode`` other than None/``rgb_array``.
    """

    metadata: dict[str, Any] = {"render_modes": ["rgb_array"]}

    def __init__(
        self,
        env: Any,
        ee_env: Any,
        task: str,
        sample_pose: Any,
        set_pose: Any,
        obs_mode: str = "state",
        image_size: int = 96,
        env_state: bool = False,
        expert_actions: bool = False,
        max_episode_steps: int | None = None,
        render_mode: str | None = None,
        physics_error: type[BaseException] = ArithmeticError,
    ):
        features = observation_features(task, obs_mode, image_size, bool(env_state))
        steps = EPISODE_STEPS if max_episode_steps is None else int(max_episode_steps)
        if not 1 <= steps <= EPISODE_STEPS:
            raise ValueError(f"max_episode_steps: expected 1..{EPISODE_STEPS} (the paper's), received {steps}")
        if expert_actions and ee_env is None:
            raise ValueError("expert_actions: expected the mocap twin env (ee_env), received None")
        if render_mode not in (None, "rgb_array"):
            raise ValueError(f"render_mode: expected None or 'rgb_array', received {render_mode!r}")
        self.env, self.ee_env, self.task_name, self.obs_mode = env, ee_env, task, obs_mode
        self.sample_pose, self.set_pose = sample_pose, set_pose
        self.shape = image_shape(image_size)
        self.env_state, self.expert_actions, self.render_mode = bool(env_state), bool(expert_actions), render_mode
        self.task = INSTRUCTIONS[task]
        self.env_spec = EnvSpec(
            name=f"aloha/{task}",
            observation_features=features,
            action=ACTION_SPEC,
            control_frequency=1.0 / DT,
            max_episode_steps=steps,
            tasks=(self.task,),
        )
        self._init_spaces()
        self._plan = np.zeros((0, 14), np.float32)
        self._t, self._needs_reset, self._render_ready = 0, True, False
        self._last_obs: dict[str, Any] = {}
        self._physics_error = physics_error

    @property
    def physics(self) -> Any:
        """The joint scene's ``dm_control.mujoco.Physics``."""
        return self.env.physics

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[dict[str, Any], dict]:
        """Place the objects (gym-aloha's sampler on ``seed``; unseeded: a seed drawn from the env's generator) and
        the arms at their start pose; with ``expert_actions`` roll the script out first. Returns ``(obs, info)``
        with ``info["is_success"] = False``."""
        super().reset(seed=seed)
        draw = int(self.np_random.integers(2**31 - 1)) if seed is None else int(seed)
        pose = np.asarray(self.sample_pose(draw), np.float64)
        self.set_pose(pose)
        if self.expert_actions:
            self._plan = scripted_rollout(self.ee_env, self.task_name, pose)
        self.env.reset()
        self._t, self._needs_reset = 0, False
        return self._remember(self._observation()), self._info(0)

    def step(self, action: Any) -> tuple[dict[str, Any], float, bool, bool, dict]:
        """Step with an array-like ``(14,)`` (:data:`ACTION_SPEC`, clipped to its limits); returns gymnasium's
        5-tuple (reward: the task's stage, 0-4).

        Raises:
            RuntimeError: ``step`` before ``reset``.
            ActionError: ``action`` is not numeric ``(14,)`` or not finite.
        """
        if self._needs_reset:
            raise RuntimeError(STEP_BEFORE_RESET)
        a = coerce_action(ACTION_SPEC, action)
        try:
            ts = self.env.step(a.astype(np.float64))
        except self._physics_error as e:  # the policy drove the physics unstable: a failed episode, not a crash
            self._t += 1
            self._needs_reset = True
            info = {**self._info(0.0), FAULT_INFO: f"physics diverged at step {self._t}: {e}"}
            return self._last_obs, 0.0, True, False, info
        self._t += 1
        reward = float(ts.reward or 0.0)
        success = reward >= float(self.env.task.max_reward)
        truncated = self._t >= self.env_spec.max_episode_steps
        self._needs_reset = success or truncated
        info = self._info(reward)
        info["is_success"] = success
        return self._remember(self._observation()), reward, success, truncated, info

    def render(self) -> np.ndarray:
        """uint8 ``(H, W, 3)``: the ``top`` camera's frame of the current state."""
        return self._render()

    def close(self) -> None:
        """Free the scenes' rendering contexts."""
        for env in (self.env, self.ee_env):
            if env is not None:
                try:
                    env.physics.free()
                except Exception:  # noqa: BLE001 (a GL context current on another thread; process exit frees it)
                    pass

    def object_pose(self) -> np.ndarray:
        """float64 ``(7,)`` or ``(14,)``: the objects' current poses (qpos after the 16 arm joints)."""
        return np.array(self.physics.data.qpos[16:], np.float64)

    def _remember(self, obs: dict[str, Any]) -> dict[str, Any]:
        self._last_obs = obs  # what a step whose physics diverged returns
        return obs

    def _observation(self) -> dict[str, Any]:
        obs: dict[str, Any] = {}
        joints = np.asarray(self.env.task.get_qpos(self.physics), np.float32)
        if self.obs_mode in ("state", "state+image"):
            obs[STATE_KEY] = np.concatenate([joints, self.object_pose().astype(np.float32)])
        elif self.obs_mode == "image+proprio":
            obs[STATE_KEY] = joints
        if "image" in self.obs_mode:
            obs[IMAGE_PREFIX + CAMERA] = self._render()
        if self.env_state:
            obs[ENV_STATE_KEY] = self.object_pose().astype(np.float32)
        obs[TASK_KEY] = self.task
        return obs

    def _info(self, reward: float) -> dict[str, Any]:
        info: dict[str, Any] = {"is_success": False, "reward_stage": float(reward)}
        if self.expert_actions:
            info["expert_action"] = self._plan[min(self._t, len(self._plan) - 1)].copy()
        return info

    def _render(self) -> np.ndarray:
        h, w, _ = self.shape
        if not self._render_ready:  # before dm_control makes its GL context (on first render, on this thread)
            vis = self.physics.model.vis
            vis.quality.shadowsize = 0  # DESIGN.md 5: no shadows or multisampling, buffer sized to the frame
            vis.quality.offsamples = 0  # (about 7x faster under software EGL: 455 -> 67 ms for 96x128)
            vis.global_.offwidth, vis.global_.offheight = w, h
            self._render_ready = True
        return np.ascontiguousarray(self.physics.render(height=h, width=w, camera_id=CAMERA))


def scripted_rollout(ee_env: Any, task: str, pose: np.ndarray) -> np.ndarray:
    """Roll the ACT script for ``task`` out in the mocap scene ``ee_env`` (its next reset places the objects at
    ``pose``) and return the joint-space replay: float32 ``(401, 14)`` (:func:`.aloha_script.joint_actions` of
    the reset state and the 400 steps' states).
    """
    ee_env.reset()
    physics = ee_env.physics
    mocap_left = np.concatenate([physics.data.mocap_pos[0], physics.data.mocap_quat[0]])
    mocap_right = np.concatenate([physics.data.mocap_pos[1], physics.data.mocap_quat[1]])
    left, right = SCRIPTS[task](mocap_left, mocap_right, pose)
    qpos = [ee_env.task.get_qpos(physics)]
    ctrl = [physics.data.ctrl.copy()]
    for t in range(EPISODE_STEPS):
        ee_env.step(ee_action(left, right, t))
        qpos.append(ee_env.task.get_qpos(physics))
        ctrl.append(physics.data.ctrl.copy())
    return joint_actions(np.stack(qpos), np.stack(ctrl))


def _lean_tasks() -> dict[str, tuple[type, type]]:
    """Task name -> (joint task class, mocap task class): gym-aloha's tasks with an observation that renders
    nothing (the adapter reads the physics itself) and, for the mocap twin, the object poses of
    :data:`_EE_POSE` instead of an unseeded draw."""
    from dm_control.suite import base
    from gym_aloha.tasks.sim import InsertionTask, TransferCubeTask
    from gym_aloha.tasks.sim_end_effector import InsertionEndEffectorTask, TransferCubeEndEffectorTask

    def lean_observation(self: Any, physics: Any) -> collections.OrderedDict:
        return collections.OrderedDict(qpos=self.get_qpos(physics))

    def ee_initialize_episode(self: Any, physics: Any) -> None:
        self.initialize_robots(physics)
        pose = _EE_POSE[0]
        physics.data.qpos[16 : 16 + len(pose)] = pose  # the free joints after the 16 arm joints, peg then socket
        base.Task.initialize_episode(self, physics)

    out = {}
    for name, joint_cls, ee_cls in (
        ("transfer_cube", TransferCubeTask, TransferCubeEndEffectorTask),
        ("insertion", InsertionTask, InsertionEndEffectorTask),
    ):
        lean_joint = type(f"Lean{joint_cls.__name__}", (joint_cls,), {"get_observation": lean_observation})
        lean_ee = type(
            f"Lean{ee_cls.__name__}",
            (ee_cls,),
            {"get_observation": lean_observation, "initialize_episode": ee_initialize_episode},
        )
        out[name] = (lean_joint, lean_ee)
    return out


_EE_POSE: list[Any] = [None]
"""The object poses the mocap twin's next reset uses (set with gym-aloha's ``BOX_POSE`` by the adapter)."""


def make_aloha_env(task: str, expert_actions: bool = True, **kwargs: Any) -> AlohaAdapter:
    """Build gym-aloha's ``task`` scene (joint position control, 50 Hz) and, with ``expert_actions`` (default on:
    ``record --expert expert`` reads it; one 400-step scripted rollout per reset), its mocap twin; ``kwargs`` as
    :class:`AlohaAdapter` (``obs_mode``, ``image_size``, ``env_state``, ``max_episode_steps``, ``render_mode``).

    Raises:
        ValueError: ``task`` is no ALOHA task, or the adapter's errors.
        ImportError: gym-aloha or dm_control is not installed (run ``policylink envs install aloha``).
    """
    if task not in TASKS:
        raise ValueError(f"task: expected one of {list(TASKS)}, received {task!r}")
    from dm_control import mujoco
    from dm_control.rl import control
    from gym_aloha.constants import ASSETS_DIR
    from gym_aloha.tasks import sim
    from gym_aloha.utils import sample_box_pose, sample_insertion_pose

    joint_cls, ee_cls = _lean_tasks()[task]

    def build(xml: str, task_obj: Any) -> Any:
        physics = mujoco.Physics.from_xml_path(str(ASSETS_DIR / xml))
        return control.Environment(
            physics, task_obj, float("inf"), control_timestep=DT, n_sub_steps=None, flat_observation=False
        )

    env = build(f"bimanual_viperx_{task}.xml", joint_cls())
    ee_env = build(f"bimanual_viperx_end_effector_{task}.xml", ee_cls()) if expert_actions else None

    def sample_pose(seed: int) -> np.ndarray:
        if task == "transfer_cube":
            return sample_box_pose(seed)
        return np.concatenate(sample_insertion_pose(seed))

    def set_pose(pose: np.ndarray) -> None:
        sim.BOX_POSE[0] = np.array(pose)  # read by gym-aloha's joint task at reset
        _EE_POSE[0] = np.array(pose)

    return AlohaAdapter(
        env,
        ee_env,
        task,
        sample_pose,
        set_pose,
        expert_actions=expert_actions,
        physics_error=control.PhysicsError,
        **kwargs,
    )
