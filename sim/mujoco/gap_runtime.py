"""A :class:`~policylink.sim.mujoco.gap.RealityGap` applied to one MuJoCo task: model fields at each reset (from
the nominal values saved once), then every action (deadband, backlash, delay) and every observation (joint and
object noise, joint bias, image noise, dropped frames) of the episode.

The task env (:class:`~policylink.sim.mujoco.base.MujocoTaskEnv`, kwarg ``gap``) owns one :class:`GapRuntime` and
calls :meth:`GapRuntime.reset` after its visual randomisation, :meth:`GapRuntime.action` on each clipped action
and :meth:`GapRuntime.observe` on each observation.
"""

from __future__ import annotations

from typing import Any

import mujoco
import numpy as np

from policylink.adapters.schema import IMAGE_PREFIX, STATE_KEY, ActionSpec
from policylink.sim.mujoco.cameras import CameraPoseShift, shift_camera_pose
from policylink.sim.mujoco.gap import RealityGap
from policylink.sim.mujoco.perturbations import PerturbationConfig, Perturber

MAX_SPEED = 10.0
"""Fastest plausible linear speed of a simulated tabletop robot and its objects, m/s (slide joints, a free joint's
translation): the MuJoCo tasks' scripted episodes stay below 0.4, while a diverged contact solve flings an object
at 4-7e6 (``worn_gantry``, 80 expert episodes, seeds 0-79: the 4 that diverged)."""

MAX_ANGULAR_SPEED = 50.0
"""Fastest plausible angular speed, rad/s (hinges, ball joints, a free joint's rotation): a 4 cm cube that slips
out of the gripper tumbles at up to 23 rad/s in sound episodes (``worn_gantry`` seeds 12 and 61, both successful),
while a blow-up spins it at 79-1401 before or as it is flung (seeds 5, 7, 30, 45)."""


def _angular_dofs(model: Any, nv: int) -> np.ndarray:
    """bool ``(nv,)``: which degrees of freedom of ``model`` are rotations (all False without a model)."""
    types, adr, jnt = (getattr(model, k, None) for k in ("jnt_type", "jnt_dofadr", "dof_jntid"))
    if types is None or adr is None or jnt is None or len(jnt) != nv:
        return np.zeros(nv, bool)
    t, first = np.asarray(types)[jnt], np.asarray(adr)[jnt]
    free = int(mujoco.mjtJoint.mjJNT_FREE)
    rotating = (t == int(mujoco.mjtJoint.mjJNT_HINGE)) | (t == int(mujoco.mjtJoint.mjJNT_BALL))
    return rotating | ((t == free) & (np.arange(nv) - first >= 3))


def physics_fault(env: Any, max_speed: float = MAX_SPEED, max_angular_speed: float = MAX_ANGULAR_SPEED) -> str | None:
    """Why the simulation of ``env`` diverged, or None while it is sane.

    Reads MuJoCo's state through ``env.unwrapped.data`` (``qpos``, ``qvel``) and ``env.unwrapped.model`` (which
    degrees of freedom rotate); an env without ``data`` (not MuJoCo) is never judged, one without ``model`` has
    every speed held to ``max_speed``. Diverged: a non-finite ``qpos``/``qvel`` entry, a linear speed above
    ``max_speed`` or an angular one above ``max_angular_speed`` (a contact solve that blew up; MuJoCo itself only
    warns once values reach 1e10, many steps later). Under ``worn_gantry`` (cube mass x1.5 with friction x0.6) ~5%
    of the expert's episodes blow up so, flinging the cube to 1e2-1e7 m.

    Args:
        env: the task env (gymnasium-style, ``unwrapped`` optional) or anything with a MuJoCo ``data``.
        max_speed: linear speed limit, m/s (:data:`MAX_SPEED`).
        max_angular_speed: angular speed limit, rad/s (:data:`MAX_ANGULAR_SPEED`).
    Returns:
        A message naming the degree of freedom (``qvel`` index) and its value, or None.
    """
    base = getattr(env, "unwrapped", env)
    data = getattr(base, "data", None)
    qpos, qvel = getattr(data, "qpos", None), getattr(data, "qvel", None)
    if qpos is None or qvel is None:
        return None
    qpos, qvel = np.asarray(qpos, np.float64), np.asarray(qvel, np.float64)
    if not (np.isfinite(qpos).all() and np.isfinite(qvel).all()):
        return "physics diverged: non-finite joint position or velocity"
    if not qvel.size:
        return None
    speed = np.abs(qvel)
    angular = _angular_dofs(getattr(base, "model", None), qvel.size)
    over = speed - np.where(angular, float(max_angular_speed), float(max_speed))
    if float(over.max()) > 0:
        i = int(over.argmax())
        kind, limit = ("angular", max_angular_speed) if angular[i] else ("linear", max_speed)
        return f"physics diverged: joint velocity {i} is {qvel[i]:.1f}, above the plausible {kind} {limit}"
    return None


