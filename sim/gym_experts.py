"""Scripted Jacobian-based experts for the foreign gymnasium envs ``reacher`` and ``pusher`` (privileged state).

Both solve damped-least-squares inverse kinematics (Wampler 1986; Buss 2004, "Introduction to inverse
kinematics with Jacobian transpose, pseudoinverse and damped least squares methods") on a scratch copy of the
MuJoCo model with ``mujoco.mj_jacBody``, then track the joint goal with a computed-torque PD law
``tau = M(q) (Kp (q* - q) - Kd qd) + c(q, qd) - f_passive``, clipped to the actuator limits.
"""

from __future__ import annotations

from dataclasses import dataclass

import gymnasium as gym
import mujoco
import numpy as np

from policylink.sim.gym import foreign_mujoco_env

QUALITIES = ("expert", "noisy", "poor")


@dataclass(frozen=True)
class Degradation:
    """How a non-expert quality spoils the expert.

    Attributes:
        action_noise: std of Gaussian noise added to every action, as a fraction of the half action range.
        aim_error_m: per-episode offset of the aimed point (m), uniform direction, this length.
    """

    action_noise: float
    aim_error_m: float


DEGRADATIONS = {
    "expert": Degradation(action_noise=0.0, aim_error_m=0.0),
    "noisy": Degradation(action_noise=0.3, aim_error_m=0.015),
    "poor": Degradation(action_noise=0.6, aim_error_m=0.04),
}
"""Per-quality degradations; success rates over 100 seeds are in ``benchmarks/results/foreign_experts.md``."""


def make_reacher_expert(env: gym.Env, quality: str = "expert", seed: int | None = None) -> ReacherExpert:
    """Jacobian (DLS-IK + computed-torque PD) expert for the ``reacher`` env; see :class:`ReacherExpert`.

    Raises:
        ValueError: ``quality`` not in ``("expert", "noisy", "poor")``.
        TypeError: ``env`` does not wrap a gymnasium MuJoCo env.
    """
    return ReacherExpert(env, quality=quality, seed=seed)


def make_pusher_expert(env: gym.Env, quality: str = "expert", seed: int | None = None) -> PusherExpert:
    """Scripted push expert for the ``pusher`` env; see :class:`PusherExpert`.

    Raises:
        ValueError: ``quality`` not in ``("expert", "noisy", "poor")``.
        TypeError: ``env`` does not wrap a gymnasium MuJoCo env.
    """
    return PusherExpert(env, quality=quality, seed=seed)


