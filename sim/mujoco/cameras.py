"""MuJoCo cameras as RGB-D sensors: pinhole intrinsics, OpenCV-convention extrinsics in the robot base frame,
pointmaps through :func:`policylink.adapters.pointmaps.depth_to_pointmap`, and the evaluation-time camera pose
shift (yaw / pitch / distance about the workspace centre).

MuJoCo cameras follow the OpenGL convention (x right, y up, looking along -z); the OpenCV convention the
adapters function takes has y down and z forward, so the rotation is right-multiplied by ``diag(1, -1, -1)``
here, once. The tasks' robot base frame is the world frame (the gantries' axes are the world axes, origin at
the table centre, table top at z = 0).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import mujoco
import numpy as np

from policylink.adapters.pointmaps import DEFAULT_MAX_DEPTH_M, Pointmap, depth_to_pointmap
from policylink.sim.mujoco.env_kwargs import checked_mapping

GL_TO_CV = np.diag([1.0, -1.0, -1.0])
"""Right-multiplied into a MuJoCo (OpenGL) camera rotation: y up / looking along -z -> y down / z forward."""


@dataclass(frozen=True)
class CameraPoseShift:
    """A rigid move of every camera about the workspace centre ``c`` (applied to the nominal pose, before the
    per-episode jitter of :class:`~policylink.sim.mujoco.randomization.RandomizationConfig`).

    Attributes:
        yaw_deg: rotation about the vertical (world z) axis through ``c``, degrees (positive = counter-
            clockwise seen from above).
        pitch_deg: rotation about the horizontal axis through ``c`` along the camera's right (x) axis, degrees,
            right-hand rule: positive lowers a camera that looks down at ``c`` (a smaller elevation angle), still
            aimed at ``c``; a straight-down camera moves toward its image-bottom side.
        distance_m: change of the camera's distance to ``c`` along the line through ``c``, metres (positive
            moves it away).

    Raises:
        ValueError: a non-finite value, a pitch outside [-89, 89] degrees, or a distance change that would put
            the camera at or behind ``c`` (checked when applied).
    """

    yaw_deg: float = 0.0
    pitch_deg: float = 0.0
    distance_m: float = 0.0

    def __post_init__(self) -> None:
        for name in ("yaw_deg", "pitch_deg", "distance_m"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ValueError(f"camera_pose_shift.{name}: expected a finite number, received {value!r}")
        if abs(self.pitch_deg) > 89.0:
            raise ValueError(f"camera_pose_shift.pitch_deg: expected a value in [-89, 89], received {self.pitch_deg}")

    @classmethod
    def coerce(cls, value: CameraPoseShift | Mapping[str, Any] | None) -> CameraPoseShift | None:
        """A :class:`CameraPoseShift` from itself, a mapping of its fields (env kwargs from YAML/JSON), or None.

        Raises:
            ValueError: an unknown field or another type (the message lists the fields), or a field that is not a
                number (names the field).
        """
        checked = checked_mapping(cls, value, "camera_pose_shift")
        if checked is None:
            return value
        out = {}
        for k, v in checked.items():
            try:
                out[k] = float(v)
            except (TypeError, ValueError):
                raise ValueError(f"camera_pose_shift.{k}: expected a number, received {v!r}") from None
        return cls(**out)


def rotation_about(axis: np.ndarray, angle: float) -> np.ndarray:
    """Rodrigues rotation matrix float64 ``(3, 3)`` of ``angle`` (rad) about the unit ``axis`` ``(3,)``."""
    a = np.asarray(axis, np.float64) / np.linalg.norm(axis)
    k = np.array([[0.0, -a[2], a[1]], [a[2], 0.0, -a[0]], [-a[1], a[0], 0.0]])
    return np.eye(3) + math.sin(angle) * k + (1.0 - math.cos(angle)) * (k @ k)


def shift_camera_pose(
    position: np.ndarray, rotation: np.ndarray, shift: CameraPoseShift, center: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Move one camera pose (world position ``(3,)``, world-from-camera rotation ``(3, 3)``) by ``shift`` about
    ``center`` ``(3,)``: pitch about the horizontal axis along the camera's x, then yaw about world z, then
    ``distance_m`` along the line from ``center``. Returns the new ``(position, rotation)``, float64.

    Raises:
        ValueError: the distance change puts the camera at or behind ``center`` (names ``distance_m``).
    """
    p, R, c = (np.asarray(v, np.float64) for v in (position, rotation, center))
    x_axis = R[:, 0] * np.array([1.0, 1.0, 0.0])
    if np.linalg.norm(x_axis) > 1e-9 and shift.pitch_deg != 0.0:
        Rp = rotation_about(x_axis, math.radians(shift.pitch_deg))
        p, R = c + Rp @ (p - c), Rp @ R
    Ry = rotation_about(np.array([0.0, 0.0, 1.0]), math.radians(shift.yaw_deg))
    p, R = c + Ry @ (p - c), Ry @ R
    r = float(np.linalg.norm(p - c))
    if r + shift.distance_m <= 1e-3:
        raise ValueError(
            f"camera_pose_shift.distance_m: expected more than {-r:.3f} m (camera {r:.3f} m from the workspace "
            f"centre), received {shift.distance_m}"
        )
    if r > 0:
        p = c + (p - c) * (r + shift.distance_m) / r
    return p, R