class GapRuntime:
    """Per-env state of a reality gap.

    Args:
        model: the task's compiled model (changed in place at each :meth:`reset`).
        gap: the gap (fixed or a distribution).
        action: the task's ActionSpec; deadband and backlash act on its dimensions in metres.
        n_proprio: leading ``observation.state`` entries that describe the robot (joint noise / bias).
        center: workspace centre ``(3,)`` m, the pivot of the camera shift.
        hold_action: the action that holds the robot still, float32 ``(A,)`` (fills the delay queue).

    Attributes:
        episode_gap: the gap drawn for the running episode (fixed values).
    """

    def __init__(
        self,
        model: mujoco.MjModel,
        gap: RealityGap,
        action: ActionSpec,
        n_proprio: int,
        center: np.ndarray,
        hold_action: np.ndarray,
    ):
        self.model, self.gap, self.n_proprio = model, gap, int(n_proprio)
        self.center = np.asarray(center, np.float64)
        self._low, self._high, self._hold = action.low_array, action.high_array, np.asarray(hold_action, np.float32)
        self._metric = np.array([u == "m" for u in action.units], bool)
        m = model
        self._nominal = {
            "geom_friction": m.geom_friction.copy(),
            "body_mass": m.body_mass.copy(),
            "body_inertia": m.body_inertia.copy(),
            "dof_damping": m.dof_damping.copy(),
            "actuator_gainprm": m.actuator_gainprm.copy(),
            "actuator_biasprm": m.actuator_biasprm.copy(),
            "cam_quat": m.cam_quat.copy(),
            "cam_fovy": m.cam_fovy.copy(),
        }
        self._servo = (m.actuator_gaintype == mujoco.mjtGain.mjGAIN_FIXED) & (
            m.actuator_biastype == mujoco.mjtBias.mjBIAS_AFFINE
        )
        self._rng = np.random.default_rng([gap.seed])
        self.episode_gap = gap.sample(self._rng)  # the model is set at the first reset

    # ------------------------------------------------------------------------------------------------- reset
    def reset(self, seed: int | None) -> RealityGap:
        """Start an episode: draw its gap (from ``default_rng([gap.seed, seed])``, or the running generator when
        ``seed`` is None), set the model fields from their nominal values, and clear the per-episode state
        (delay queue, backlash, bias, last observation). Call after the scene randomiser (which sets the camera
        positions and lights this shifts and scales). Returns the episode's gap."""
        if seed is not None:
            self._rng = np.random.default_rng([self.gap.seed, int(seed)])
        self.episode_gap = self.gap.sample(self._rng)
        self._start_episode()
        return self.episode_gap

    def _start_episode(self) -> None:
        g, m, nom = self.episode_gap, self.model, self._nominal
        d, s = g.dynamics, g.sensing
        m.geom_friction[:, 0] = nom["geom_friction"][:, 0] * d.friction_scale
        m.body_mass[1:] = nom["body_mass"][1:] * d.mass_scale
        m.body_inertia[1:] = nom["body_inertia"][1:] * d.mass_scale
        m.dof_damping[:] = nom["dof_damping"] * d.damping_scale
        m.actuator_gainprm[:] = nom["actuator_gainprm"]
        m.actuator_biasprm[:] = nom["actuator_biasprm"]
        m.actuator_gainprm[self._servo, 0] *= d.actuator_gain_scale
        m.actuator_biasprm[self._servo, 1] *= d.actuator_gain_scale
        m.cam_fovy[:] = np.clip(nom["cam_fovy"] + s.camera_fovy_deg, 1.0, 179.0)
        m.light_diffuse[:] = np.clip(m.light_diffuse * s.light_scale, 0.0, 1.0)
        shift = CameraPoseShift(s.camera_yaw_deg, s.camera_pitch_deg, s.camera_distance_m)
        for i in range(m.ncam):
            R = np.zeros(9)
            mujoco.mju_quat2Mat(R, nom["cam_quat"][i])
            p, R2 = shift_camera_pose(m.cam_pos[i], R.reshape(3, 3), shift, self.center)
            q = np.zeros(4)
            mujoco.mju_mat2Quat(q, R2.reshape(-1))
            m.cam_pos[i], m.cam_quat[i] = p, q
        self._delay = Perturber(
            PerturbationConfig(action_delay_steps=int(d.action_delay_steps)), self._low, self._high, self._hold
        )
        self._delay.reset(self._rng)
        self._slack = np.zeros(len(self._low))
        self._bias = self._rng.uniform(-s.joint_bias, s.joint_bias, self.n_proprio)
        self._last_obs: dict[str, Any] | None = None

    # ------------------------------------------------------------------------------------------------ action
    def action(self, action: list[float]) -> list[float]:
        """The action the robot executes for the clipped command ``action`` (``A`` floats, ActionSpec units):
        deadband, then backlash on the metric dimensions, then the delay. Returns ``A`` floats."""
        d = self.episode_gap.dynamics
        a = np.asarray(action, np.float64)
        if d.deadband_m > 0:
            a = np.where(self._metric & (np.abs(a) < d.deadband_m), 0.0, a)
        if d.backlash_m > 0:
            half = d.backlash_m / 2.0
            new = np.clip(self._slack + a, -half, half)  # the play takes up motion first
            a = np.where(self._metric, a - (new - self._slack), a)
            self._slack = np.where(self._metric, new, self._slack)
        if d.action_delay_steps > 0:
            a = self._delay.action(a.astype(np.float32), self._rng)
        return np.asarray(a, np.float32).tolist()

    # ------------------------------------------------------------------------------------------- observation
    def observe(self, obs: dict[str, Any]) -> dict[str, Any]:
        """The observation the robot reports for the true ``obs`` (not changed; a new dict): with probability
        ``drop_frame_probability`` the previous report again (never at an episode's first step), else the state
        with joint bias and noise (robot entries) and object noise (the rest), frames with image noise."""
        s, rng = self.episode_gap.sensing, self._rng
        if self._last_obs is not None and s.drop_frame_probability > 0 and rng.random() < s.drop_frame_probability:
            return self._last_obs
        out = dict(obs)
        if STATE_KEY in obs and (s.joint_noise_std or s.joint_bias or s.object_noise_std):
            state = np.asarray(obs[STATE_KEY], np.float64).copy()
            k = min(self.n_proprio, len(state))
            state[:k] += self._bias[:k] + rng.normal(0.0, s.joint_noise_std, k)
            state[k:] += rng.normal(0.0, s.object_noise_std, len(state) - k)
            out[STATE_KEY] = state.astype(np.float32)
        if s.image_noise_std > 0:
            for key, frame in obs.items():
                if key.startswith(IMAGE_PREFIX):
                    noisy = frame.astype(np.float32) + rng.normal(0.0, s.image_noise_std, frame.shape)
                    out[key] = np.clip(np.rint(noisy), 0, 255).astype(np.uint8)
        self._last_obs = out
        return out


__all__ = ["MAX_ANGULAR_SPEED", "MAX_SPEED", "GapRuntime", "physics_fault"]
