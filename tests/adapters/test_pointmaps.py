"""depth_to_pointmap: hand-computed XYZ of a known plane in the base frame; wrong extrinsics and a transposed K
fail; invalid pixels are zero and masked; errors name the field."""

import numpy as np
import pytest

from policylink.adapters.pointmaps import (
    check_intrinsics,
    check_rigid_transform,
    depth_to_pointmap,
    pointmap_to_chw,
    pointmap_valid,
)

# a 4 x 6 image (H x W) with fx != fy and cx != cy so that swapped axes show
K = np.array([[100.0, 0.0, 2.5], [0.0, 50.0, 1.5], [0.0, 0.0, 1.0]])
# camera 1 m above the base origin looking straight down, image right = base +x, image down = base -y
T_DOWN = np.array([[1.0, 0.0, 0.0, 0.0], [0.0, -1.0, 0.0, 0.0], [0.0, 0.0, -1.0, 1.0], [0.0, 0.0, 0.0, 1.0]])


def _hand_xyz(u: int, v: int, d: float) -> np.ndarray:
    """Pixel (col u, row v) at z-depth d under K and T_DOWN, worked out by hand: camera point
    ((u - cx) d / fx, (v - cy) d / fy, d) -> base (x_c, -y_c, 1 - z_c)."""
    xc, yc = (u - 2.5) * d / 100.0, (v - 1.5) * d / 50.0
    return np.array([xc, -yc, 1.0 - d])


def test_plane_at_known_depth_gives_hand_computed_xyz():
    depth = np.full((4, 6), 0.8)  # the plane z = 0.2 in the base frame
    pm = depth_to_pointmap(depth, K, T_DOWN)
    assert pm.points.shape == (4, 6, 3) and pm.points.dtype == np.float32 and pm.valid.all()
    np.testing.assert_allclose(pm.points[..., 2], 0.2, atol=1e-6)
    for v, u in [(0, 0), (0, 5), (3, 0), (2, 4)]:  # indexed [row, col]
        np.testing.assert_allclose(pm.points[v, u], _hand_xyz(u, v, 0.8), atol=1e-6)
    # the corner pixels by the numbers: (u, v) = (0, 0) -> x = -2.5 * 0.8 / 100, y = +1.5 * 0.8 / 50
    np.testing.assert_allclose(pm.points[0, 0], [-0.02, 0.024, 0.2], atol=1e-6)
    np.testing.assert_allclose(pm.points[3, 5], [0.02, -0.024, 0.2], atol=1e-6)


def test_a_tilted_camera_with_translation_maps_a_plane_back_to_it():
    # camera at (0.3, -0.5, 0.6) pitched 40 degrees down from horizontal, looking along base +y
    a = np.radians(40.0)
    forward = np.array([0.0, np.cos(a), -np.sin(a)])
    right = np.array([1.0, 0.0, 0.0])
    down = np.cross(forward, right)
    T = np.eye(4)
    T[:3, :3] = np.stack([right, down, forward], axis=1)
    T[:3, 3] = (0.3, -0.5, 0.6)
    # z-depth of the table plane z = 0 at each pixel: ray r = K^-1 [u, v, 1]; base z = 0.6 + d (R r)_z = 0
    v, u = np.mgrid[0:4, 0:6].astype(float)
    rays = np.stack([(u - 2.5) / 100.0, (v - 1.5) / 50.0, np.ones_like(u)], -1) @ T[:3, :3].T
    depth = -0.6 / rays[..., 2]
    pm = depth_to_pointmap(depth, K, T)
    np.testing.assert_allclose(pm.points[..., 2], 0.0, atol=1e-6)
    np.testing.assert_allclose(pm.points[1, 2], T[:3, 3] + depth[1, 2] * rays[1, 2], atol=1e-6)