class _JointSpaceExpert:
    """Shared machinery: scratch kinematics, DLS IK, computed-torque PD, degradation noise.

    Args:
        env: the policylink adapter (or a wrapper around it) of a gymnasium MuJoCo env.
        quality: ``"expert"``, ``"noisy"`` or ``"poor"`` (see :data:`DEGRADATIONS`).
        seed: seed of the degradation noise (re-seeded by :meth:`reset`).
        body: name of the controlled body (its frame origin is the controlled point).
        n_arm: the arm's actuated dofs are ``0 .. n_arm-1`` (qpos and qvel indices coincide for hinges).
        kp, kd: PD gains of the joint-space law, 1/s^2 and 1/s.
    """

    def __init__(self, env: gym.Env, quality: str, seed: int | None, body: str, n_arm: int, kp: float, kd: float):
        if quality not in DEGRADATIONS:
            raise ValueError(f"quality: expected one of {list(QUALITIES)}, received {quality!r}")
        mj = foreign_mujoco_env(env)
        self.model: mujoco.MjModel = mj.model
        self.data: mujoco.MjData = mj.data
        self.quality = quality
        self.degradation = DEGRADATIONS[quality]
        self.body_id = self.model.body(body).id
        self.n = n_arm
        self.kp, self.kd = kp, kd
        self._scratch = mujoco.MjData(self.model)
        self._jacp = np.zeros((3, self.model.nv))
        self._jacr = np.zeros((3, self.model.nv))
        self._gear = self.model.actuator_gear[:, 0].copy()
        self._low = self.model.actuator_ctrlrange[:, 0].astype(np.float32)
        self._high = self.model.actuator_ctrlrange[:, 1].astype(np.float32)
        self._qlow = np.where(self.model.jnt_limited[:n_arm], self.model.jnt_range[:n_arm, 0], -np.inf)
        self._qhigh = np.where(self.model.jnt_limited[:n_arm], self.model.jnt_range[:n_arm, 1], np.inf)
        self.reset(seed)

    def reset(self, seed: int | None = None) -> None:
        """Start a new episode: re-seed the degradation noise and draw this episode's aim error."""
        self.rng = np.random.default_rng(seed)
        angle = self.rng.uniform(0.0, 2.0 * np.pi)
        self.aim_offset = self.degradation.aim_error_m * np.array([np.cos(angle), np.sin(angle), 0.0])

    def _ik(
        self,
        target_pos: np.ndarray,
        target_rot: np.ndarray | None = None,
        rot_weight: float = 0.0,
        iters: int = 30,
        damping: float = 0.02,
    ) -> np.ndarray:
        """Arm joint angles ``(n_arm,)`` (rad) placing the body at ``target_pos`` (m, world, ``(3,)`` or ``(2,)``
        for planar xy) and, weighted by ``rot_weight`` (m/rad), its frame at ``target_rot`` ``(3, 3)``.

        DLS update ``dq = J^T (J J^T + damping^2 I)^-1 e`` from the current joint angles, within joint limits.
        """
        s, m = self._scratch, self.model
        s.qpos[:] = self.data.qpos
        k = len(target_pos)
        for _ in range(iters):
            mujoco.mj_kinematics(m, s)
            mujoco.mj_comPos(m, s)
            mujoco.mj_jacBody(m, s, self._jacp, self._jacr, self.body_id)
            err = target_pos - s.xpos[self.body_id][:k]
            jac = self._jacp[:k, : self.n]
            if target_rot is not None:
                rot = s.xmat[self.body_id].reshape(3, 3)
                rerr = 0.5 * sum(np.cross(rot[:, i], target_rot[:, i]) for i in range(3))
                err = np.concatenate([err, rot_weight * rerr])
                jac = np.vstack([jac, rot_weight * self._jacr[:, : self.n]])
            if np.linalg.norm(err) < 1e-5:
                break
            jjt = jac @ jac.T + damping**2 * np.eye(len(err))
            dq = jac.T @ np.linalg.solve(jjt, err)
            s.qpos[: self.n] = np.clip(s.qpos[: self.n] + dq, self._qlow, self._qhigh)
        return s.qpos[: self.n].copy()

    def _torque_action(self, q_goal: np.ndarray) -> np.ndarray:
        """Computed-torque PD toward ``q_goal`` (rad) -> float32 action ``(A,)`` within the actuator limits."""
        m, d, n = self.model, self.data, self.n
        mass = np.zeros((m.nv, m.nv))
        mujoco.mj_fullM(m, d, mass)
        qacc = self.kp * (q_goal - d.qpos[:n]) - self.kd * d.qvel[:n]
        tau = mass[:n, :n] @ qacc + d.qfrc_bias[:n] - d.qfrc_passive[:n]
        action = tau / self._gear
        if self.degradation.action_noise > 0:
            half = 0.5 * (self._high - self._low)
            action = action + self.rng.normal(0.0, self.degradation.action_noise, size=action.shape) * half
        return np.clip(action, self._low, self._high).astype(np.float32)


class ReacherExpert(_JointSpaceExpert):
    """Reacher-v5 expert: DLS IK of the ``fingertip`` body onto the target (xy), computed-torque PD
    (``Kp = 400 1/s^2``, ``Kd = 40 1/s``, critically damped) at 50 Hz; actions are torques / 200 in ``[-1, 1]``.

    ``act(obs, env)`` reads the target from the simulator (privileged) and returns float32 ``(2,)``.
    Measured (100 seeds, final-step success): see ``benchmarks/results/foreign_experts.md``.
    """

    def __init__(self, env: gym.Env, quality: str = "expert", seed: int | None = None):
        super().__init__(env, quality, seed, body="fingertip", n_arm=2, kp=400.0, kd=40.0)
        self._target_id = self.model.body("target").id

    def act(self, obs: dict, env: gym.Env | None = None) -> np.ndarray:
        """Torque action float32 ``(2,)`` for the current simulator state (``obs`` is not needed)."""
        target = self.data.xpos[self._target_id][:2] + self.aim_offset[:2]
        return self._torque_action(self._ik(target))


