"""Explicit rotation conversions (numpy only), so a convention is converted once, at the edge.

Conventions (all batched over leading dims, float64 math, returned in the input's float dtype):
- ``quat_wxyz``: ``(..., 4)`` scalar-first unit quaternion (MuJoCo's order).
- ``quat_xyzw``: ``(..., 4)`` scalar-last unit quaternion (ROS, SciPy order).
- ``matrix``: ``(..., 3, 3)`` rotation matrix acting on column vectors.
- ``rot6d``: ``(..., 6)`` first two *columns* of the matrix, concatenated (Zhou et al., "On the Continuity
  of Rotation Representations in Neural Networks", CVPR 2019).
- ``axis_angle``: ``(..., 3)`` rotation vector, axis times angle in radians.
- ``euler_xyz``: ``(..., 3)`` extrinsic X-then-Y-then-Z angles in radians: ``R = Rz(c) @ Ry(b) @ Rx(a)``
  (roll, pitch, yaw).
"""

from __future__ import annotations

import numpy as np

from policylink.adapters.schema import RotationConvention

_EPS = 1e-12


def quat_wxyz_to_xyzw(q: np.ndarray) -> np.ndarray:
    """Reorder ``(..., 4)`` quaternions from scalar-first ``(w, x, y, z)`` to scalar-last ``(x, y, z, w)``."""
    q = _check_last(q, 4, "quaternion")
    return np.concatenate([q[..., 1:], q[..., :1]], axis=-1)


def quat_xyzw_to_wxyz(q: np.ndarray) -> np.ndarray:
    """Reorder ``(..., 4)`` quaternions from scalar-last ``(x, y, z, w)`` to scalar-first ``(w, x, y, z)``."""
    q = _check_last(q, 4, "quaternion")
    return np.concatenate([q[..., 3:], q[..., :3]], axis=-1)


def quat_wxyz_to_matrix(q: np.ndarray) -> np.ndarray:
    """``(..., 4)`` scalar-first quaternion (normalised here) -> ``(..., 3, 3)`` rotation matrix."""
    q = _check_last(q, 4, "quaternion").astype(np.float64)
    norm = np.linalg.norm(q, axis=-1, keepdims=True)
    if np.any(norm < _EPS):
        raise ValueError("quaternion: expected non-zero norm, received a zero quaternion")
    w, x, y, z = np.moveaxis(q / norm, -1, 0)
    m = np.stack(
        [
            1 - 2 * (y * y + z * z),
            2 * (x * y - z * w),
            2 * (x * z + y * w),
            2 * (x * y + z * w),
            1 - 2 * (x * x + z * z),
            2 * (y * z - x * w),
            2 * (x * z - y * w),
            2 * (y * z + x * w),
            1 - 2 * (x * x + y * y),
        ],
        axis=-1,
    )
    return m.reshape(q.shape[:-1] + (3, 3))


def quat_xyzw_to_matrix(q: np.ndarray) -> np.ndarray:
    """``(..., 4)`` scalar-last quaternion -> ``(..., 3, 3)`` rotation matrix."""
    return quat_wxyz_to_matrix(quat_xyzw_to_wxyz(q))


