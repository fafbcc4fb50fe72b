"""Workspace geometry shared by the MuJoCo tasks: the yaw of a quaternion, a 3-D distance written once for the
vectorised and the per-step paths, and positions drawn a minimum distance apart (metres, radians)."""

from __future__ import annotations

import math

import numpy as np

__all__ = ["euclidean3", "sample_separated", "yaw_of"]


def yaw_of(quat_wxyz: np.ndarray | list[float]) -> float:
    """Rotation about world z (rad) of a unit quaternion ``(w, x, y, z)``: an array ``(4,)`` or 4 Python floats."""
    w, x, y, z = quat_wxyz.tolist() if isinstance(quat_wxyz, np.ndarray) else quat_wxyz
    return math.atan2(2.0 * (w * z + x * y), 1.0 - 2.0 * (y * y + z * z))


def euclidean3(dx, dy, dz, sqrt=np.sqrt):
    """``sqrt((dx*dx + dy*dy) + dz*dz)`` on float64 arrays ``(N,)`` (``sqrt=np.sqrt``) or Python floats
    (``sqrt=math.sqrt``): bit for bit ``np.linalg.norm`` of the rows ``(dx, dy, dz)`` (numpy sums 3 terms left
    to right), so a task writes its goal distance once for both the vectorised API and the per-step path."""
    return sqrt((dx * dx + dy * dy) + dz * dz)


def sample_separated(
    rng: np.random.Generator,
    low: np.ndarray,
    high: np.ndarray,
    n: int,
    min_distance: float,
    avoid: list[np.ndarray] | None = None,
    max_tries: int = 1000,
) -> list[np.ndarray]:
    """Draw ``n`` points uniformly in the box ``[low, high]`` at least ``min_distance`` (m) apart.

    Args:
        avoid: points the samples must also stay ``min_distance`` away from.

    Raises:
        RuntimeError: no valid set found in ``max_tries`` draws (the box is too small).
    """
    points: list[np.ndarray] = []
    others = list(avoid or [])
    for _ in range(max_tries):
        p = rng.uniform(low, high)
        if all(np.linalg.norm(p - q) >= min_distance for q in points + others):
            points.append(p)
            if len(points) == n:
                return points
    raise RuntimeError(
        f"sample_separated: expected {n} points {min_distance} m apart in [{low}, {high}], "
        f"found {len(points)} after {max_tries} draws"
    )
