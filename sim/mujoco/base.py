"""Shared machinery of the policylink MuJoCo tasks: model loading, seeded resets, 10 Hz control with physics
substeps, observation assembly (state / images / task), perturbations and rendering.

A task subclasses :class:`MujocoTaskEnv`, names its MJCF file and its state layout, and implements episode
sampling, action application, the state vector and the success predicate.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from importlib.resources import files
from typing import Any, ClassVar

import mujoco
import numpy as np

from policylink.adapters.env import EnvAdapter
from policylink.adapters.obs_modes import OBS_MODES, obs_mode_parts
from policylink.adapters.pointmaps import POINTMAP_PREFIX, POINTMAP_UNIT
from policylink.adapters.schema import (
    FAULT_INFO,
    IMAGE_PREFIX,
    REALITY_GAP_INFO,
    STATE_KEY,
    TASK_KEY,
    ActionSpec,
    EnvSpec,
    FeatureSpec,
)
from policylink.adapters.validation import STEP_BEFORE_RESET, coerce_action
from policylink.sim.mujoco.cameras import CameraPoseShift, apply_camera_pose_shift, mujoco_pointmap
from policylink.sim.mujoco.gap import RealityGap, load_gap
from policylink.sim.mujoco.gap_runtime import MAX_ANGULAR_SPEED, MAX_SPEED, GapRuntime, physics_fault
from policylink.sim.mujoco.perturbations import PerturbationConfig, Perturber
from policylink.sim.mujoco.randomization import RandomizationConfig, SceneRandomizer
from policylink.sim.mujoco.rendering import FrameRenderer, configure_visual_quality

CONTROL_FREQUENCY_HZ = 10.0
MAX_DEPTH_M = 2.0  # pointmap range, metres; farther pixels (beyond the 1 m table, background) are invalid
MAX_IMAGE_SIDE = 4096  # pixels; camera frames and the offscreen buffer are allocated at this size
# module-level names: the step's hot path (no module attribute lookups per step)
_mj_step, _mj_kinematics = mujoco.mj_step, mujoco.mj_kinematics
_array, _asarray, _float32, _isfinite = np.array, np.asarray, np.float32, math.isfinite


def asset_path(filename: str) -> str:
    """Absolute path of an MJCF file shipped in ``policylink.sim.mujoco/assets``."""
    return str(files("policylink.sim.mujoco").joinpath("assets", filename))


def _checked_args(obs_mode: str, render_mode: str | None, image_size: Any) -> tuple[int, int]:
    """``(height, width)`` of ``image_size`` in pixels after checking the constructor's arguments.

    Raises:
        ValueError: an unknown ``obs_mode`` or ``render_mode``, or an ``image_size`` that is not an int or
            ``(H, W)`` in ``1..MAX_IMAGE_SIDE``.
    """
    if obs_mode not in OBS_MODES:
        raise ValueError(f"obs_mode: expected one of {OBS_MODES}, received {obs_mode!r}")
    if render_mode not in (None, "rgb_array"):
        raise ValueError(f"render_mode: expected None or 'rgb_array', received {render_mode!r}")
    height, width = (image_size, image_size) if np.isscalar(image_size) else tuple(image_size)
    if not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in (height, width)) or not (
        1 <= height <= MAX_IMAGE_SIDE and 1 <= width <= MAX_IMAGE_SIDE
    ):
        raise ValueError(
            f"image_size: expected an int or (H, W) of ints in 1..{MAX_IMAGE_SIDE} pixels, received {image_size!r}"
        )
    return int(height), int(width)


class MujocoTaskEnv(EnvAdapter):
    """Base class of the MuJoCo tasks (an :class:`~policylink.adapters.env.EnvAdapter`).

    Step contract (the same for a :class:`~policylink.adapters.transport.RemoteEnv` serving this env):
    :meth:`reset` first, then :meth:`step` with any array-like of ``A`` numbers, converted with
    ``np.asarray(action, dtype=np.float32)`` and checked for shape ``(A,)`` and finite values; actions outside
    the limits are clipped to the ActionSpec's ``[low, high]``.

    Args:
        obs_mode: ``"state"`` (``observation.state`` only), ``"image"`` (camera frames only),
            ``"state+image"``, or ``"image+proprio"``: camera frames plus an ``observation.state`` that holds only
            the robot's own leading ``n_proprio`` entries (e.g. the pusher's x, y; the objects' poses must come
            from the pixels; gym-pusht's ``pixels_agent_pos``); every mode adds the ``task`` instruction (str).
        image_size: frame size, ``int`` (square) or ``(H, W)``, pixels (default 96).
        cameras: camera names for image observations (default: the task's ``default_cameras``); known
            cameras are ``"top"`` (straight down, image right = world +x, up = world +y) and ``"front"``.
        render_quality: ``"fast"`` (no shadows, no multisampling) or ``"pretty"`` (for videos).
        perturbation: a :class:`PerturbationConfig` (or a mapping of its fields, e.g. ``{"displacement": 0.03,
            "force": 2.0}`` from ``--env_kwargs``), or None for none.
        render_mode: ``"rgb_array"`` makes :meth:`render` return a ``render_size`` frame of the first camera.
        randomization: visual randomisation bounds (a :class:`RandomizationConfig` or a mapping of its fields;
            default :class:`RandomizationConfig`).
        render_size: side of the :meth:`render` frame, pixels (default 256).
        camera_pose_shift: a :class:`~policylink.sim.mujoco.cameras.CameraPoseShift` (or a mapping of its
            fields, e.g. ``{"yaw_deg": 20}`` from ``--env_kwargs``) moving every camera about ``workspace_center``
            (evaluation under an unseen viewpoint); None keeps the nominal cameras.
        gap: a reality gap (:class:`~policylink.sim.mujoco.gap.RealityGap`, a mapping of its fields, a preset
            name such as ``"worn_gantry"`` or a YAML file): dynamics and sensing differences drawn per episode
            (seeded by the reset seed), applied after the visual randomisation; the reset info carries the
            episode's values as JSON under ``"reality_gap"``. None: the nominal simulator.

    Raises:
        ValueError: an unknown ``obs_mode``, ``render_quality`` or ``render_mode``, a bad ``image_size`` or
            ``perturbation``.
        KeyError: an unknown camera name.
    """

    metadata: ClassVar[dict[str, Any]] = {"render_modes": ["rgb_array"], "render_fps": int(CONTROL_FREQUENCY_HZ)}
    name: ClassVar[str]
    xml_file: ClassVar[str]
    max_episode_steps: ClassVar[int]
    state_names: ClassVar[tuple[str, ...]]
    state_unit: ClassVar[str] = "m"
    n_proprio: ClassVar[int]  # leading entries of ``state_names`` that describe the robot itself
    proprio_unit: ClassVar[str] = "m"  # unit string of those entries (``image+proprio`` mode)
    default_cameras: ClassVar[tuple[str, ...]] = ("front",)
    randomized_geoms: ClassVar[tuple[str, ...]] = ()
    main_object: ClassVar[str]  # body moved by displacement / force perturbations
    workspace_center: ClassVar[tuple[float, float, float]] = (0.0, 0.0, 0.0)  # m, pivot of camera_pose_shift
    instructions: ClassVar[tuple[str, ...]]

    def __init__(
        self,
        obs_mode: str = "state",
        image_size: int | tuple[int, int] = 96,
        cameras: tuple[str, ...] | None = None,
        render_quality: str = "fast",
        perturbation: PerturbationConfig | Mapping[str, Any] | None = None,
        render_mode: str | None = None,
        randomization: RandomizationConfig | Mapping[str, Any] | None = None,
        render_size: int = 256,
        camera_pose_shift: CameraPoseShift | Mapping[str, Any] | None = None,
        gap: RealityGap | Mapping[str, Any] | str | None = None,
    ):
        height, width = _checked_args(obs_mode, render_mode, image_size)
        perturbation = PerturbationConfig.coerce(perturbation)
        self.obs_mode, self.render_mode, self.render_quality = obs_mode, render_mode, render_quality
        self.model = mujoco.MjModel.from_xml_path(asset_path(self.xml_file))
        self.data = mujoco.MjData(self.model)
        self.n_substeps = int(round(1.0 / (CONTROL_FREQUENCY_HZ * self.model.opt.timestep)))
        self._body_views: dict[str, np.ndarray] = {}
        self._setup()
        parts = self._init_observation(obs_mode, cameras)
        self.camera_pose_shift = CameraPoseShift.coerce(camera_pose_shift)
        if self.camera_pose_shift is not None:
            apply_camera_pose_shift(self.model, self.camera_pose_shift, np.asarray(self.workspace_center))
        buf = (max(height, render_size if render_mode else 0), max(width, render_size if render_mode else 0))
        configure_visual_quality(self.model, render_quality, *buf)
        self._renderer = FrameRenderer(self.model, height, width) if parts & {"image", "pointmap"} else None
        self._video_renderer = FrameRenderer(self.model, render_size, render_size) if render_mode else None
        self.randomization = RandomizationConfig.coerce(randomization)
        self._randomizer = SceneRandomizer(self.model, self.randomization, self.randomized_geoms)
        self.perturbation = perturbation
        action = self._init_action(perturbation, gap)
        self._has_goal_distance = type(self).goal_distance is not MujocoTaskEnv.goal_distance
        self._start_distance = 0.0
        self._main_body = self.model.body(self.main_object).id
        # the step's fast path: a state-only observation built inline (no reality gap to apply to it)
        self._state_only = self._use_state and not (self._use_images or self._use_pointmaps) and self._gap is None
        self.env_spec = EnvSpec(
            name=self.name,
            observation_features=self._observation_features(height, width),
            action=action,
            control_frequency=CONTROL_FREQUENCY_HZ,
            max_episode_steps=self.max_episode_steps,
            tasks=self.instructions,
        )
        self._init_spaces()
        self.task = self.instructions[0]
        self.elapsed_steps = 0
        self._needs_reset = True
        # a valid state right away, but no GL context yet: AsyncVectorEnv builds a dummy env in the parent and
        # then forks; an EGL context inherited across fork hangs the children
        self._reset_physics({})

    def _init_observation(self, obs_mode: str, cameras: tuple[str, ...] | None) -> set[str]:
        """Cameras (checked against the model's) and which observation parts this obs mode builds; returns the
        parts of :func:`obs_mode_parts`. Raises KeyError naming an unknown camera and the known ones."""
        self.cameras = tuple(cameras) if cameras is not None else self.default_cameras
        known = [self.model.camera(i).name for i in range(self.model.ncam)]
        for cam in self.cameras:
            if cam not in known:
                raise KeyError(f"cameras: expected names from {known}, received {cam!r}")
        parts = obs_mode_parts(obs_mode)
        self._use_state = obs_mode != "image"
        self._n_state = self.n_proprio if "proprio" in parts else len(self.state_names)
        self._use_images, self._use_pointmaps = "image" in parts, "pointmap" in parts
        self._full_state = self._n_state == len(self.state_names)
        return parts

    def _init_action(self, perturbation: PerturbationConfig | None, gap: Any) -> ActionSpec:
        """The action spec, its limits as the step reads them, and what acts on an action before the physics:
        the perturbation's :class:`Perturber` and the reality gap's :class:`GapRuntime` (each None when absent;
        ``_hooked`` says whether either is there). Returns the action spec."""
        action = self._action_spec()
        self._low, self._high = action.low_array, action.high_array
        # per dimension (index, low, high): the float32 limits as Python floats, one tuple unpack per dimension a step
        self._limits = tuple(zip(range(len(self._low)), self._low.tolist(), self._high.tolist()))
        self._action_shape = self._low.shape
        self._perturber = (
            Perturber(perturbation, self._low, self._high, self._hold_action())
            if perturbation is not None and perturbation.active
            else None
        )
        self.reality_gap = load_gap(gap)
        self._gap = (
            None
            if self.reality_gap is None
            else GapRuntime(
                self.model,
                self.reality_gap,
                action,
                self.n_proprio,
                np.asarray(self.workspace_center),
                self._hold_action(),
            )
        )
        self._hooked = self._perturber is not None or self._gap is not None  # something acts on the action
        return action

    def _observation_features(self, height: int, width: int) -> dict[str, FeatureSpec]:
        """The observation features of this obs mode: state (all task state or proprio only), one RGB image and/or
        pointmap per camera at ``(height, width)``, and the instruction."""
        features: dict[str, FeatureSpec] = {}
        if self._use_state:
            names = self.state_names[: self._n_state]
            unit = self.state_unit if len(names) == len(self.state_names) else self.proprio_unit
            features[STATE_KEY] = FeatureSpec("float32", (len(names),), names=names, unit=unit)
        if self._use_images:
            for cam in self.cameras:
                features[IMAGE_PREFIX + cam] = FeatureSpec("uint8", (height, width, 3), unit="rgb")
        if self._use_pointmaps:
            for cam in self.cameras:
                features[POINTMAP_PREFIX + cam] = FeatureSpec("float32", (height, width, 3), unit=POINTMAP_UNIT)
        features[TASK_KEY] = FeatureSpec("string", ())
        return features

    # ----------------------------------------------------------------------------------------- task hooks
    def _setup(self) -> None:
        """Build task-specific handles (robot controller, body ids) once the model and data exist."""
        raise NotImplementedError

    def _action_spec(self) -> ActionSpec:
        """The task's ActionSpec (physical units)."""
        raise NotImplementedError

    def _hold_action(self) -> np.ndarray:
        """The action that holds the robot still, float32 ``(A,)`` (zero displacement, gripper open)."""
        return np.zeros(len(self._action_spec().names), dtype=np.float32)

    def _sample_episode(self, rng: np.random.Generator, options: dict[str, Any]) -> None:
        """Set object, goal and robot poses in ``self.data`` for a new episode (after ``mj_resetData``)."""
        raise NotImplementedError

    def _apply_action(self, action: list[float] | np.ndarray) -> None:
        """Turn a clipped action ``(A,)`` into actuator commands: ``A`` Python floats (the per-step path) or a float32
        array (callers outside :meth:`step`)."""
        raise NotImplementedError

    def _observe(self) -> tuple[list[float], bool]:
        """The full ``observation.state`` as ``D`` Python floats (float64, before the float32 cast) in the order of
        ``state_names``, and the task's success predicate, both from one read of the physics state (the per-step
        path computes them once and shares them)."""
        raise NotImplementedError

    def _state(self) -> np.ndarray:
        """The ``observation.state`` vector, float32 ``(D,)`` in the order of ``state_names``."""
        return np.array(self._observe()[0], np.float32)

    def _is_success(self) -> bool:
        """The task's success predicate on the current state."""
        return self._observe()[1]

    def goal_distance(self, state: np.ndarray) -> np.ndarray | None:
        """Dimensionless distance to the goal of ``observation.state`` rows float ``(N, D)`` -> float64 ``(N,)``
        (0 at the goal), or None when the task defines none. ``info["progress"]`` is ``1 - d_t / d_0`` of it
        (:func:`policylink.data.labels.progress_from_distance`: ALTER's relative progress)."""
        return None

    def goal_distance_now(self, state: list[float]) -> float | None:
        """:meth:`goal_distance` of one state given as Python floats (the per-step path), or None. Tasks override
        it with the same formula on floats (no array dispatch); the result is bit for bit the vectorised one
        (``tests/sim/test_step_reference.py`` checks every task) on any machine only if the two paths share one
        function or use only correctly rounded IEEE operations (``+ - * /``, ``sqrt``): numpy's array
        transcendentals (``np.arctan2``, ``np.sin``...) take CPU-dependent SIMD paths that differ from ``math``."""
        d = self.goal_distance(np.array([state]))
        return None if d is None else float(d[0])

    def _info(self, success: bool, state: np.ndarray, start: bool = False) -> dict[str, Any]:
        """The reset info (:meth:`step` writes the same out): ``{"is_success": success}`` plus, for tasks with a goal
        distance, ``"progress": 1 - d_t / d_0`` (``d_0`` at reset, ``start=True``; 1 when the episode starts at the
        goal). ``state``: the current full float32 state vector ``(D,)`` (the distance is taken on its float32
        values)."""
        if not self._has_goal_distance or (d := self.goal_distance_now(state.tolist())) is None:
            return {"is_success": success}
        if start:
            self._start_distance = d
        d0 = self._start_distance
        return {"is_success": success, "progress": 1.0 - d / d0 if d0 > 0 else 1.0}

    # ---------------------------------------------------------------------------------------- gymnasium API
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        """Start a new episode from scratch: physics, controller, perturbations, visuals, task.

        A seeded reset is reproducible; an unseeded one continues the env's generator (a new episode).
        ``options["task"]`` selects an instruction from ``env_spec.tasks`` where the task supports it.
        Derived quantities (body and site positions, rendered frames) are valid on return (``mj_forward``).

        Returns:
            ``(observation, info)`` with ``info["is_success"]`` (bool).
        """
        super().reset(seed=seed)
        self._reset_physics(dict(options or {}), seed)
        self._needs_reset = False
        values, success = self._observe()
        state = np.array(values, np.float32)
        obs, info = self._observation(state), self._info(success, state, start=True)
        if self._gap is None:
            return obs, info
        return self._gap.observe(obs), {**info, REALITY_GAP_INFO: self._gap.episode_gap.to_json()}

    def _reset_physics(self, options: dict[str, Any], seed: int | None = None) -> None:
        """Everything of :meth:`reset` except building the observation (so no frame is rendered)."""
        mujoco.mj_resetData(self.model, self.data)
        self._randomizer.apply(self.np_random)
        if self._gap is not None:
            self._gap.reset(seed)
        self._sample_episode(self.np_random, options)
        if self._perturber is not None:
            self._perturber.reset(self.np_random)
        self.elapsed_steps = 0
        mujoco.mj_forward(self.model, self.data)

    def step(self, action: np.ndarray):
        """Advance one control step (``1 / 10`` s = ``n_substeps`` physics steps).

        Args:
            action: an array-like ``(A,)`` in the ActionSpec's units (any float dtype; converted to float32);
                actions outside the limits are clipped to them.

        Returns:
            ``(obs, reward, terminated, truncated, info)``: reward 1.0 on success else 0.0, terminated on
            success, truncated at ``max_episode_steps``, ``info["is_success"]`` and, for tasks with a
            :meth:`goal_distance`, ``info["progress"]``. With a reality gap, a step whose physics diverged
            (:meth:`physics_fault`) ends the episode as a failure: terminated, reward 0, ``is_success`` False and
            ``info["fault"]`` saying why.

        Raises:
            RuntimeError: ``step`` before the first :meth:`reset` (``"step() before reset(): call reset() first"``).
            ActionError: ``action`` is None or not numeric, not shape ``(A,)``, or holds NaN/inf (names the
                dimension).
        """
        if self._needs_reset:
            raise RuntimeError(STEP_BEFORE_RESET)
        a = self._clipped_action(action)
        if self._hooked:  # no perturbation and no reality gap: one check a step, nothing else
            if self._perturber is not None:
                a = self._perturb(a)
            if self._gap is not None:
                a = self._gap.action(a)
        self._apply_action(a)
        model, data = self.model, self.data
        _mj_step(model, data, nstep=self.n_substeps)
        _mj_kinematics(model, data)
        self.elapsed_steps += 1
        values, success = self._observe()  # once per step: observation, success and progress share it
        state = _array(values, _float32)
        # _info(success, state) written out: a Python call costs ~0.1 us (0.14 % of a reach step) after the physics
        if self._has_goal_distance and (d := self.goal_distance_now(state.tolist())) is not None:
            d0 = self._start_distance
            info = {"is_success": success, "progress": 1.0 - d / d0 if d0 > 0 else 1.0}
        else:
            info = {"is_success": success}
        if self._state_only:  # the observation without a call: the same dict _observation builds
            obs = {STATE_KEY: state if self._full_state else state[: self._n_state], TASK_KEY: self.task}
        else:
            obs = self._observation(state)
            if self._gap is not None:
                obs = self._gap.observe(obs)
                if (fault := physics_fault(self)) is not None:  # diverged: a failure, the episode ends here
                    info = {**info, "is_success": False, FAULT_INFO: fault}
                    return obs, 0.0, True, self.elapsed_steps >= self.max_episode_steps, info
        return obs, 1.0 if success else 0.0, success, self.elapsed_steps >= self.max_episode_steps, info

    def physics_fault(self, max_speed: float = MAX_SPEED, max_angular_speed: float = MAX_ANGULAR_SPEED) -> str | None:
        """Why this env's physics diverged, or None (:func:`~policylink.sim.mujoco.gap_runtime.physics_fault`: a
        non-finite ``qpos``/``qvel``, a linear speed above ``max_speed`` m/s or an angular one above
        ``max_angular_speed`` rad/s). A gapped env runs this check after every step itself; the sim-as-real robot
        calls it on any task."""
        return physics_fault(self, max_speed, max_angular_speed)

    def _clipped_action(self, action: Any) -> list[float]:
        """:func:`~policylink.adapters.validation.coerce_action` (same values, same errors) as ``A`` Python floats,
        with a fast path for the common case, a finite ``(A,)`` array-like: convert to float32, check, clip each
        number against the float32 limits (comparisons on floats, ties taking the limit: the values of ``np.clip``,
        signed zeros included)."""
        try:
            a = _asarray(action, _float32)
        except (TypeError, ValueError):
            a = None
        # float32 values summed in float64 cannot overflow: the sum is finite iff every value is
        if a is None or a.shape != self._action_shape or not _isfinite(sum(values := a.tolist())):
            return coerce_action(self.env_spec.action, action).tolist()  # raises the contract's ActionError
        for i, lo, hi in self._limits:  # a plain loop: half a list comprehension's cost right after the physics
            v = values[i]
            if v <= lo:  # ties take the limit, as np.clip does (-0.0 against a 0.0 limit gives 0.0)
                values[i] = lo
            elif v >= hi:
                values[i] = hi
        return values

    def privileged_state(self) -> np.ndarray:
        """The full ``observation.state`` vector in every ``obs_mode``, float32 ``(D,)`` in the order of
        ``state_names``: what scripted experts read when the observation hides the objects' poses."""
        return self._state()

    def render(self) -> np.ndarray | None:
        """A ``render_size`` RGB uint8 frame of the first camera (``render_mode="rgb_array"``), else None."""
        if self._video_renderer is None:
            return None
        return self._video_renderer.render(self.data, self.cameras[0])

    def close(self) -> None:
        """Free the renderers' GL contexts."""
        for r in (self._renderer, self._video_renderer):
            if r is not None:
                r.close()

    # -------------------------------------------------------------------------------------------- helpers
    def _observation(self, state: np.ndarray | None = None) -> dict[str, Any]:
        """The observation dict; ``state``: the current full state vector when the caller has it."""
        obs: dict[str, Any] = {}
        if self._use_state:
            state = self._state() if state is None else state
            obs[STATE_KEY] = state if self._full_state else state[: self._n_state]
        if self._use_images:
            for cam in self.cameras:
                obs[IMAGE_PREFIX + cam] = self._renderer.render(self.data, cam)
        if self._use_pointmaps:
            for cam in self.cameras:
                depth = self._renderer.render_depth(self.data, cam)
                obs[POINTMAP_PREFIX + cam] = mujoco_pointmap(self.model, self.data, cam, depth, MAX_DEPTH_M).points
        obs[TASK_KEY] = self.task
        return obs

    def _perturb(self, action: list[float]) -> list[float]:
        """The perturbed action (Python floats) of the clipped ``action``, after moving or pushing the object."""
        p, rng = self._perturber, self.np_random
        offset = p.displacement(self.elapsed_steps, rng)
        if offset is not None:
            self.displace_body(self.main_object, offset)
        self.data.xfrc_applied[self._main_body, :3] = p.force(rng)
        return p.action(np.array(action, np.float32), rng).tolist()

    def displace_body(self, body: str, offset: np.ndarray) -> None:
        """Move ``body`` (free joint or mocap) by the planar ``offset`` (m, ``(2,)``) and refresh kinematics."""
        b = self.model.body(body)
        if b.mocapid[0] >= 0:
            self.data.mocap_pos[b.mocapid[0], :2] += offset
        else:
            adr = self.model.jnt_qposadr[b.jntadr[0]]
            self.data.qpos[adr : adr + 2] += offset
        mujoco.mj_kinematics(self.model, self.data)

    def set_free_body(self, body: str, position: np.ndarray, yaw: float = 0.0) -> None:
        """Place free-joint ``body`` at ``position`` (m, ``(3,)``) rotated by ``yaw`` (rad) about z, at rest."""
        j = self.model.body(body).jntadr[0]
        adr, vadr = self.model.jnt_qposadr[j], self.model.jnt_dofadr[j]
        self.data.qpos[adr : adr + 3] = position
        self.data.qpos[adr + 3 : adr + 7] = (np.cos(yaw / 2), 0.0, 0.0, np.sin(yaw / 2))
        self.data.qvel[vadr : vadr + 6] = 0.0

    def body_position(self, body: str) -> np.ndarray:
        """World position of ``body``'s frame, m, ``(3,)`` (a view into ``data.xpos``)."""
        view = self._body_views.get(body)
        if view is None:
            view = self._body_views[body] = self.data.xpos[self.model.body(body).id]
        return view