def apply_camera_pose_shift(model: mujoco.MjModel, shift: CameraPoseShift, center: np.ndarray) -> None:
    """Move every camera of ``model`` (``cam_pos``, ``cam_quat``; world-attached cameras) by ``shift``.

    Call before building the :class:`~policylink.sim.mujoco.randomization.SceneRandomizer`, which saves the
    nominal camera positions it jitters around.
    """
    for i in range(model.ncam):
        R = np.zeros(9)
        mujoco.mju_quat2Mat(R, model.cam_quat[i])
        p, R2 = shift_camera_pose(model.cam_pos[i], R.reshape(3, 3), shift, center)
        q = np.zeros(4)
        mujoco.mju_mat2Quat(q, R2.reshape(-1))
        model.cam_pos[i], model.cam_quat[i] = p, q


def camera_intrinsics(model: mujoco.MjModel, camera: str, height: int, width: int) -> np.ndarray:
    """The 3x3 pinhole matrix (pixels, OpenCV convention: pixel centres at integer coordinates) of ``camera``
    rendered at ``height x width``: ``fy = fx = (H / 2) / tan(fovy / 2)`` (MuJoCo's square pixels, vertical
    field of view), ``cx = (W - 1) / 2``, ``cy = (H - 1) / 2``."""
    fovy = math.radians(float(model.cam_fovy[model.camera(camera).id]))
    f = (height / 2.0) / math.tan(fovy / 2.0)
    return np.array([[f, 0.0, (width - 1) / 2.0], [0.0, f, (height - 1) / 2.0], [0.0, 0.0, 1.0]])


def camera_pose_opencv(model: mujoco.MjModel, data: mujoco.MjData, camera: str) -> np.ndarray:
    """``T_base_camera`` float64 ``(4, 4)``: the camera's current pose in the base (= world) frame, axes in the
    OpenCV convention (x right, y down, z forward). Needs ``data.cam_xpos`` / ``cam_xmat`` current
    (``mj_kinematics`` or ``mj_camlight``)."""
    cid = model.camera(camera).id
    T = np.eye(4)
    T[:3, :3] = data.cam_xmat[cid].reshape(3, 3) @ GL_TO_CV
    T[:3, 3] = data.cam_xpos[cid]
    return T


def mujoco_pointmap(
    model: mujoco.MjModel, data: mujoco.MjData, camera: str, depth: np.ndarray, max_depth: float = DEFAULT_MAX_DEPTH_M
) -> Pointmap:
    """The base-frame pointmap of a MuJoCo z-depth frame ``(H, W)`` (metres) of ``camera``, through the same
    :func:`~policylink.adapters.pointmaps.depth_to_pointmap` real RGB-D cameras use."""
    h, w = depth.shape
    return depth_to_pointmap(
        depth, camera_intrinsics(model, camera, h, w), camera_pose_opencv(model, data, camera), max_depth
    )


__all__ = [
    "GL_TO_CV",
    "CameraPoseShift",
    "apply_camera_pose_shift",
    "camera_intrinsics",
    "camera_pose_opencv",
    "mujoco_pointmap",
    "rotation_about",
    "shift_camera_pose",
]