def test_a_wrong_extrinsic_or_a_transposed_k_fails_the_plane_check():
    depth = np.full((4, 6), 0.8)
    expected = np.array([_hand_xyz(u, v, 0.8) for v in range(4) for u in range(6)]).reshape(4, 6, 3)
    inverse = np.linalg.inv(T_DOWN @ np.array([[1, 0, 0, 0.1], [0, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1.0]]))
    opengl = T_DOWN @ np.diag([1.0, -1.0, -1.0, 1.0])  # an OpenGL-convention pose passed unconverted
    for wrong in (inverse, opengl):
        assert not np.allclose(depth_to_pointmap(depth, K, wrong).points, expected, atol=1e-3)
    assert np.allclose(depth_to_pointmap(depth, K, T_DOWN).points, expected, atol=1e-6)
    with pytest.raises(
        ValueError, match=r"K: expected \[\[fx, s, cx\], \[0, fy, cy\], \[0, 0, 1\]\] \(not transposed\)"
    ):
        depth_to_pointmap(depth, K.T, T_DOWN)
    # u and v swapped (cx <-> cy, fx <-> fy): passes the checks but gives other points
    swapped = np.array([[50.0, 0.0, 1.5], [0.0, 100.0, 2.5], [0.0, 0.0, 1.0]])
    assert not np.allclose(depth_to_pointmap(depth, swapped, T_DOWN).points, expected, atol=1e-3)


def test_pixels_beyond_range_non_finite_or_zero_are_invalid_and_zero():
    depth = np.full((4, 6), 0.8)
    depth[0, 0], depth[1, 1], depth[2, 2], depth[3, 3], depth[3, 4] = 3.5, np.nan, 0.0, -1.0, np.inf
    depth[0, 1] = 1.99  # within a 2 m range
    pm = depth_to_pointmap(depth, K, T_DOWN, max_depth=2.0)
    invalid = [(0, 0), (1, 1), (2, 2), (3, 3), (3, 4)]
    expected_valid = np.ones((4, 6), bool)
    for rc in invalid:
        expected_valid[rc] = False
    np.testing.assert_array_equal(pm.valid, expected_valid)
    for rc in invalid:
        np.testing.assert_array_equal(pm.points[rc], [0.0, 0.0, 0.0])
    assert np.isfinite(pm.points).all()
    np.testing.assert_array_equal(pointmap_valid(pm.points), expected_valid)
    np.testing.assert_allclose(pm.points[0, 1], _hand_xyz(1, 0, 1.99), atol=1e-6)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"K": np.eye(4)}, r"K: expected a 3x3 pinhole matrix, received shape \(4, 4\)"),
        ({"K": np.diag([-1.0, 1.0, 1.0])}, r"K: expected positive focal lengths"),
        ({"T_base_camera": np.eye(3)}, r"T_base_camera: expected a 4x4 homogeneous transform, received shape \(3, 3\)"),
        ({"T_base_camera": np.diag([2.0, 1.0, 1.0, 1.0])}, r"T_base_camera: expected a rigid transform"),
        ({"T_base_camera": np.diag([1.0, 1.0, -1.0, 1.0])}, r"T_base_camera: expected a rigid transform.*det = -1"),
        ({"T_base_camera": np.vstack([np.eye(4)[:3], [0, 0, 1, 1]])}, r"T_base_camera: expected last row"),
        ({"depth": np.ones((2, 2, 1))}, r"depth: expected real z-depth \(H, W\)"),
        ({"max_depth": 0.0}, r"max_depth: expected a positive finite range"),
    ],
)
def test_bad_inputs_name_the_field(kwargs, message):
    args = {"depth": np.ones((4, 6)), "K": K, "T_base_camera": T_DOWN, **kwargs}
    with pytest.raises(ValueError, match=message):
        depth_to_pointmap(**args)


def test_checks_return_float64_and_chw_layout():
    assert check_intrinsics(K.astype(np.float32)).dtype == np.float64
    np.testing.assert_array_equal(check_rigid_transform(T_DOWN), T_DOWN)
    pm = np.arange(2 * 4 * 6 * 3, dtype=np.float32).reshape(2, 4, 6, 3)
    chw = pointmap_to_chw(pm)
    assert chw.shape == (2, 3, 4, 6)
    np.testing.assert_array_equal(chw[1, 2, 3, 4], pm[1, 3, 4, 2])
    with pytest.raises(ValueError, match=r"obs: expected float pointmaps \(\.\.\., H, W, 3\)"):
        pointmap_to_chw(np.zeros((4, 6, 3), np.uint8), "obs")
