"""The simulated robot: a position-actuated Cartesian gantry (2 or 3 slide joints) with an optional
parallel-jaw gripper, driven by end-effector displacement commands.

The controller adds each ``ee_delta`` action to the *measured* end-effector position (so a blocked end
effector never winds up a far-away target), clips to the workspace and writes the result to the position
actuators; the physics moves the end effector there with real contact dynamics. Its only state is that target
and the gripper command, both set from scratch by :meth:`GantryController.reset`.
"""

from __future__ import annotations

import mujoco
import numpy as np

from policylink.adapters.schema import ActionSpec, ControlMode

GRIPPER_OPEN_M = 0.045  # finger joint position when open (each finger, metres from the centre line)


class GantryController:
    """End-effector position controller for the gantry in ``robot_gripper.xml`` / ``robot_pusher.xml``.

    Args:
        model, data: the MuJoCo model and data holding joints ``ee_x``, ``ee_y`` (+ ``ee_z``), site ``ee``
            and, with a gripper, joints ``finger_left`` / ``finger_right``.
        workspace_low, workspace_high: bounds of the ``ee`` site target, metres, ``(n_axes,)``.

    Raises:
        KeyError: the model lacks a required joint, actuator or site.
    """

    def __init__(self, model: mujoco.MjModel, data: mujoco.MjData, workspace_low, workspace_high):
        self.model, self.data = model, data
        self.n_axes = len(workspace_low)
        axes = ("ee_x", "ee_y", "ee_z")[: self.n_axes]
        self._qadr = np.array([model.joint(n).qposadr[0] for n in axes])
        self._dadr = np.array([model.joint(n).dofadr[0] for n in axes])
        self._act = np.array([model.actuator(n).id for n in axes])
        self.has_gripper = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_JOINT, "finger_left") >= 0
        if self.has_gripper:
            fingers = ("finger_left", "finger_right")
            self._finger_qadr = [int(model.joint(n).qposadr[0]) for n in fingers]
            self._finger_dadr = np.array([model.joint(n).dofadr[0] for n in fingers])
            self._finger_act = np.array([model.actuator(n).id for n in fingers])
            self._finger_act_left, self._finger_act_right = (int(i) for i in self._finger_act)
        self.site_id = model.site("ee").id
        self._ee_view = data.site_xpos[self.site_id]  # views stay valid: MjData buffers are never reallocated
        # memoryviews of the float64 buffers (the per-step path): an item read or write on one stores or returns the
        # same float64 as numpy's, at about half the cost of a numpy scalar access
        self._ctrl, self._qpos = memoryview(data.ctrl), memoryview(data.qpos)
        self.low = np.asarray(workspace_low, dtype=np.float64)
        self.high = np.asarray(workspace_high, dtype=np.float64)
        # site position at joint zero: ee = offset + q on the actuated axes
        ref = mujoco.MjData(model)
        mujoco.mj_kinematics(model, ref)
        self._offset = ref.site_xpos[self.site_id, : self.n_axes].copy()
        # per axis (index, actuator, low, high, offset) as Python ints and floats: one tuple unpack per axis a step
        limits = (self.low.tolist(), self.high.tolist(), self._offset.tolist())
        self._axes = tuple(zip(range(self.n_axes), self._act.tolist(), *limits))
        self._target = [0.0] * self.n_axes
        self.grip = 0.0

    def reset(self, ee_position: np.ndarray) -> None:
        """Place the end effector at ``ee_position`` (m, ``(n_axes,)``) at rest, gripper open, target there."""
        q = np.asarray(ee_position, dtype=np.float64) - self._offset
        self.data.qpos[self._qadr] = q
        self.data.qvel[self._dadr] = 0.0
        target = np.clip(np.asarray(ee_position, dtype=np.float64), self.low, self.high)
        self._target = target.tolist()
        self.data.ctrl[self._act] = target - self._offset
        self.grip = 0.0
        if self.has_gripper:
            self.data.qpos[self._finger_qadr] = GRIPPER_OPEN_M
            self.data.qvel[self._finger_dadr] = 0.0
            self.data.ctrl[self._finger_act] = GRIPPER_OPEN_M

    def command(self, delta: list[float] | np.ndarray, grip: float | None = None) -> None:
        """Target = measured ee + ``delta`` (m, ``(n_axes,)``: Python floats or an array) within the workspace;
        gripper 0 open, 1 closed."""
        # Python floats for these 2-3 numbers (same IEEE operations as the array form, a fraction of its cost),
        # written one by one into the cached ctrl view (no list -> array conversion)
        if isinstance(delta, np.ndarray):
            delta = delta.tolist()
        ctrl, target = self._ctrl, self._ee_view.tolist()  # x, y, z: the first n_axes become the target
        for k, i, low, high, offset in self._axes:
            t = target[k] + delta[k]
            if t < low:
                t = low
            elif t > high:
                t = high
            target[k] = t
            ctrl[i] = t - offset
        self._target = target
        if grip is not None and self.has_gripper:
            g = float(grip)  # clamped to [0, 1] with the values of min(max(g, 0.0), 1.0) (-0.0 and NaN pass)
            if g < 0.0:
                g = 0.0
            elif g > 1.0:
                g = 1.0
            self.grip = g
            ctrl[self._finger_act_left] = ctrl[self._finger_act_right] = GRIPPER_OPEN_M * (1.0 - g)

    @property
    def target(self) -> np.ndarray:
        """The ``ee`` site target of the last :meth:`command` / :meth:`reset`, m, float64 ``(n_axes,)``."""
        return np.array(self._target[: self.n_axes])

    @property
    def ee_position(self) -> np.ndarray:
        """Current ``ee`` site position, m, ``(3,)`` (valid after ``mj_kinematics``/``mj_forward``)."""
        return self._ee_view

    @property
    def opening(self) -> float:
        """Gripper opening as a fraction: 1 = fully open, 0 = fingers touching (mean of both fingers)."""
        if not self.has_gripper:
            return 0.0
        q, (left, right) = self._qpos, self._finger_qadr
        return (q[left] + q[right]) / (2.0 * GRIPPER_OPEN_M)


def xyz_delta_spec(max_delta_m: float) -> ActionSpec:
    """The gantry's end-effector delta action ``(dx, dy, dz)``, metres per control step, within ``+-max_delta_m``
    (tasks without a gripper: ``reach``, ``memory``)."""
    return ActionSpec(
        names=("dx", "dy", "dz"),
        control_mode=ControlMode.EE_DELTA,
        units=("m", "m", "m"),
        low=(-max_delta_m,) * 3,
        high=(max_delta_m,) * 3,
    )
