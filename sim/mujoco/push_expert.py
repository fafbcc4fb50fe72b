"""Scripted expert for ``push``: alternate rotation pushes (at a tip of the T's bar) and translation pushes
(through the centre of mass toward the goal, with a lateral offset that corrects small yaw errors), and walk
around the block between pushes so the pusher never disturbs it on the way.

It reads only ``observation.state`` (pusher x, y, block x, y, sin, cos), so it is a function of the state plus
one remembered mode (``rotate`` / ``translate``, with hysteresis).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from policylink.adapters.schema import STATE_KEY
from policylink.sim.mujoco.degradation import DegradedExpert, degrade
from policylink.sim.mujoco.push import (
    GOAL_POSE,
    MAX_DELTA_M,
    PUSHER_RADIUS_M,
    T_BOXES,
    wrap_angle,
)

_MASSES = np.array([0.12, 0.09])  # bar, stem (kg), as in push.xml
COM_BODY = (_MASSES[:, None] * np.array([b[:2] for b in T_BOXES])).sum(0) / _MASSES.sum()
_CLEARANCE_M = 0.004  # margin kept between pusher surface and block while walking around it
_ORBIT_RADIUS_M = 0.115  # walking circle around the centre of mass
_ROTATE_ENTER_RAD, _ROTATE_EXIT_RAD = 0.12, 0.04
_BAR_TIP_X = 0.045
_AXIS_DONE_M = 0.004
_YAW_GAIN = 0.15  # lateral contact offset (m) per rad of yaw error, for pushes along the body y axis
# body-y pushes: (sign) -> (contact point on the T's surface in the block frame, push direction, max lateral m)
_Y_FACES = {
    1.0: (np.array([0.0, -0.105]), np.array([0.0, 1.0]), 0.008),  # stem bottom, push +y (through the COM)
    -1.0: (np.array([0.0, 0.015]), np.array([0.0, -1.0]), 0.03),  # bar top, push -y (through the COM)
}
# body-x pushes cannot pass through the COM (it sits in the pocket under the bar); the contact is picked by the
# yaw error: the stem side below the COM turns the block one way, the bar end above it the other way
_X_FACES = {  # (sign of push, sign of wanted turn) -> contact point
    (1.0, 1.0): np.array([-0.015, -0.042]),
    (1.0, -1.0): np.array([-0.06, -0.009]),
    (-1.0, -1.0): np.array([0.015, -0.042]),
    (-1.0, 1.0): np.array([0.06, -0.009]),
}


def _rot(yaw: float) -> np.ndarray:
    c, s = np.cos(yaw), np.sin(yaw)
    return np.array([[c, -s], [s, c]])


def inside_t(points_body: np.ndarray, margin: float = 0.0) -> np.ndarray:
    """Which of ``points_body`` ``(N, 2)`` (block frame, m) lie in the T grown by ``margin`` (m). bool ``(N,)``."""
    hit = np.zeros(len(points_body), dtype=bool)
    for cx, cy, hx, hy in T_BOXES:
        hit |= (np.abs(points_body[:, 0] - cx) <= hx + margin) & (np.abs(points_body[:, 1] - cy) <= hy + margin)
    return hit


class PushExpert:
    """Rotate-then-translate pushing controller for :class:`~policylink.sim.mujoco.push.PushEnv`.

    ``act(obs, env)`` returns float32 ``(2,)`` (dx, dy) in metres per step within +-0.025 m.
    """

    def __init__(self) -> None:
        self.mode: str | None = None
        self.axis: int | None = None
        self.aim_offset = np.zeros(3)

    def reset(self, seed: int | None = None) -> None:
        """Forget the mode of the previous episode (``seed`` is unused: the expert is deterministic)."""
        self.mode = None
        self.axis = None

    def act(self, obs: dict, env=None) -> np.ndarray:
        """Next action from ``obs["observation.state"]`` (``env`` unused)."""
        s = np.asarray(obs[STATE_KEY], dtype=np.float64)
        pusher, pos, yaw = s[:2], s[2:4], float(np.arctan2(s[4], s[5]))
        rot = _rot(yaw)
        e_pos = GOAL_POSE[:2] + self.aim_offset[:2] - pos
        e_yaw = wrap_angle(GOAL_POSE[2] - yaw)
        if self.mode is None:
            self.mode = "rotate" if abs(e_yaw) > _ROTATE_ENTER_RAD else "translate"
        elif self.mode == "rotate" and abs(e_yaw) < _ROTATE_EXIT_RAD:
            self.mode = "translate"
        elif self.mode == "translate" and abs(e_yaw) > _ROTATE_ENTER_RAD:
            self.mode = "rotate"
            self.axis = None
        if self.mode == "rotate":
            contact, u, speed = self._rotation_push(pos, rot, e_pos, e_yaw)
        else:
            contact, u, speed = self._translation_push(pos, rot, e_pos, e_yaw)
        target = self._approach(pusher, contact, u, speed, pos, rot)
        return np.clip(target - pusher, -MAX_DELTA_M, MAX_DELTA_M).astype(np.float32)

    @staticmethod
    def _rotation_push(pos, rot, e_pos, e_yaw):
        sign = 1.0 if e_yaw > 0 else -1.0
        r = PUSHER_RADIUS_M + 0.001
        half = T_BOXES[0][3]
        # torque sign(e_yaw): push +y at the +x tip from below, or -y at the -x tip from above (and mirrored)
        options = [
            (np.array([_BAR_TIP_X, -sign * (half + r)]), np.array([0.0, sign])),
            (np.array([-_BAR_TIP_X, sign * (half + r)]), np.array([0.0, -sign])),
        ]
        scores = [float((rot @ d) @ e_pos) for _, d in options]
        tip, d = options[int(np.argmax(scores))]
        speed = float(np.clip(abs(e_yaw) * 0.08, 0.008, 0.02))
        return pos + rot @ tip, rot @ d, speed

    def _translation_push(self, pos, rot, e_pos, e_yaw):
        """Push along one body axis at a time (face normal through the centre of mass); keep the axis until
        its share of the position error is done (hysteresis), then take the axis with the larger error."""
        e_body = rot.T @ e_pos
        if self.axis is None or abs(e_body[self.axis]) < _AXIS_DONE_M:
            self.axis = int(np.argmax(np.abs(e_body)))
        sign = 1.0 if e_body[self.axis] > 0 else -1.0
        if self.axis == 1:
            point, d, lateral_max = _Y_FACES[sign]
            lateral = float(np.clip(-_YAW_GAIN * e_yaw, -lateral_max, lateral_max))
            point = point + np.array([-d[1], d[0]]) * lateral
        else:
            d = np.array([sign, 0.0])
            point = _X_FACES[(sign, 1.0 if e_yaw > 0 else -1.0)]
        contact_body = point - d * (PUSHER_RADIUS_M + 0.001)
        speed = float(np.clip(abs(e_body[self.axis]) * 0.8, 0.005, 0.02))
        return pos + rot @ contact_body, rot @ d, speed

    @staticmethod
    def _approach(pusher, contact, u, speed, pos, rot):
        """Push along ``u`` when lined up behind ``contact``; otherwise walk to a pre-push point around the T."""
        n = np.array([-u[1], u[0]])
        rel = pusher - contact
        along, across = float(rel @ u), float(rel @ n)
        if -0.04 < along < 0.01 and abs(across) < 0.006:
            return pusher + u * speed - n * across
        for back in (0.03, 0.07):  # pre-push point, then a point further back on the same push line
            pre = contact - u * back
            if not _segment_hits_block(pusher, pre, pos, rot):
                return pre
        com = pos + rot @ COM_BODY
        v_p, v_t = pusher - com, pre - com
        ang = wrap_angle(np.arctan2(v_t[1], v_t[0]) - np.arctan2(v_p[1], v_p[0]))
        radius = max(float(np.linalg.norm(v_p)), 1e-6)
        radial = v_p / radius
        tangent = np.sign(ang) * np.array([-radial[1], radial[0]])
        return pusher + tangent * MAX_DELTA_M + radial * (_ORBIT_RADIUS_M - radius)


def _segment_hits_block(a: np.ndarray, b: np.ndarray, pos: np.ndarray, rot: np.ndarray) -> bool:
    pts = a + np.linspace(0.0, 1.0, 25)[:, None] * (b - a)
    body = (pts - pos) @ rot  # world -> block frame: R^T (p - pos), row-vector form
    return bool(inside_t(body, PUSHER_RADIUS_M + _CLEARANCE_M).any())


def make_push_expert(env: Any, quality: str = "expert", seed: int | None = None) -> DegradedExpert:
    """Expert for ``push`` at ``quality`` (``"expert"``, ``"noisy"``, ``"poor"``). Raises ValueError otherwise."""
    return degrade(PushExpert(), env, quality, seed)