def matrix_to_quat_wxyz(m: np.ndarray) -> np.ndarray:
    """``(..., 3, 3)`` rotation matrix -> ``(..., 4)`` scalar-first unit quaternion with ``w >= 0``.

    Uses Shepperd's method (branch on the largest diagonal term) for numerical stability.
    """
    m = _check_matrix(m).astype(np.float64)
    flat = m.reshape(-1, 3, 3)
    out = np.empty((flat.shape[0], 4))
    for i, r in enumerate(flat):
        tr = np.trace(r)
        if tr > 0:
            s = 2.0 * np.sqrt(tr + 1.0)
            out[i] = [0.25 * s, (r[2, 1] - r[1, 2]) / s, (r[0, 2] - r[2, 0]) / s, (r[1, 0] - r[0, 1]) / s]
        elif r[0, 0] > r[1, 1] and r[0, 0] > r[2, 2]:
            s = 2.0 * np.sqrt(1.0 + r[0, 0] - r[1, 1] - r[2, 2])
            out[i] = [(r[2, 1] - r[1, 2]) / s, 0.25 * s, (r[0, 1] + r[1, 0]) / s, (r[0, 2] + r[2, 0]) / s]
        elif r[1, 1] > r[2, 2]:
            s = 2.0 * np.sqrt(1.0 + r[1, 1] - r[0, 0] - r[2, 2])
            out[i] = [(r[0, 2] - r[2, 0]) / s, (r[0, 1] + r[1, 0]) / s, 0.25 * s, (r[1, 2] + r[2, 1]) / s]
        else:
            s = 2.0 * np.sqrt(1.0 + r[2, 2] - r[0, 0] - r[1, 1])
            out[i] = [(r[1, 0] - r[0, 1]) / s, (r[0, 2] + r[2, 0]) / s, (r[1, 2] + r[2, 1]) / s, 0.25 * s]
    out *= np.where(out[:, :1] < 0, -1.0, 1.0)
    out /= np.linalg.norm(out, axis=-1, keepdims=True)
    return out.reshape(m.shape[:-2] + (4,))


def matrix_to_quat_xyzw(m: np.ndarray) -> np.ndarray:
    """``(..., 3, 3)`` rotation matrix -> ``(..., 4)`` scalar-last unit quaternion with ``w >= 0``."""
    return quat_wxyz_to_xyzw(matrix_to_quat_wxyz(m))


def matrix_to_rot6d(m: np.ndarray) -> np.ndarray:
    """``(..., 3, 3)`` matrix -> ``(..., 6)``: first column then second column (Zhou et al. 2019)."""
    m = _check_matrix(m)
    return np.concatenate([m[..., :, 0], m[..., :, 1]], axis=-1)


def rot6d_to_matrix(r: np.ndarray) -> np.ndarray:
    """``(..., 6)`` -> ``(..., 3, 3)`` by Gram-Schmidt on the two columns (Zhou et al. 2019)."""
    r = _check_last(r, 6, "rot6d").astype(np.float64)
    a1, a2 = r[..., :3], r[..., 3:]
    b1 = a1 / np.maximum(np.linalg.norm(a1, axis=-1, keepdims=True), _EPS)
    a2 = a2 - np.sum(b1 * a2, axis=-1, keepdims=True) * b1
    b2 = a2 / np.maximum(np.linalg.norm(a2, axis=-1, keepdims=True), _EPS)
    b3 = np.cross(b1, b2)
    return np.stack([b1, b2, b3], axis=-1)


def axis_angle_to_matrix(v: np.ndarray) -> np.ndarray:
    """``(..., 3)`` rotation vector (radians) -> ``(..., 3, 3)`` by Rodrigues' formula."""
    v = _check_last(v, 3, "axis_angle").astype(np.float64)
    theta = np.linalg.norm(v, axis=-1, keepdims=True)
    k = v / np.maximum(theta, _EPS)
    kx, ky, kz = np.moveaxis(k, -1, 0)
    zero = np.zeros_like(kx)
    kmat = np.stack([zero, -kz, ky, kz, zero, -kx, -ky, kx, zero], axis=-1).reshape(v.shape[:-1] + (3, 3))
    t = theta[..., None]
    return np.eye(3) + np.sin(t) * kmat + (1 - np.cos(t)) * (kmat @ kmat)


def matrix_to_axis_angle(m: np.ndarray) -> np.ndarray:
    """``(..., 3, 3)`` matrix -> ``(..., 3)`` rotation vector, angle in ``[0, pi]`` radians."""
    q = matrix_to_quat_wxyz(m)
    w = np.clip(q[..., :1], -1.0, 1.0)
    xyz = q[..., 1:]
    s = np.linalg.norm(xyz, axis=-1, keepdims=True)
    angle = 2.0 * np.arctan2(s, w)
    return np.where(s > _EPS, xyz / np.maximum(s, _EPS) * angle, 2.0 * xyz)


