"""Rotation conventions with known values, in both quaternion orders, so an order mix-up cannot cancel."""

import numpy as np
import pytest

from policylink.adapters import rotations as R

S = np.sqrt(0.5)
RZ90 = np.array([[0.0, -1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 1.0]])  # +90 deg about z


def test_identity_in_both_quaternion_orders():
    np.testing.assert_allclose(R.quat_wxyz_to_matrix(np.array([1.0, 0, 0, 0])), np.eye(3))
    np.testing.assert_allclose(R.quat_xyzw_to_matrix(np.array([0, 0, 0, 1.0])), np.eye(3))
    np.testing.assert_allclose(R.matrix_to_quat_wxyz(np.eye(3)), [1, 0, 0, 0])
    np.testing.assert_allclose(R.matrix_to_quat_xyzw(np.eye(3)), [0, 0, 0, 1])


def test_90_degrees_about_z_in_both_orders():
    np.testing.assert_allclose(R.quat_wxyz_to_matrix(np.array([S, 0, 0, S])), RZ90, atol=1e-12)
    np.testing.assert_allclose(R.quat_xyzw_to_matrix(np.array([0, 0, S, S])), RZ90, atol=1e-12)
    np.testing.assert_allclose(R.matrix_to_quat_wxyz(RZ90), [S, 0, 0, S], atol=1e-12)
    np.testing.assert_allclose(R.matrix_to_quat_xyzw(RZ90), [0, 0, S, S], atol=1e-12)
    # the matrix maps x to y
    np.testing.assert_allclose(RZ90 @ [1, 0, 0], [0, 1, 0])


def test_order_mixup_is_detected():
    # reading a wxyz quaternion of +90 deg about z as xyzw gives a different rotation (180 deg about (1,0,1)/sqrt2)
    wrong = R.quat_xyzw_to_matrix(np.array([S, 0, 0, S]))
    assert not np.allclose(wrong, RZ90)
    np.testing.assert_allclose(R.quat_wxyz_to_xyzw(np.array([S, 0, 0, S])), [0, 0, S, S])
    np.testing.assert_allclose(R.quat_xyzw_to_wxyz(np.array([0, 0, S, S])), [S, 0, 0, S])


def test_axis_angle_euler_rot6d_known_values():
    np.testing.assert_allclose(R.axis_angle_to_matrix(np.array([0, 0, np.pi / 2])), RZ90, atol=1e-12)
    np.testing.assert_allclose(R.matrix_to_axis_angle(RZ90), [0, 0, np.pi / 2], atol=1e-12)
    np.testing.assert_allclose(R.euler_xyz_to_matrix(np.array([0, 0, np.pi / 2])), RZ90, atol=1e-12)
    np.testing.assert_allclose(R.matrix_to_euler_xyz(RZ90), [0, 0, np.pi / 2], atol=1e-12)
    np.testing.assert_allclose(R.matrix_to_rot6d(RZ90), [0, 1, 0, -1, 0, 0], atol=1e-12)
    np.testing.assert_allclose(R.rot6d_to_matrix(np.array([0, 1, 0, -1, 0, 0.0])), RZ90, atol=1e-12)
    np.testing.assert_allclose(R.axis_angle_to_matrix(np.zeros(3)), np.eye(3))


def test_euler_order_is_extrinsic_xyz():
    # roll 90 then yaw 90 (extrinsic): Rz @ Rx maps z -> x... check by hand: Rx(90) z = -y; Rz(90)(-y) = x
    m = R.euler_xyz_to_matrix(np.array([np.pi / 2, 0, np.pi / 2]))
    np.testing.assert_allclose(m @ [0, 0, 1], [1, 0, 0], atol=1e-12)


def test_round_trips_batched_random():
    rng = np.random.default_rng(0)
    q = rng.normal(size=(50, 4))
    q /= np.linalg.norm(q, axis=-1, keepdims=True)
    q *= np.sign(q[:, :1])
    for conv in ("quat_xyzw", "rot6d", "axis_angle", "euler_xyz"):
        back = R.convert_rotation(R.convert_rotation(q, "quat_wxyz", conv), conv, "quat_wxyz")
        np.testing.assert_allclose(back, q, atol=1e-9, err_msg=conv)


def test_bad_shapes_and_none_convention_raise():
    with pytest.raises(ValueError, match=r"quaternion: expected shape \(\.\.\., 4\), received \(3,\)"):
        R.quat_wxyz_to_matrix(np.zeros(3))
    with pytest.raises(ValueError, match="zero quaternion"):
        R.quat_wxyz_to_matrix(np.zeros(4))
    with pytest.raises(ValueError, match="rotation convention"):
        R.convert_rotation(np.zeros(4), "none", "rot6d")
