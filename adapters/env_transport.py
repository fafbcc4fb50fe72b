"""Environments across processes over ZeroMQ: ``EnvServer`` serves an :class:`~policylink.adapters.env.EnvAdapter`
and ``RemoteEnv`` is one (a ``gymnasium.Env``), so a simulator or robot can live in its own dependency-isolated
process. Protocol: DESIGN.md section 3 (:mod:`policylink.adapters.protocol`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from policylink.adapters import security
from policylink.adapters.env import EnvAdapter
from policylink.adapters.local_wire import open_channel
from policylink.adapters.protocol import ENV_REPLIES, ENV_REQUESTS, ErrorCode, ProtocolError
from policylink.adapters.rpc import DEFAULT_MAX_MESSAGE_BYTES, Server
from policylink.adapters.schema import ActionError, EnvSpec
from policylink.adapters.validation import STEP_BEFORE_RESET, coerce_action

__all__ = ["EnvServer", "RemoteEnv", "LiveEnv"]


@runtime_checkable
class LiveEnv(Protocol):
    """An environment that also reads sensors and sends commands without stepping (a robot; ``real`` builds it)."""

    def get_observation(self) -> dict[str, Any]: ...

    def send_action(self, action: np.ndarray) -> None: ...


class EnvServer(Server):
    """Serve an :class:`EnvAdapter` (verbs ``hello``, ``ping``, ``reset``, ``step``, ``get_observation``,
    ``send_action``, ``render``); env calls are serialised on the worker thread (one serving thread for a
    ``unix://`` bind).

    ``get_observation`` returns ``env.get_observation()`` for a :class:`LiveEnv`, else the latest observation
    of ``reset``/``step``; ``send_action`` needs a :class:`LiveEnv` (else ``unsupported``). Actions go through
    :func:`coerce_action` (float32 ``(A,)``, finite, clipped to the limits) before the env sees them.

    Args:
        env: the environment (its ``env_spec`` is sent in ``hello``).
        bind, curve_keys, insecure, max_message_bytes, name: see :class:`~policylink.adapters.rpc.Server`.
    """

    kind = "env"
    requests = ENV_REQUESTS
    failure_code = ErrorCode.ENV_FAILED

    def __init__(
        self,
        env: EnvAdapter,
        bind: str = "tcp://127.0.0.1:5556",
        *,
        curve_keys: str | Path | security.ServerKeys | None = None,
        insecure: bool = False,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        name: str | None = None,
    ):
        super().__init__(bind, curve_keys=curve_keys, insecure=insecure, max_message_bytes=max_message_bytes, name=name)
        self.env = env
        self._spec_dict = env.env_spec.to_dict()
        self._last_obs: dict[str, Any] | None = None

    def spec_dict(self) -> dict[str, Any]:
        """The served env's ``EnvSpec.to_dict()``."""
        return self._spec_dict

    def handle(self, verb: str, body: dict[str, Any]) -> dict[str, Any]:
        """Run ``verb`` on the env. Raises ProtocolError (``invalid_field`` for an off-spec action,
        ``unsupported`` for ``send_action`` on a non-live env, ``env_failed`` when the env raises)."""
        if verb == "render":
            frame = self.env.render()
            if frame is None:
                why = "render: the served env renders nothing; create it with render_mode='rgb_array'"
                raise ProtocolError(ErrorCode.UNSUPPORTED, why)
            return {"frame": np.ascontiguousarray(frame, dtype=np.uint8)}
        if verb == "reset":
            obs, info = self.env.reset(seed=body.get("seed"), options=body.get("options"))
            self._last_obs = obs
            return {"observation": obs, "info": dict(info)}
        if verb in ("step", "send_action"):
            try:
                action = coerce_action(self.env.env_spec.action, body["action"])
            except ActionError as e:
                raise ProtocolError(ErrorCode.INVALID_FIELD, "; ".join(e.problems), "body.action") from None
        if verb == "step":
            obs, reward, terminated, truncated, info = self.env.step(action)
            self._last_obs = obs
            return {
                "observation": obs,
                "reward": float(reward),
                "terminated": bool(terminated),
                "truncated": bool(truncated),
                "info": dict(info),
            }
        live = isinstance(self.env, LiveEnv)
        if verb == "send_action":
            if not live:
                raise ProtocolError(
                    ErrorCode.UNSUPPORTED,
                    f"send_action: {type(self.env).__name__} is not a live "
                    "env (no get_observation/send_action); use step",
                )
            self.env.send_action(action)
            return {}
        if live:
            return {"observation": self.env.get_observation()}
        if self._last_obs is None:
            raise ProtocolError(ErrorCode.ENV_FAILED, "get_observation: no observation yet; call reset first")
        return {"observation": self._last_obs}


class RemoteEnv(EnvAdapter):
    """An :class:`EnvAdapter` (``gymnasium.Env``) served by an :class:`EnvServer` at ``endpoint``.

    Observations are dicts of arrays without batch dim (+ ``task`` str); ``info["is_success"]`` comes from
    the served env. ``env_spec`` comes from ``hello``. ``step`` follows the same contract as a local env
    (:func:`coerce_action`, applied before sending): array-likes of any float dtype are accepted, actions outside
    the limits are clipped, and ``step`` before ``reset`` raises ``RuntimeError``.

    Args:
        endpoint: e.g. ``"tcp://127.0.0.1:5556"``, or ``"unix://PATH"`` for a server this machine runs
            (:mod:`policylink.adapters.local_wire`; no CURVE).
        timeout_s: per-request timeout, seconds.
        curve_keys: for a CURVE server: a key folder (its ``client.key_secret`` and ``server.key``) or
            ``security.load_client_keys(folder, "<client name>")``.
        alive: check that the server's process lives (an env process this client started): a request then raises
            ``ConnectionError`` within :data:`~policylink.adapters.channel.ALIVE_POLL_S` of its end.

    Raises:
        TimeoutError, VersionMismatchError: at construction, as for :class:`RemotePolicy`.
        ValueError: ``curve_keys`` with a ``unix://`` endpoint.
    """

    metadata: dict[str, Any] = {"render_modes": ["rgb_array"]}

    def __init__(
        self,
        endpoint: str,
        *,
        timeout_s: float = 10.0,
        curve_keys: str | Path | security.ClientKeys | None = None,
        alive: Callable[[], bool] | None = None,
    ):
        self.endpoint = endpoint
        self._channel = open_channel(endpoint, ENV_REPLIES, timeout_s=timeout_s, curve_keys=curve_keys, alive=alive)
        self.server_info = self._channel.hello("env")
        self.env_spec = EnvSpec.from_dict(self.server_info["spec"])
        self._init_spaces()
        self._needs_reset = True

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[dict[str, Any], dict]:
        """Reset the remote env; returns ``(observation, info)``."""
        super().reset(seed=seed)
        reply = self._channel.request("reset", {"seed": seed, "options": options})
        self._needs_reset = False
        return reply["observation"], reply["info"]

    def step(self, action: Any) -> tuple[dict[str, Any], float, bool, bool, dict]:
        """Step with an array-like ``(A,)`` (converted to float32 and clipped to the limits before sending);
        returns gymnasium's ``(obs, reward, terminated, truncated, info)``.

        Raises:
            RuntimeError: ``step`` before the first :meth:`reset`.
            ActionError: ``action`` is None, not numeric, not shape ``(A,)`` or not finite (nothing is sent).
            RemoteError: the env failed (``env_failed``).
        """
        if self._needs_reset:
            raise RuntimeError(STEP_BEFORE_RESET)
        action = coerce_action(self.env_spec.action, action)
        r = self._channel.request("step", {"action": action})
        return r["observation"], r["reward"], r["terminated"], r["truncated"], r["info"]

    def get_observation(self) -> dict[str, Any]:
        """The env's current observation (a live read for robots, else the latest one)."""
        return self._channel.request("get_observation", {})["observation"]

    def send_action(self, action: Any) -> None:
        """Send an array-like ``(A,)`` (as for :meth:`step`) without waiting for an observation (live envs only;
        else ``unsupported``). Raises ActionError as :meth:`step`."""
        action = coerce_action(self.env_spec.action, action)
        self._channel.request("send_action", {"action": action})

    def render(self) -> np.ndarray:
        """The served env's ``render()``: uint8 ``(H, W, 3)``.

        Raises:
            RemoteError: ``unsupported`` when the served env was not created with ``render_mode='rgb_array'``.
        """
        return self._channel.request("render", {})["frame"]

    def ping(self) -> float:
        """Round-trip time to the server, seconds."""
        return self._channel.ping()

    def close(self) -> None:
        """Close the connection (the served env keeps running)."""
        self._channel.close()
