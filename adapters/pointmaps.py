"""Robot-centric pointmaps: depth images turned into images of base-frame XYZ (metres), one function for every
RGB-D source (simulated or real) in the convention camera drivers give.

A pointmap keeps the ``H x W`` grid that image encoders expect, but each pixel holds the 3-D position of the
scene point it sees, expressed in the robot's base frame, so a policy reads positions in the frame its actions
are in, whatever the camera's placement ("pointmaps for VLAs": robot-centric pointmaps as policy input).

Conventions (OpenCV / ROS optical frame, what RGB-D drivers report):

- ``depth``: z-depth in metres ``(H, W)`` (distance along the camera's optical axis, not along the ray);
- ``K``: the 3x3 pinhole matrix ``[[fx, s, cx], [0, fy, cy], [0, 0, 1]]`` in pixels, pixel centres at integer
  coordinates, ``u`` = column (right), ``v`` = row (down);
- ``T_base_camera``: the 4x4 rigid pose of the camera in the robot base frame (maps camera coordinates to base
  coordinates), camera axes x right, y down, z forward;
- output indexed ``[row, col]``: ``points[v, u]`` is the base-frame XYZ of pixel ``(u, v)``.

Invalid pixels (non-finite, zero or negative depth, or depth beyond ``max_depth``) are written as exact zeros
``(0, 0, 0)`` and reported in the boolean ``valid`` mask. Zeros rather than NaN: observations must be finite
(:meth:`FeatureSpec.check`), and dataset statistics, normalisers, encoders and the wire codec then need no
special case; the statistics of a pointmap feature skip all-zero pixels (:func:`pointmap_valid`).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

POINTMAP_PREFIX = "observation.pointmaps."
"""Key prefix of pointmap features: ``observation.pointmaps.<camera>``, float32 ``(H, W, 3)``, metres, base frame."""

POINTMAP_UNIT = "m (x, y, z in the robot base frame)"
"""``FeatureSpec.unit`` of a pointmap feature."""

DEFAULT_MAX_DEPTH_M = 3.0
"""Default range limit (metres): farther pixels (background) are invalid."""

_RIGID_TOL = 1e-4


class Pointmap(NamedTuple):
    """A pointmap and its validity mask.

    Attributes:
        points: float32 ``(H, W, 3)``, metres, base frame; ``(0, 0, 0)`` at invalid pixels.
        valid: bool ``(H, W)``, True where the depth was finite, positive and within range.
    """

    points: np.ndarray
    valid: np.ndarray


def check_intrinsics(K: np.ndarray, field: str = "K") -> np.ndarray:
    """Return ``K`` as float64 ``(3, 3)`` after checking it is an upper-triangular pinhole matrix.

    Raises:
        ValueError: the shape is not ``(3, 3)``, values are not finite, ``fx``/``fy`` are not positive, or the
            matrix is not of the form ``[[fx, s, cx], [0, fy, cy], [0, 0, 1]]`` (a transposed ``K`` has ``cx``,
            ``cy`` in its bottom row and is rejected here).
    """
    K = np.asarray(K, dtype=np.float64)
    if K.shape != (3, 3):
        raise ValueError(f"{field}: expected a 3x3 pinhole matrix, received shape {K.shape}")
    if not np.isfinite(K).all():
        raise ValueError(f"{field}: expected finite values, received {K.tolist()}")
    if K[1, 0] != 0 or K[2, 0] != 0 or K[2, 1] != 0 or K[2, 2] != 1:
        raise ValueError(
            f"{field}: expected [[fx, s, cx], [0, fy, cy], [0, 0, 1]] (not transposed), received {K.tolist()}"
        )
    if K[0, 0] <= 0 or K[1, 1] <= 0:
        raise ValueError(f"{field}: expected positive focal lengths fx, fy, received ({K[0, 0]}, {K[1, 1]})")
    return K


def check_rigid_transform(T: np.ndarray, field: str = "T_base_camera") -> np.ndarray:
    """Return ``T`` as float64 ``(4, 4)`` after checking it is a rigid transform (rotation + translation).

    Raises:
        ValueError: the shape is not ``(4, 4)``, values are not finite, the last row is not ``[0, 0, 0, 1]``,
            or the 3x3 block is not a proper rotation (``R^T R = I`` and ``det R = +1`` within 1e-4).
    """
    T = np.asarray(T, dtype=np.float64)
    if T.shape != (4, 4):
        raise ValueError(f"{field}: expected a 4x4 homogeneous transform, received shape {T.shape}")
    if not np.isfinite(T).all():
        raise ValueError(f"{field}: expected finite values, received {T.tolist()}")
    if not np.allclose(T[3], (0.0, 0.0, 0.0, 1.0)):
        raise ValueError(f"{field}: expected last row [0, 0, 0, 1], received {T[3].tolist()}")
    R = T[:3, :3]
    err = float(np.abs(R.T @ R - np.eye(3)).max())
    det = float(np.linalg.det(R))
    if err > _RIGID_TOL or abs(det - 1.0) > _RIGID_TOL:
        raise ValueError(
            f"{field}: expected a rigid transform (orthonormal rotation, det +1), received a 3x3 block with "
            f"max |R^T R - I| = {err:.3g} and det = {det:.4g}"
        )
    return T


def depth_to_pointmap(
    depth: np.ndarray, K: np.ndarray, T_base_camera: np.ndarray, max_depth: float = DEFAULT_MAX_DEPTH_M
) -> Pointmap:
    """Back-project a z-depth image into base-frame XYZ per pixel.

    For pixel ``(u, v)`` (column, row) with depth ``d``: ``p_cam = d * K^-1 [u, v, 1]^T`` (camera x right,
    y down, z forward), then ``p_base = R p_cam + t`` with ``T_base_camera = [[R, t], [0, 1]]``.

    Args:
        depth: z-depth, metres, ``(H, W)``, any real dtype.
        K: 3x3 pinhole matrix, pixels (see :func:`check_intrinsics`).
        T_base_camera: 4x4 pose of the OpenCV-convention camera in the robot base frame.
        max_depth: range limit, metres (> 0); pixels with depth above it are invalid.

    Returns:
        :class:`Pointmap`: ``points`` float32 ``(H, W, 3)`` metres (zeros where invalid), ``valid`` bool
        ``(H, W)``.

    Raises:
        ValueError: ``depth`` is not 2-D real numbers, ``max_depth`` is not a positive finite number, or ``K`` /
            ``T_base_camera`` fail their checks (each message names the field).
    """
    depth = np.asarray(depth)
    if depth.ndim != 2 or depth.dtype.kind not in "fiu" or min(depth.shape) < 1:
        raise ValueError(f"depth: expected real z-depth (H, W) in metres, received {depth.dtype} {depth.shape}")
    if not (np.isfinite(max_depth) and max_depth > 0):
        raise ValueError(f"max_depth: expected a positive finite range in metres, received {max_depth!r}")
    K = check_intrinsics(K)
    T = check_rigid_transform(T_base_camera)
    h, w = depth.shape
    d = depth.astype(np.float64)
    valid = np.isfinite(d) & (d > 0) & (d <= max_depth)
    d = np.where(valid, d, 0.0)
    v, u = np.meshgrid(np.arange(h, dtype=np.float64), np.arange(w, dtype=np.float64), indexing="ij")
    fx, s, cx, fy, cy = K[0, 0], K[0, 1], K[0, 2], K[1, 1], K[1, 2]
    y_n = (v - cy) / fy
    x_n = (u - cx - s * y_n) / fx
    cam = np.stack([x_n * d, y_n * d, d], axis=-1)  # (H, W, 3) camera frame
    points = cam @ T[:3, :3].T + T[:3, 3]
    points[~valid] = 0.0
    return Pointmap(points.astype(np.float32), valid)


def pointmap_valid(points: np.ndarray) -> np.ndarray:
    """The validity mask of stored pointmaps ``(..., 3)``: True where a pixel is not the exact ``(0, 0, 0)`` fill.

    A genuine scene point exactly at the base origin in all three coordinates would read as invalid; back-
    projected float depth essentially never lands there.
    """
    return np.any(np.asarray(points) != 0, axis=-1)


def is_pointmap_key(key: str) -> bool:
    """True for ``observation.pointmaps.<camera>`` keys."""
    return key.startswith(POINTMAP_PREFIX)


def pointmap_to_chw(points: np.ndarray, key: str = "pointmap") -> np.ndarray:
    """Convert pointmaps ``(..., H, W, 3)`` to float32 channel-first ``(..., 3, H, W)`` (values unchanged, metres),
    the layout image encoders take.

    Raises:
        ValueError: the last axis is not 3 or the dtype is not floating point (names ``key``).
    """
    points = np.asarray(points)
    if points.ndim < 3 or points.shape[-1] != 3 or points.dtype.kind != "f":
        raise ValueError(f"{key}: expected float pointmaps (..., H, W, 3), received {points.dtype} {points.shape}")
    return np.ascontiguousarray(np.moveaxis(points.astype(np.float32, copy=False), -1, -3))


__all__ = [
    "DEFAULT_MAX_DEPTH_M",
    "POINTMAP_PREFIX",
    "POINTMAP_UNIT",
    "Pointmap",
    "check_intrinsics",
    "check_rigid_transform",
    "depth_to_pointmap",
    "is_pointmap_key",
    "pointmap_to_chw",
    "pointmap_valid",
]