def euler_xyz_to_matrix(e: np.ndarray) -> np.ndarray:
    """``(..., 3)`` extrinsic XYZ angles (roll, pitch, yaw; radians) -> ``Rz(yaw) @ Ry(pitch) @ Rx(roll)``."""
    e = _check_last(e, 3, "euler_xyz").astype(np.float64)
    a, b, c = np.moveaxis(e, -1, 0)
    ca, sa, cb, sb, cc, sc = np.cos(a), np.sin(a), np.cos(b), np.sin(b), np.cos(c), np.sin(c)
    m = np.stack(
        [
            cc * cb,
            cc * sb * sa - sc * ca,
            cc * sb * ca + sc * sa,
            sc * cb,
            sc * sb * sa + cc * ca,
            sc * sb * ca - cc * sa,
            -sb,
            cb * sa,
            cb * ca,
        ],
        axis=-1,
    )
    return m.reshape(e.shape[:-1] + (3, 3))


def matrix_to_euler_xyz(m: np.ndarray) -> np.ndarray:
    """``(..., 3, 3)`` -> extrinsic XYZ angles (radians), pitch in ``[-pi/2, pi/2]``; inverse of the above."""
    m = _check_matrix(m).astype(np.float64)
    pitch = np.arcsin(np.clip(-m[..., 2, 0], -1.0, 1.0))
    roll = np.arctan2(m[..., 2, 1], m[..., 2, 2])
    yaw = np.arctan2(m[..., 1, 0], m[..., 0, 0])
    return np.stack([roll, pitch, yaw], axis=-1)


_TO_MATRIX = {
    RotationConvention.QUAT_WXYZ: quat_wxyz_to_matrix,
    RotationConvention.QUAT_XYZW: quat_xyzw_to_matrix,
    RotationConvention.ROT6D: rot6d_to_matrix,
    RotationConvention.AXIS_ANGLE: axis_angle_to_matrix,
    RotationConvention.EULER_XYZ: euler_xyz_to_matrix,
}
_FROM_MATRIX = {
    RotationConvention.QUAT_WXYZ: matrix_to_quat_wxyz,
    RotationConvention.QUAT_XYZW: matrix_to_quat_xyzw,
    RotationConvention.ROT6D: matrix_to_rot6d,
    RotationConvention.AXIS_ANGLE: matrix_to_axis_angle,
    RotationConvention.EULER_XYZ: matrix_to_euler_xyz,
}


def convert_rotation(r: np.ndarray, src: RotationConvention | str, dst: RotationConvention | str) -> np.ndarray:
    """Convert rotations ``r`` from convention ``src`` to ``dst`` (both :class:`RotationConvention` values).

    Raises:
        ValueError: if either convention is ``none`` or the trailing dims do not fit ``src``.
    """
    src, dst = RotationConvention(src), RotationConvention(dst)
    if RotationConvention.NONE in (src, dst):
        raise ValueError(
            f"rotation convention: expected one of {[c.value for c in _TO_MATRIX]}, "
            f"received {src.value!r} -> {dst.value!r}"
        )
    if src == dst:
        return np.array(r, copy=True)
    out = _FROM_MATRIX[dst](_TO_MATRIX[src](np.asarray(r)))
    return out.astype(np.asarray(r).dtype if np.asarray(r).dtype.kind == "f" else np.float64)


def _check_last(x: np.ndarray, n: int, what: str) -> np.ndarray:
    x = np.asarray(x)
    if x.ndim < 1 or x.shape[-1] != n:
        raise ValueError(f"{what}: expected shape (..., {n}), received {x.shape}")
    return x


def _check_matrix(m: np.ndarray) -> np.ndarray:
    m = np.asarray(m)
    if m.ndim < 2 or m.shape[-2:] != (3, 3):
        raise ValueError(f"rotation matrix: expected shape (..., 3, 3), received {m.shape}")
    return m
