"""Foreign gymnasium MuJoCo environments (``Reacher-v5``, ``Pusher-v5``) as policylink EnvAdapters.

Each env is wrapped by :class:`~policylink.adapters.env.GymEnvAdapter` through a declared key map: the
flat gymnasium observation becomes ``observation.state`` (float32, same values and order, per-dimension names
and units), and optionally ``env.render()`` from a top-down camera becomes ``observation.images.top``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import mujoco
import numpy as np

from policylink.adapters.env import GymEnvAdapter, ObsMap
from policylink.adapters.env_config import with_env_config
from policylink.adapters.obs_modes import OBS_MODES as ALL_OBS_MODES
from policylink.adapters.schema import IMAGE_PREFIX, STATE_KEY, ActionSpec, ControlMode, EnvSpec, FeatureSpec
from policylink.sim.mujoco.rendering import load_llvm_before_gl

REACHER_SUCCESS_TOLERANCE_M = 0.02
"""Reacher succeeds at a step when the fingertip is within this distance (xy plane, metres) of the target."""

PUSHER_SUCCESS_TOLERANCE_M = 0.08
"""Pusher succeeds at a step when the object's centre is within this distance (xy plane, metres) of the
goal's centre, i.e. over the red goal disk (radius 0.08 m; the object's radius is 0.05 m)."""

TOP_CAMERA = "top"
OBS_MODES = tuple(m for m in ALL_OBS_MODES if "proprio" not in m)  # a flat gym state has no proprio split


def reacher_success(raw_obs: np.ndarray, info: dict, env: gym.Env) -> bool:
    """Reacher-v5 success predicate: ``||fingertip - target||_xy < REACHER_SUCCESS_TOLERANCE_M``.

    Args:
        raw_obs: the gymnasium observation, float64 ``(10,)``; entries 8:10 are fingertip minus target (m).
        info, env: unused (the predicate is a function of the observation).
    """
    return bool(np.linalg.norm(raw_obs[8:10]) < REACHER_SUCCESS_TOLERANCE_M)


def pusher_success(raw_obs: np.ndarray, info: dict, env: gym.Env) -> bool:
    """Pusher-v5 success predicate: ``||object - goal||_xy < PUSHER_SUCCESS_TOLERANCE_M``.

    Args:
        raw_obs: the gymnasium observation, float64 ``(23,)``; 17:20 is the object's position and 20:23 the
            goal's, world frame (m).
        info, env: unused.
    """
    return bool(np.linalg.norm(raw_obs[17:19] - raw_obs[20:22]) < PUSHER_SUCCESS_TOLERANCE_M)


@dataclass(frozen=True)
class GymTaskConfig:
    """Keyword arguments of a foreign gymnasium MuJoCo env (:func:`make_foreign_env`); those after
    ``render_mode`` go to ``gymnasium.make`` and the gymnasium env (their defaults are gymnasium's).

    Attributes:
        obs_mode: ``"state"``, ``"image"`` or ``"state+image"``.
        image_size: side of the square top-camera frame, pixels.
        render_mode: None or ``"rgb_array"``.
        max_episode_steps: gymnasium's time limit, steps (None: the registered one; -1: none).
        disable_env_checker: skip gymnasium's env checker (None: gymnasium's default).
        xml_file: the MJCF model file.
        frame_skip: physics steps per control step.
        default_camera_config: gymnasium's free camera (``distance``, ``elevation``...; default: our top view).
        camera_id, camera_name: gymnasium's render camera.
        max_geom: gymnasium's renderer geom limit.
        visual_options: MuJoCo visual flags ``{mjtVisFlag: bool}``.
    """

    obs_mode: str = "state"
    image_size: int = 96
    render_mode: str | None = None
    max_episode_steps: int | None = None
    disable_env_checker: bool | None = None
    xml_file: str | None = None
    frame_skip: int | None = None
    default_camera_config: Mapping[str, Any] | None = None
    camera_id: int | None = None
    camera_name: str | None = None
    max_geom: int = 1000
    visual_options: Mapping[int, bool] | None = None


@dataclass(frozen=True)
class ReacherConfig(GymTaskConfig):
    """Keyword arguments of ``reacher``: :class:`GymTaskConfig` plus ``Reacher-v5``'s reward weights (``reward =
    -reward_dist_weight * distance - reward_control_weight * ||action||^2``)."""

    reward_dist_weight: float = 1.0
    reward_control_weight: float = 1.0


@dataclass(frozen=True)
class PusherConfig(GymTaskConfig):
    """Keyword arguments of ``pusher``: :class:`GymTaskConfig` plus ``Pusher-v5``'s reward weights (near: hand to
    object, dist: object to goal, control: ``||action||^2``)."""

    reward_near_weight: float = 0.5
    reward_dist_weight: float = 1.0
    reward_control_weight: float = 0.1


@with_env_config(ReacherConfig)
def make_reacher_env(
    obs_mode: str = "state", image_size: int = 96, render_mode: str | None = None, **kw: Any
) -> GymEnvAdapter:
    """gymnasium ``Reacher-v5`` as EnvAdapter ``reacher`` (2-link planar arm, 50 Hz, 50 steps).

    ``observation.state`` float32 ``(10,)``: cos/sin of both joint angles (1), target x/y (m), joint
    velocities (rad/s), fingertip minus target x/y (m). Action float32 ``(2,)``: joint torques in units of the
    actuator gear (one unit = 200 N*m), limits ``[-1, 1]``. ``info["is_success"]`` is True at each step where
    :func:`reacher_success` holds; episodes never terminate early (50-step time limit).

    Args:
        obs_mode: ``"state"``, ``"image"`` or ``"state+image"``.
        image_size: side of the square ``observation.images.top`` frame (uint8 RGB ``(S, S, 3)``), pixels.
        render_mode: ``None`` or ``"rgb_array"`` (forced to ``"rgb_array"`` when images are observed).
        **kw: passed to ``gymnasium.make`` (the fields of :class:`ReacherConfig` after ``render_mode``; ``make_env``
            checks them).

    Raises:
        ValueError: unknown ``obs_mode``, ``image_size < 1``, or a render mode that conflicts with images.
    """
    return make_foreign_env(REACHER, obs_mode=obs_mode, image_size=image_size, render_mode=render_mode, **kw)


@with_env_config(PusherConfig)
def make_pusher_env(
    obs_mode: str = "state", image_size: int = 96, render_mode: str | None = None, **kw: Any
) -> GymEnvAdapter:
    """gymnasium ``Pusher-v5`` as EnvAdapter ``pusher`` (7-DoF arm pushes a cylinder to a goal, 20 Hz, 100 steps).

    ``observation.state`` float32 ``(23,)``: 7 joint angles (rad), 7 joint velocities (rad/s), hand
    (``tips_arm`` frame), object and goal positions x/y/z (m, world frame). Action float32 ``(7,)``: joint
    torques (N*m), limits ``[-2, 2]``. ``info["is_success"]`` is True at each step where
    :func:`pusher_success` holds. Arguments and errors as in :func:`make_reacher_env`.
    """
    return make_foreign_env(PUSHER, obs_mode=obs_mode, image_size=image_size, render_mode=render_mode, **kw)


@dataclass(frozen=True)
class ForeignTask:
    """How one gymnasium MuJoCo env maps onto the contract.

    Attributes:
        name: our registry name (``EnvSpec.name``).
        gym_id: gymnasium id, e.g. ``"Reacher-v5"``.
        state_layout: ``model -> (names, units)`` of the flat gymnasium observation, one entry per dimension.
        success_fn: ``(raw_obs, info, env) -> bool``.
        top_camera: gymnasium ``default_camera_config`` of the top-down camera (image up = world +y,
            image right = world +x).
    """

    name: str
    gym_id: str
    state_layout: Callable[[mujoco.MjModel], tuple[tuple[str, ...], tuple[str, ...]]]
    success_fn: Callable[[Any, dict, gym.Env], bool]
    top_camera: dict[str, Any]


def make_foreign_env(
    task: ForeignTask, obs_mode: str = "state", image_size: int = 96, render_mode: str | None = None, **kw: Any
) -> GymEnvAdapter:
    """Build ``task``'s gymnasium env and wrap it through its key map (see :func:`make_reacher_env`).

    The EnvSpec is read from the model: action names are the actuated joints, limits the actuator control
    ranges, units ``N*m`` times the actuator gear; control frequency ``1 / (timestep * frame_skip)`` Hz;
    ``max_episode_steps`` from gymnasium's registration (or ``kw["max_episode_steps"]``).

    Raises:
        ValueError: unknown ``obs_mode``, ``image_size < 1``, or ``render_mode`` other than None/"rgb_array"
            while images are observed.
    """
    if obs_mode not in OBS_MODES:
        raise ValueError(f"obs_mode: expected one of {list(OBS_MODES)}, received {obs_mode!r}")
    if int(image_size) < 1:
        raise ValueError(f"image_size: expected a positive number of pixels, received {image_size}")
    want_images = "image" in obs_mode
    if want_images and render_mode not in (None, "rgb_array"):
        raise ValueError(
            f"render_mode: expected None or 'rgb_array' with obs_mode={obs_mode!r} "
            f"(images come from env.render()), received {render_mode!r}"
        )
    size = int(image_size)
    foreign_render = "rgb_array" if want_images else render_mode
    kw.setdefault("default_camera_config", dict(task.top_camera))
    if foreign_render is not None:
        load_llvm_before_gl()
    env = gym.make(task.gym_id, render_mode=foreign_render, width=size, height=size, **kw)
    mj = env.unwrapped
    _fast_offscreen(mj.model, size)
    names, units = task.state_layout(mj.model)
    features: dict[str, FeatureSpec] = {}
    obs_map: dict[str, ObsMap] = {}
    if obs_mode != "image":
        features[STATE_KEY] = FeatureSpec("float32", (len(names),), names=names, unit=",".join(units))
        obs_map[STATE_KEY] = ObsMap(source=None)
    if want_images:
        key = IMAGE_PREFIX + TOP_CAMERA
        features[key] = FeatureSpec("uint8", (size, size, 3), unit="rgb")
        obs_map[key] = ObsMap(source="render")
    max_steps = kw.get("max_episode_steps") or gym.spec(task.gym_id).max_episode_steps
    spec = EnvSpec(
        name=task.name,
        observation_features=features,
        action=_action_spec(mj.model),
        control_frequency=1.0 / float(mj.dt),
        max_episode_steps=int(max_steps),
    )
    return GymEnvAdapter(env, spec, obs_map, success_fn=task.success_fn)


def foreign_mujoco_env(env: gym.Env) -> Any:
    """The gymnasium ``MujocoEnv`` (with ``.model`` / ``.data``) inside a policylink foreign-env adapter.

    Accepts the :class:`GymEnvAdapter` itself or any gymnasium wrapper around it.

    Raises:
        TypeError: ``env`` does not wrap a gymnasium MuJoCo env.
    """
    adapter = env.unwrapped
    inner = getattr(adapter, "env", None)
    mj = inner.unwrapped if inner is not None else None
    if mj is None or not hasattr(mj, "model") or not hasattr(mj, "data"):
        raise TypeError(
            f"env: expected a GymEnvAdapter around a gymnasium MuJoCo env, received {type(adapter).__name__}"
        )
    return mj


def _action_spec(model: mujoco.MjModel) -> ActionSpec:
    joints = [mujoco.mj_id2name(model, mujoco.mjtObj.mjOBJ_JOINT, int(j)) for j in model.actuator_trnid[:, 0]]
    gears = model.actuator_gear[:, 0]
    units = tuple("N*m" if g == 1.0 else f"{g:g}*N*m" for g in gears)
    low, high = model.actuator_ctrlrange[:, 0], model.actuator_ctrlrange[:, 1]
    return ActionSpec(
        names=tuple(joints),
        control_mode=ControlMode.JOINT_TORQUE,
        units=units,
        low=tuple(float(x) for x in low),
        high=tuple(float(x) for x in high),
    )


def _fast_offscreen(model: mujoco.MjModel, size: int) -> None:
    """No shadows, no multisampling, offscreen buffer sized to the frame (DESIGN.md 5: ~30x faster on llvmpipe)."""
    model.vis.quality.shadowsize = 0
    model.vis.quality.offsamples = 0
    model.vis.global_.offwidth = size
    model.vis.global_.offheight = size


def _joint_name(model: mujoco.MjModel, j: int) -> str:
    return mujoco.mj_id2name(model, mujoco.mjtObj.mjOBJ_JOINT, j)


def _reacher_layout(model: mujoco.MjModel) -> tuple[tuple[str, ...], tuple[str, ...]]:
    arm = [_joint_name(model, j) for j in range(2)]
    target = [_joint_name(model, j) for j in range(2, 4)]  # target_x, target_y slide joints
    names = (
        [f"{j}_cos" for j in arm]
        + [f"{j}_sin" for j in arm]
        + target
        + [f"{j}_vel" for j in arm]
        + ["fingertip_to_target_x", "fingertip_to_target_y"]
    )
    units = ["1"] * 4 + ["m"] * 2 + ["rad/s"] * 2 + ["m"] * 2
    return tuple(names), tuple(units)


def _pusher_layout(model: mujoco.MjModel) -> tuple[tuple[str, ...], tuple[str, ...]]:
    arm = [_joint_name(model, j) for j in range(7)]
    points = [f"{body}_{axis}" for body in ("tips_arm", "object", "goal") for axis in "xyz"]
    names = arm + [f"{j}_vel" for j in arm] + points
    units = ["rad"] * 7 + ["rad/s"] * 7 + ["m"] * 9
    return tuple(names), tuple(units)


REACHER = ForeignTask(
    name="reacher",
    gym_id="Reacher-v5",
    state_layout=_reacher_layout,
    success_fn=reacher_success,
    top_camera={
        "trackbodyid": -1,
        "distance": 0.8,
        "elevation": -90.0,
        "azimuth": 90.0,
        "lookat": np.array([0.0, 0.0, 0.0]),
    },
)
PUSHER = ForeignTask(
    name="pusher",
    gym_id="Pusher-v5",
    state_layout=_pusher_layout,
    success_fn=pusher_success,
    top_camera={
        "trackbodyid": -1,
        "distance": 1.0,
        "elevation": -90.0,
        "azimuth": 90.0,
        "lookat": np.array([0.45, -0.2, -0.3]),
    },
)