class PusherExpert(_JointSpaceExpert):
    """Pusher-v5 expert: place the hand's U-shaped fork behind the object (seen from the goal), lower it to
    the object's height, then push along the object-to-goal line until the object's centre is on the goal.

    The controlled point is the ``tips_arm`` frame origin (centre of the fork's crossbar); its x axis (the
    prongs) is aligned with the push direction and its z axis kept vertical (soft, weight ``0.1 m/rad``).
    Phases: ``approach`` (0.08 m above the pre-push point; at most 30 steps) -> ``descend`` (at most 15
    steps) -> ``push``. Computed-torque PD ``Kp = 120 1/s^2``, ``Kd = 22 1/s`` at 20 Hz; torques clipped to
    ``[-2, 2]`` N*m.

    Physics note (measured with mujoco 4.0): the object weighs 7.9e-6 kg, so MuJoCo's contact regulariser
    (scaled by the inverse body weight) makes the hand-object contact very soft: the object moves at about
    ``0.8 * penetration`` m/s against its 0.5 N*s/m joint damping. The expert therefore servos a constant
    penetration ``DEPTH_M`` behind the object instead of following a path, and the 100-step (5 s) episode
    limits how far any controller can push it (~0.15 m): the success rate is bounded well below 100%.
    """

    STANDOFF_M = 0.11  # fork centre behind the object centre before pushing (object radius 0.05 + capsule 0.02)
    CONTACT_M = 0.07  # fork centre behind the object centre while pushing
    HOVER_M = 0.08  # approach height above the object's centre (fork bottom clears the object's top by 1 cm)
    ROT_WEIGHT = 0.1  # weight of the orientation error in the IK, m/rad
    DEPTH_M = 0.065  # commanded contact penetration while pushing (see the class docstring)

    def __init__(self, env: gym.Env, quality: str = "expert", seed: int | None = None):
        super().__init__(env, quality, seed, body="tips_arm", n_arm=7, kp=120.0, kd=22.0)
        self._object_id = self.model.body("object").id
        self._goal_id = self.model.body("goal").id

    def reset(self, seed: int | None = None) -> None:
        """Start a new episode (phase ``approach``) and re-seed the degradation noise."""
        super().reset(seed)
        self.phase = "approach"
        self._phase_steps = 0
        self._direction: np.ndarray | None = None

    def act(self, obs: dict, env: gym.Env | None = None) -> np.ndarray:
        """Torque action float32 ``(7,)`` for the current simulator state (``obs`` is not needed)."""
        d = self.data
        obj = d.xpos[self._object_id].copy()
        goal = d.xpos[self._goal_id].copy() + self.aim_offset
        hand = d.xpos[self.body_id]
        if self._direction is None or self.phase == "push" and np.linalg.norm((goal - obj)[:2]) > 0.02:
            self._direction = _unit_xy(goal - obj)
        u = self._direction
        pre = obj - self.STANDOFF_M * u
        self._phase_steps += 1
        if self.phase == "approach" and (np.linalg.norm(hand[:2] - pre[:2]) < 0.03 or self._phase_steps > 30):
            self.phase, self._phase_steps = "descend", 0
        if self.phase == "descend" and (abs(hand[2] - pre[2]) < 0.02 or self._phase_steps > 15):
            self.phase, self._phase_steps = "push", 0
        if self.phase == "approach":
            target = pre + np.array([0.0, 0.0, self.HOVER_M])
        elif self.phase == "descend":
            target = pre
        else:
            target = obj - (self.CONTACT_M - self.DEPTH_M) * u
        return self._torque_action(self._ik(target, _frame_from_x(u), rot_weight=self.ROT_WEIGHT))


def _unit_xy(v: np.ndarray) -> np.ndarray:
    w = np.array([v[0], v[1], 0.0])
    return w / max(np.linalg.norm(w), 1e-9)


def _frame_from_x(x_axis: np.ndarray) -> np.ndarray:
    """Rotation ``(3, 3)`` with columns x = ``x_axis`` (horizontal unit), z = world up, y = z cross x."""
    z = np.array([0.0, 0.0, 1.0])
    return np.stack([x_axis, np.cross(z, x_axis), z], axis=1)
