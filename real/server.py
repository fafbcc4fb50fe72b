"""A robot served over ZeroMQ: :class:`RobotServer` puts a :class:`~policylink.real.robot.Robot` behind its
:class:`~policylink.real.robot.SafeRobot` (always: a client cannot reach the motors any other way) and answers the
env verbs (so a plain :class:`~policylink.adapters.env_transport.RemoteEnv` can read it) plus robot verbs;
:class:`RemoteRobot` is the client, itself a :class:`~policylink.real.robot.RobotEnv` (the deployment loop steps it
in real time; the server's safety layer filters every action).

Robot verbs (wire protocol of DESIGN.md section 3, schemas below): ``observe`` (observation + episode info with
the safety status), ``act`` (an action -> the command actually sent, whether it was held, why), ``estop`` /
``reset_estop`` (the latch, from the client side), ``rearm`` (after a watchdog trip), ``home``, and ``hold`` (a
client's stop). ``send_action`` goes through the same safety layer. Actions are checked by the safety layer itself
(a NaN action is held, not refused), and ``step`` is not offered: a robot runs in real time. The safety status of
the ``estop``/``reset_estop``/``rearm``/``home``/``hold`` replies includes the watchdog period ``watchdog_s``
(seconds, None when off), so a client can stop its policy within it.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from policylink.adapters import security
from policylink.adapters.channel import Channel
from policylink.adapters.env_transport import EnvServer
from policylink.adapters.protocol import ENV_REPLIES, ENV_REQUESTS, ErrorCode, Field, ProtocolError
from policylink.adapters.rpc import DEFAULT_MAX_MESSAGE_BYTES
from policylink.adapters.schema import EnvSpec
from policylink.real.pacing import Clock
from policylink.real.robot import Robot, RobotEnv, SafeRobot
from policylink.real.safety import SafetyConfig, SafetyReport

_STATUS = {"safety": Field("any_map"), "info": Field("any_map", optional=True)}
ROBOT_REQUESTS: dict[str, dict[str, Field]] = {
    **ENV_REQUESTS,
    "observe": {},
    "act": {"action": Field("array")},
    "estop": {"reason": Field((str,), optional=True)},
    "reset_estop": {},
    "rearm": {},
    "home": {},
    "hold": {},
}
"""Request schemas of a robot server: the env verbs plus the robot verbs."""
ROBOT_REPLIES: dict[str, dict[str, Field]] = {
    **ENV_REPLIES,
    "observe": {"observation": Field("obs"), "info": Field("any_map")},
    "act": {"sent": Field("array"), "held": Field((bool,)), "reasons": Field("str_list")},
    "estop": _STATUS,
    "reset_estop": _STATUS,
    "rearm": _STATUS,
    "home": _STATUS,
    "hold": _STATUS,
}
"""Reply schemas of a robot server."""


class RobotServer(EnvServer):
    """Serve a robot with its safety layer (``kind`` ``"env"``, so env clients connect too).

    Args:
        robot: the driver, or an already wrapped :class:`SafeRobot` (a bare driver is wrapped with ``safety``).
        bind, curve_keys, insecure, max_message_bytes, name: as :class:`EnvServer` (loopback by default; elsewhere
            CURVE keys or ``insecure``).
        safety: the :class:`SafetyConfig` for a bare driver (default: from its ActionSpec, watchdog 0.5 s).

    Raises:
        EndpointError, InsecureBindError: as every server.
    """

    requests = ROBOT_REQUESTS

    def __init__(
        self,
        robot: Robot,
        bind: str = "tcp://127.0.0.1:5556",
        *,
        safety: SafetyConfig | None = None,
        curve_keys: str | Path | security.ServerKeys | None = None,
        insecure: bool = False,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        name: str | None = None,
    ):
        self.robot = robot if isinstance(robot, SafeRobot) else SafeRobot(robot, safety)
        super().__init__(
            self.robot,
            bind,
            curve_keys=curve_keys,
            insecure=insecure,
            max_message_bytes=max_message_bytes,
            name=name or f"policylink-robot:{robot.env_spec.name}",
        )

    def handle(self, verb: str, body: dict[str, Any]) -> dict[str, Any]:
        """Serve one verb through the safe robot. Raises ProtocolError: ``unsupported`` for ``step``,
        ``env_failed`` for a refused ``reset``/``home`` (e-stop latched) or a failing driver."""
        r = self.robot
        if verb == "act":
            sent = r.send_action(body["action"])
            report = r.last_report
            return {"sent": np.asarray(sent, np.float32), "held": bool(report.held), "reasons": list(report.reasons)}
        if verb == "send_action":
            r.send_action(body["action"])
            return {}
        if verb == "observe":
            obs, info = r.observe()
            return {"observation": obs, "info": info}
        if verb == "get_observation":
            return {"observation": r.get_observation()}
        if verb == "step":
            raise ProtocolError(
                ErrorCode.UNSUPPORTED,
                "step: a robot runs in real time; use send_action/act and get_observation/observe",
            )
        if verb == "estop":
            r.estop(body.get("reason") or "client")
        elif verb in ("reset_estop", "rearm", "hold"):
            getattr(r, verb)()
        else:  # reset, home: refused while the e-stop is latched
            try:
                if verb == "reset":
                    obs, info = r.reset(seed=body.get("seed"), options=body.get("options"))
                    return {"observation": obs, "info": dict(info)}
                r.home()
            except RuntimeError as e:
                raise ProtocolError(ErrorCode.ENV_FAILED, str(e)) from None
        return {"safety": {**r.safety.status(), "watchdog_s": r.safety.config.watchdog_s}}

    def stop(self) -> None:
        """Stop serving, then stop and disconnect the robot."""
        super().stop()
        try:
            self.robot.stop()
        finally:
            self.robot.disconnect()


class RemoteRobot(RobotEnv):
    """A robot served by a :class:`RobotServer` at ``endpoint``, as a :class:`~policylink.real.robot.RobotEnv`:
    ``step`` paces itself here (one ``act`` and one ``observe`` per period), the server's safety layer filters
    every action.

    Args:
        endpoint: e.g. ``"tcp://127.0.0.1:5556"``.
        hz: control rate of :meth:`step` (default the robot's ``control_frequency``).
        timeout_s: per-request timeout, seconds.
        curve_keys: for a CURVE server (as :class:`~policylink.adapters.env_transport.RemoteEnv`).
        clock: monotonic clock, seconds.

    Attributes:
        last_report: the latest ``act`` reply (command sent, held, reasons) as a SafetyReport; ``last_sent``,
            ``last_held``, ``last_reasons``: the same under their old names (deprecated: removed in the next release).

    Raises:
        TimeoutError, VersionMismatchError: at construction, when the server does not answer ``hello``.
    """

    def __init__(
        self,
        endpoint: str,
        *,
        hz: float | None = None,
        timeout_s: float = 5.0,
        curve_keys: str | Path | security.ClientKeys | None = None,
        clock: Clock = time.monotonic,
    ):
        self.endpoint = endpoint
        self._channel = Channel(endpoint, ROBOT_REPLIES, timeout_s=timeout_s, curve_keys=curve_keys)
        self.server_info = self._channel.hello("env")
        super().__init__(EnvSpec.from_dict(self.server_info["spec"]), hz, clock)
        self.last_sent, self.last_held, self.last_reasons = None, False, ()

    def get_observation(self) -> dict[str, Any]:
        """The robot's current observation."""
        return self._channel.request("get_observation", {})["observation"]

    def observe(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """``(observation, info)``: info has the episode state (simulators) and ``safety`` (status, counts)."""
        r = self._channel.request("observe", {})
        return r["observation"], r["info"]

    def send_action(self, action: Any) -> np.ndarray:
        """Send float32 ``(A,)``; returns the command the server sent to the motors after its safety layer."""
        r = self._channel.request("act", {"action": np.asarray(action, np.float32)})
        self.last_report = SafetyReport(r["sent"], r["held"], tuple(r["reasons"]))
        self.last_sent, self.last_held, self.last_reasons = r["sent"], r["held"], self.last_report.reasons
        return r["sent"]

    def _begin(self, seed: int | None, options: dict | None) -> tuple[dict[str, Any], dict[str, Any]]:
        """The server's ``reset`` (homes hardware; re-samples a simulator's scene from ``seed``)."""
        r = self._channel.request(
            "reset", {"seed": seed, "options": options}, timeout_s=max(self._channel.timeout_s, 30.0)
        )
        return r["observation"], r["info"]

    def home(self) -> None:
        """Home the robot (refused by the server while e-stopped: ``RemoteError``)."""
        self._channel.request("home", {}, timeout_s=max(self._channel.timeout_s, 60.0))

    def stop(self) -> None:
        """Hold the robot now (the server sends its clamped hold command; the motors stay powered)."""
        self._channel.request("hold", {})

    def estop(self, reason: str = "client") -> dict[str, Any]:
        """Latch the server's e-stop; returns the safety status."""
        return self._channel.request("estop", {"reason": reason})["safety"]

    def reset_estop(self) -> dict[str, Any]:
        """Release the e-stop latch; returns the safety status."""
        return self._channel.request("reset_estop", {})["safety"]

    def rearm(self) -> dict[str, Any]:
        """Re-arm a tripped watchdog; returns the safety status (with ``watchdog_s``, seconds or None)."""
        return self._channel.request("rearm", {})["safety"]

    def episode_info(self) -> dict[str, Any]:
        """The server's episode info (one ``observe``)."""
        return self.observe()[1]

    def disconnect(self) -> None:
        """Close the connection (the served robot keeps running, held by its watchdog)."""
        self._channel.close()


__all__ = ["ROBOT_REPLIES", "ROBOT_REQUESTS", "RemoteRobot", "RobotServer"]
