"""The ACT paper's scripted end-effector policies for the two simulated ALOHA tasks, in numpy only (no dm_control):
waypoints of each gripper's pose and opening, linearly interpolated per step, then turned into the joint-space
actions that are replayed in the joint-position env.

Source: Zhao et al. 2023, "Learning Fine-Grained Bimanual Manipulation with Low-Cost Hardware" (arXiv 2304.13705),
section V-A: "we use scripted policies ... in end-effector space" for the sim datasets; the waypoint timings and
offsets are those of the ACT repository's ``scripted_policy.py`` (``PickAndTransferPolicy``, ``InsertionPolicy``),
and :func:`joint_actions` is the gripper substitution of its ``record_sim_episodes.py`` (roll the script out in the
mocap scene, take the joint positions it produced, replace each gripper's measured opening by its commanded one,
replay that sequence as joint targets). Written here from those facts (no code copied); quaternions are wxyz.
Imported inside the ALOHA venv (by :mod:`.aloha_env`) and by the host's tests.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

EPISODE_STEPS = 400
"""Length of a scripted episode, control steps at 50 Hz (ACT's ``episode_len`` for both sim tasks)."""

PUPPET_GRIPPER_POSITION_OPEN = 0.05800
PUPPET_GRIPPER_POSITION_CLOSE = 0.01844
"""The follower gripper's finger position (m) when fully open / closed (gym-aloha's ``constants.py``)."""


@dataclass(frozen=True)
class Waypoint:
    """One key pose of one gripper.

    Attributes:
        t: control step at which the pose is reached.
        xyz: float64 ``(3,)`` mocap position, metres, world frame.
        quat: float64 ``(4,)`` mocap orientation, wxyz.
        gripper: commanded opening, normalised (0 closed, 1 open).
    """

    t: int
    xyz: np.ndarray
    quat: np.ndarray
    gripper: float


def quat_mul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Hamilton product ``a * b`` of two wxyz quaternions: float64 ``(4,)``."""
    aw, ax, ay, az = a
    bw, bx, by, bz = b
    return np.array(
        [
            aw * bw - ax * bx - ay * by - az * bz,
            aw * bx + ax * bw + ay * bz - az * by,
            aw * by - ax * bz + ay * bw + az * bx,
            aw * bz + ax * by - ay * bx + az * bw,
        ]
    )


def axis_angle_quat(axis: tuple[float, float, float], degrees: float) -> np.ndarray:
    """The wxyz unit quaternion rotating ``degrees`` about ``axis`` (normalised here): float64 ``(4,)``.

    Raises:
        ValueError: ``axis`` has zero length.
    """
    v = np.asarray(axis, np.float64)
    n = np.linalg.norm(v)
    if n == 0:
        raise ValueError(f"axis: expected a non-zero 3-vector, received {list(axis)}")
    half = np.deg2rad(degrees) / 2.0
    return np.concatenate([[np.cos(half)], np.sin(half) * v / n])


def transfer_cube_waypoints(
    mocap_left: np.ndarray, mocap_right: np.ndarray, cube_pose: np.ndarray
) -> tuple[list[Waypoint], list[Waypoint]]:
    """(left, right) waypoints of the transfer-cube script: the right gripper picks the cube, both meet at
    ``(0, 0.5, 0.25)``, the left gripper closes on it and the right one opens and backs away.

    Args:
        mocap_left, mocap_right: float ``(7,)`` each gripper's initial mocap pose (xyz, wxyz).
        cube_pose: float ``(7,)`` the cube's pose (xyz, wxyz) at the episode's start.
    """
    cube = np.asarray(cube_pose, np.float64)[:3]
    pick = quat_mul(np.asarray(mocap_right[3:], np.float64), axis_angle_quat((0, 1, 0), -60))
    meet_left = axis_angle_quat((1, 0, 0), 90)
    meet = np.array([0.0, 0.5, 0.25])
    left = [
        Waypoint(0, np.asarray(mocap_left[:3], np.float64), np.asarray(mocap_left[3:], np.float64), 0),
        Waypoint(100, meet + [-0.1, 0, -0.02], meet_left, 1),  # approach the meeting point
        Waypoint(260, meet + [0.02, 0, -0.02], meet_left, 1),  # to the cube
        Waypoint(310, meet + [0.02, 0, -0.02], meet_left, 0),  # close
        Waypoint(360, meet + [-0.1, 0, -0.02], np.array([1.0, 0, 0, 0]), 0),  # move left
        Waypoint(400, meet + [-0.1, 0, -0.02], np.array([1.0, 0, 0, 0]), 0),  # stay
    ]
    right = [
        Waypoint(0, np.asarray(mocap_right[:3], np.float64), np.asarray(mocap_right[3:], np.float64), 0),
        Waypoint(90, cube + [0, 0, 0.08], pick, 1),  # above the cube
        Waypoint(130, cube + [0, 0, -0.015], pick, 1),  # down
        Waypoint(170, cube + [0, 0, -0.015], pick, 0),  # close
        Waypoint(200, meet + [0.05, 0, 0], pick, 0),  # approach the meeting point
        Waypoint(220, meet, pick, 0),  # at it
        Waypoint(310, meet, pick, 1),  # open
        Waypoint(360, meet + [0.1, 0, 0], pick, 1),  # move right
        Waypoint(400, meet + [0.1, 0, 0], pick, 1),  # stay
    ]
    return left, right


def insertion_waypoints(
    mocap_left: np.ndarray, mocap_right: np.ndarray, objects_pose: np.ndarray
) -> tuple[list[Waypoint], list[Waypoint]]:
    """(left, right) waypoints of the insertion script: the left gripper picks the socket, the right one the peg,
    both lift to meet around ``(0, 0.5, 0.15)`` and push the peg into the socket.

    Args:
        mocap_left, mocap_right: float ``(7,)`` each gripper's initial mocap pose (xyz, wxyz).
        objects_pose: float ``(14,)`` the peg's then the socket's pose (xyz, wxyz) at the episode's start.
    """
    poses = np.asarray(objects_pose, np.float64)
    peg, socket = poses[:3], poses[7:10]
    right_quat = np.asarray(mocap_right[3:], np.float64)
    pick_right = quat_mul(right_quat, axis_angle_quat((0, 1, 0), -60))
    pick_left = quat_mul(right_quat, axis_angle_quat((0, 1, 0), 60))  # from the right's start, as ACT's script
    meet = np.array([0.0, 0.5, 0.15])
    lift_right = 0.00715

    def arm(start: np.ndarray, obj: np.ndarray, quat: np.ndarray, side: float, lift: float) -> list[Waypoint]:
        s = np.asarray(start, np.float64)
        return [
            Waypoint(0, s[:3], s[3:], 0),
            Waypoint(120, obj + [0, 0, 0.08], quat, 1),  # above the object
            Waypoint(170, obj + [0, 0, -0.03], quat, 1),  # down
            Waypoint(220, obj + [0, 0, -0.03], quat, 0),  # close
            Waypoint(285, meet + [0.1 * side, 0, lift], quat, 0),  # approach the meeting point
            Waypoint(340, meet + [0.05 * side, 0, lift], quat, 0),  # insert
            Waypoint(400, meet + [0.05 * side, 0, lift], quat, 0),  # stay
        ]

    return arm(mocap_left, socket, pick_left, -1.0, 0.0), arm(mocap_right, peg, pick_right, 1.0, lift_right)


SCRIPTS = {"transfer_cube": transfer_cube_waypoints, "insertion": insertion_waypoints}
"""Task name -> its waypoint function ``(mocap_left, mocap_right, objects_pose) -> (left, right)``."""


def interpolate(waypoints: list[Waypoint], t: int) -> np.ndarray:
    """float64 ``(8,)``: the pose and opening ``(xyz, quat wxyz, gripper)`` at step ``t``, linear between the
    waypoints around it (quaternions interpolated component-wise, as the script does; MuJoCo normalises mocap
    quaternions).

    Raises:
        ValueError: ``t`` outside ``[waypoints[0].t, waypoints[-1].t]``.
    """
    if not waypoints[0].t <= t <= waypoints[-1].t:
        raise ValueError(f"t: expected {waypoints[0].t}..{waypoints[-1].t} (the script's steps), received {t}")
    for a, b in zip(waypoints, waypoints[1:], strict=False):
        if a.t <= t <= b.t:
            f = (t - a.t) / (b.t - a.t)
            xyz = a.xyz + (b.xyz - a.xyz) * f
            quat = a.quat + (b.quat - a.quat) * f
            return np.concatenate([xyz, quat, [a.gripper + (b.gripper - a.gripper) * f]])
    raise AssertionError("unreachable: t is within the waypoints")


def ee_action(left: list[Waypoint], right: list[Waypoint], t: int) -> np.ndarray:
    """float64 ``(16,)``: the mocap scene's action at step ``t``: left then right ``(xyz, quat wxyz, gripper)``."""
    return np.concatenate([interpolate(left, t), interpolate(right, t)])


def normalize_gripper_position(x: np.ndarray | float) -> np.ndarray:
    """A follower finger position (m) -> normalised opening (0 closed, 1 open), gym-aloha's convention."""
    return (np.asarray(x, np.float64) - PUPPET_GRIPPER_POSITION_CLOSE) / (
        PUPPET_GRIPPER_POSITION_OPEN - PUPPET_GRIPPER_POSITION_CLOSE
    )


def joint_actions(qpos: np.ndarray, gripper_ctrl: np.ndarray) -> np.ndarray:
    """The joint-space actions replaying a scripted rollout: float32 ``(T, 14)``.

    Args:
        qpos: float ``(T, 14)`` the 14-d joint state at each step of the mocap rollout (6 arm joints in rad and
            the normalised gripper opening, per arm, left first).
        gripper_ctrl: float ``(T, 4)`` the gripper controls at each step (left finger, its mirror, right finger,
            its mirror; metres).

    Returns:
        ``qpos`` with each gripper's measured opening replaced by its commanded one (normalised ``gripper_ctrl``
        columns 0 and 2): a closing gripper keeps squeezing instead of stalling at the object's width.

    Raises:
        ValueError: shapes other than ``(T, 14)`` and ``(T, 4)``.
    """
    q = np.array(qpos, np.float32)
    c = np.asarray(gripper_ctrl, np.float64)
    if q.ndim != 2 or q.shape[1] != 14 or c.shape != (q.shape[0], 4):
        raise ValueError(f"qpos, gripper_ctrl: expected (T, 14) and (T, 4), received {q.shape} and {c.shape}")
    q[:, 6] = normalize_gripper_position(c[:, 0])
    q[:, 13] = normalize_gripper_position(c[:, 2])
    return q
