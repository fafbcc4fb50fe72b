"""The Robot protocol (one class per arm), :class:`RobotEnv` (a robot behind its safety layer as an environment
stepped in real time: the deployment loop's env) and :class:`SafeRobot`, a driver behind its safety layer: the only
way a command reaches the motors in the robot server.

A driver for a new arm subclasses :class:`Robot` and implements ``env_spec``, :meth:`Robot.get_observation` and
:meth:`Robot.send_action` (plus ``measured_pose`` in pose modes, ``connect``/``disconnect``/``home``/``stop`` where
the hardware needs them): the README's ``OneJointArm`` (tested as written) is a complete one.
"""

from __future__ import annotations

import logging
import threading
import time
from abc import ABC, abstractmethod
from typing import Any

import numpy as np

from policylink.adapters.env import EnvAdapter
from policylink.adapters.schema import STATE_KEY, EnvSpec
from policylink.real.pacing import Clock, Pacer
from policylink.real.safety import (
    POSE_MODES,
    SafetyConfig,
    SafetyConfigError,
    SafetyLayer,
    SafetyReport,
    TimeoutAction,
)
from policylink.real.teleop import Teleoperator

log = logging.getLogger(__name__)


class Robot(ABC):
    """A robot (or a simulator standing in for one) seen through the contract.

    Attributes:
        env_spec: the :class:`~policylink.adapters.schema.EnvSpec` (features, ActionSpec, control frequency).

    Observations are dicts of the spec's features (arrays without batch dim, ``task`` a str). Actions are
    float32 ``(A,)`` in the ActionSpec's units. Used as a context manager: ``connect`` on enter, ``stop`` and
    ``disconnect`` on exit.
    """

    env_spec: EnvSpec

    def connect(self) -> None:
        """Open the hardware (ports, cameras). Default: nothing to open."""
        return None

    def disconnect(self) -> None:
        """Release the hardware. Default: nothing to release."""
        return None

    @abstractmethod
    def get_observation(self) -> dict[str, Any]:
        """The current observation (a live sensor read)."""

    @abstractmethod
    def send_action(self, action: np.ndarray) -> np.ndarray:
        """Write float32 ``(A,)`` to the motors; returns the command actually written (a driver may clip it)."""

    def hold_action(self) -> np.ndarray | None:
        """The command that keeps the robot still, float32 ``(A,)``, or None when sending nothing holds it
        (position-controlled motors keep their last target). Default: None (the safety layer then uses zeros
        in delta modes and the measured pose in pose modes)."""
        return None

    def measured_pose(self) -> np.ndarray | None:
        """Where the robot is now, float32 ``(A,)`` in the action's units (``joint_position``: joint angles in
        radians; ``ee_position``: the end-effector pose as the action writes it), from the latest sensor read; None
        when unknown. Pose-mode drivers must implement it for a step-bounded :class:`SafeRobot` (``max_step`` is
        measured from it, and a hold keeps the robot at it). Default: not implemented (returns None)."""
        return None

    def home(self) -> None:
        """Move to the home pose (blocking). Default: nothing."""
        return None

    def stop(self) -> None:
        """Stop moving now (blocking). Default: send the hold command when there is one."""
        hold = self.hold_action()
        if hold is not None:
            self.send_action(hold)

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
        """Begin an episode: :meth:`home`, then ``(observation, info)``. A simulator re-samples its scene
        from ``seed``; hardware ignores it."""
        self.home()
        return self.get_observation(), {}

    def episode_info(self) -> dict[str, Any]:
        """Episode state known to the robot: ``is_success``/``terminated``/``truncated`` for a simulator;
        ``{}`` for hardware (success is judged elsewhere)."""
        return {}

    def observe(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """``(get_observation(), episode_info())`` in one call (a remote robot makes it one round trip)."""
        return self.get_observation(), self.episode_info()

    def __enter__(self) -> Robot:
        self.connect()
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            self.stop()
        finally:
            self.disconnect()


class WatchdogTripped(RuntimeError):
    """The robot's watchdog tripped (no fresh action within its period): it holds and refuses commands until an
    explicit re-arm, so the run ends rather than feeding a robot that executes nothing."""


class RobotEnv(Robot, EnvAdapter):
    """A robot behind its safety layer as an environment stepped in real time: the deployment loop's env.

    :class:`SafeRobot` (a driver in this process) and :class:`~policylink.real.server.RemoteRobot` (a robot server's
    client; the server's safety layer) are robot envs. Timing rules: ``real/README.md``.

    ``reset`` begins an episode and starts the pacing grid (:class:`~policylink.real.pacing.Pacer`: deadlines
    ``t0 + k * period``, overruns skipped) at its observation. ``step(a)``: the :attr:`teleop` human's action replaces
    ``a`` while engaged (an e-stop request latches the e-stop); ``a`` goes through the safety layer unless its period
    (begun at the observation it answers) has ended: then it is dropped and the robot holds, except for an episode's
    first action (the robot held during the first inference: the grid restarts now and the chunk runs from ``a_0``);
    then the step sleeps to the next deadline and observes. ``terminated``/``truncated`` come from the robot (a
    simulator's episode end); reward is 1 on success. ``info["deploy"]``: ``latency_s`` (observation to action),
    ``period_error_s`` (wake-up error), ``period_s`` (observation to observation), seconds; ``late`` (after its
    period), ``first``, ``source`` (index into :data:`~policylink.real.teleop.STEP_SOURCES`), ``sent`` float32
    ``(A,)`` (the command executed: a dropped action's is the hold command, else zeros); ``info["safety"]``: the
    safety status when the robot reports one.

    Args:
        env_spec: the robot's EnvSpec; hz: control rate (default its ``control_frequency``); clock: monotonic, s.

    Attributes:
        period (s), pacer, clock; ``teleop``: a :class:`~policylink.real.teleop.Teleoperator` or None;
        ``last_report``: the :class:`SafetyReport` of the latest action.

    Raises:
        WatchdogTripped: (``step``) the safety layer held the action: its watchdog tripped.
    """

    metadata: dict[str, Any] = {"render_modes": []}
    teleop: Teleoperator | None = None

    def __init__(self, env_spec: EnvSpec, hz: float | None, clock: Clock):
        self.env_spec, self.clock = env_spec, clock
        self._init_spaces()
        self.period = 1.0 / float(hz or env_spec.control_frequency)
        self.pacer = Pacer(self.period, clock)
        self.last_report = SafetyReport(None)
        self._obs: dict[str, Any] = {}
        self._obs_t, self._first = clock(), True

    @abstractmethod
    def _begin(self, seed: int | None, options: dict | None) -> tuple[dict[str, Any], dict[str, Any]]:
        """Begin an episode on the robot: ``(observation, info)``."""

    @abstractmethod
    def estop(self, reason: str = "") -> Any:
        """Latch the e-stop and stop the robot."""

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
        """Begin an episode on the robot (homes hardware; a simulator re-samples its scene from ``seed``); the
        pacing grid starts now. ``info["is_success"]`` is always set.

        Raises:
            RuntimeError: the e-stop is latched (``RemoteError`` from a robot server)."""
        obs, info = self._begin(seed, options)
        self.pacer.start()
        self._obs, self._obs_t, self._first = obs, self.pacer.t0, True
        return obs, {**info, "is_success": bool(info.get("is_success", False))}

    def step(self, action: Any) -> tuple[dict[str, Any], float, bool, bool, dict[str, Any]]:
        """Send (or drop, when late) float32 ``(A,)`` ``action``, wait for the next deadline, observe (see above)."""
        source = 0
        if self.teleop is not None:
            if self.teleop.estop_requested:
                self.estop("operator (keyboard)")
            if self.teleop.engaged:
                action, source = self.teleop.action(self._obs), 1
        now, first = self.clock(), self._first
        late = now > self._obs_t + self.period
        if late and first:  # the robot held for the episode's first chunk: a_0 starts now, for a whole period
            self.pacer.start(now)
        if late and not first:
            hold = self.hold_action()
            sent = np.zeros(self.env_spec.action.dim, np.float32) if hold is None else np.asarray(hold, np.float32)
        else:
            sent = np.asarray(self.send_action(action), np.float32)
            if "tripped" in self.last_report.reasons:
                raise WatchdogTripped(
                    "the robot's watchdog tripped (no fresh action within its period); it holds until re-armed"
                )
        wake_error = self.pacer.wait()
        obs, info = self.observe()
        t = self.clock()
        timing = dict(latency_s=now - self._obs_t, period_error_s=wake_error, period_s=t - self._obs_t, late=late)
        self._obs, self._obs_t, self._first = obs, t, False
        success = bool(info.get("is_success", False))
        step_info = {"is_success": success, "deploy": {**timing, "first": first, "source": source, "sent": sent}}
        if "safety" in info:
            step_info["safety"] = info["safety"]
        return obs, float(success), bool(info.get("terminated", False)), bool(info.get("truncated", False)), step_info

    def close(self) -> None:
        """Disconnect (the env's end is the connection's)."""
        self.disconnect()


class SafeRobot(RobotEnv):
    """``robot`` behind a :class:`SafetyLayer` and its watchdog thread; every motor command passes here. A
    :class:`RobotEnv`: the deployment loop steps it in this process (the robot server serves it to clients).

    The watchdog thread checks every ``watchdog_s / 4`` (at most 50 ms apart) and, when no valid action arrived
    within ``watchdog_s`` since the session's first one, holds or stops the robot once and refuses further actions
    until :meth:`rearm`. :meth:`reset` and :meth:`home` disarm it (a new session starts at the next action) and
    drop the step reference: in pose modes the next command is bounded from the robot's measured pose
    (:meth:`Robot.measured_pose`, read before every command), wherever the home or reset left it. The rules:
    ``real/README.md``.

    Args:
        robot: the driver.
        config: limits and timing (default: ``SafetyConfig.from_action_spec(robot.env_spec.action)``).
        hz: control rate of :meth:`step` (default the driver's ``control_frequency``).
        clock: monotonic clock, seconds (tests inject a fake one and call :meth:`poll_watchdog`).
        watchdog_thread: run the watchdog thread (False in tests that drive :meth:`poll_watchdog`).

    Raises:
        SafetyConfigError: a pose mode (``joint_position``/``ee_position``) with ``max_step`` over a driver that
            does not implement :meth:`Robot.measured_pose` (no reference, no bounded motion).

    Attributes:
        safety: the :class:`SafetyLayer`; ``last_report`` the report of the latest action.
    """

    def __init__(
        self,
        robot: Robot,
        config: SafetyConfig | None = None,
        *,
        hz: float | None = None,
        clock: Clock = time.monotonic,
        watchdog_thread: bool = True,
    ):
        config = config or SafetyConfig.from_action_spec(robot.env_spec.action)
        if config.needs_pose and type(robot).measured_pose is Robot.measured_pose:
            raise SafetyConfigError(
                f"SafeRobot: driver {type(robot).__name__} reports no measured pose (Robot.measured_pose is not "
                f"implemented); control_mode {config.control_mode!r} with max_step={config.max_step} bounds every "
                "command from the robot's measured pose: implement measured_pose() -> float32 (A,) in the "
                "action's units, or set max_step=None"
            )
        super().__init__(robot.env_spec, hz, clock)
        self.robot = robot
        self.safety = SafetyLayer(config)
        self._state: np.ndarray | None = None
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if watchdog_thread and self.safety.config.watchdog_s is not None:
            self._thread = threading.Thread(target=self._watch, daemon=True, name="policylink-watchdog")
            self._thread.start()

    def connect(self) -> None:
        """Connect the driver."""
        self.robot.connect()

    def disconnect(self) -> None:
        """Stop the watchdog thread and disconnect the driver."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2.0)
        self.robot.disconnect()

    def get_observation(self) -> dict[str, Any]:
        """The driver's observation (its state is kept for delta-mode workspace checks)."""
        return self._keep_state(self.robot.get_observation())

    def observe(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """The driver's ``(observation, episode info)`` plus the safety status under ``"safety"``."""
        obs, info = self.robot.observe()
        return self._keep_state(obs), {**info, "safety": self.safety.status()}

    def _keep_state(self, obs: dict[str, Any]) -> dict[str, Any]:
        if STATE_KEY in obs:
            self._state = np.asarray(obs[STATE_KEY])
        return obs

    def send_action(self, action: Any) -> np.ndarray:
        """Filter ``action`` (any value, checked here) through the safety layer and write the result; returns
        the command written (the hold command when it was rejected; zeros of ``(A,)`` when nothing was written)."""
        with self._lock:
            self.poll_watchdog()
            state = self._state if self.safety.config.workspace_low is not None else None
            report = self.safety.command(action, self.clock(), state, self._driver_hold(), self._pose())
            self.last_report = report
            if report.command is None:
                return np.zeros(self.safety.dim, np.float32)
            return np.asarray(self.robot.send_action(report.command), np.float32)

    def hold_action(self) -> np.ndarray | None:
        """The driver's hold command."""
        return self.robot.hold_action()

    def measured_pose(self) -> np.ndarray | None:
        """The driver's measured pose."""
        return self.robot.measured_pose()

    def hold(self) -> None:
        """Send the (clamped) hold command now, if there is one (pose modes: the measured pose)."""
        with self._lock:
            cmd = self.safety.hold_command(self._state, self._driver_hold(), self._pose())
            if cmd is not None:
                self.robot.send_action(cmd)

    def _pose(self) -> np.ndarray | None:
        """The driver's measured pose in pose modes (None otherwise, or when reading it fails: then nothing moves)."""
        if self.safety.config.control_mode not in POSE_MODES:
            return None
        try:
            return self.robot.measured_pose()
        except Exception as e:  # a failing sensor read must hold the robot, not crash the server
            log.warning(
                "safety: %s.measured_pose failed (%s: %s); holding", type(self.robot).__name__, type(e).__name__, e
            )
            return None

    def _driver_hold(self) -> np.ndarray | None:
        try:
            return self.robot.hold_action()
        except Exception as e:
            log.warning("safety: %s.hold_action failed (%s: %s)", type(self.robot).__name__, type(e).__name__, e)
            return None

    def home(self) -> None:
        """Home the driver (refused while e-stopped) and disarm the watchdog.

        Raises:
            RuntimeError: the e-stop is latched.
        """
        with self._lock:
            self._refuse_when_estopped("home")
            self.safety.forget_reference()  # whatever happens during the home, the reference is no longer valid
            self.robot.home()
            if not self._tripped():
                self.safety.rearm()

    def stop(self) -> None:
        """Stop the driver."""
        with self._lock:
            self.robot.stop()

    def _begin(self, seed: int | None, options: dict | None) -> tuple[dict[str, Any], dict[str, Any]]:
        """Begin an episode on the driver (:meth:`reset`; refused while e-stopped: RuntimeError); the watchdog
        restarts unarmed unless tripped."""
        with self._lock:
            self._refuse_when_estopped("reset")
            self.safety.forget_reference()
            obs, info = self.robot.reset(seed=seed, options=options)
            if not self._tripped():
                self.safety.rearm()
            return self._keep_state(obs), info

    def episode_info(self) -> dict[str, Any]:
        """The driver's episode info plus the safety status under ``"safety"``."""
        return {**self.robot.episode_info(), "safety": self.safety.status()}

    def estop(self, reason: str = "") -> None:
        """Latch the e-stop and stop the robot."""
        with self._lock:
            self.safety.estop(reason)
            self.robot.stop()

    def reset_estop(self) -> None:
        """Release the e-stop latch."""
        with self._lock:
            self.safety.forget_reference()
            self.safety.reset_estop()

    def rearm(self) -> None:
        """Clear a tripped watchdog (it arms again at the next action)."""
        with self._lock:
            self.safety.rearm()

    def poll_watchdog(self) -> bool:
        """Check the watchdog now; on a trip hold or stop the robot. True when it tripped on this call."""
        with self._lock:
            if not self.safety.check_watchdog(self.clock()):
                return False
            if self.safety.config.on_timeout == TimeoutAction.STOP.value:
                self.robot.stop()
            else:
                self.hold()
            return True

    def _tripped(self) -> bool:
        return self.safety.watchdog is self.safety.watchdog.TRIPPED

    def _refuse_when_estopped(self, what: str) -> None:
        if self.safety.estopped:
            raise RuntimeError(f"{what}: refused, the e-stop is latched ({self.safety.estop_reason}); reset it first")

    def _watch(self) -> None:
        period = max(min(self.safety.config.watchdog_s / 4.0, 0.05), 0.002)
        while not self._stop.wait(period):
            self.poll_watchdog()


__all__ = ["Clock", "Robot", "RobotEnv", "SafeRobot", "WatchdogTripped"]
