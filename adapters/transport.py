"""Policies and environments across processes over ZeroMQ: PolicyServer / RemotePolicy and EnvServer / RemoteEnv.

``RemotePolicy`` is a :class:`~policylink.adapters.policy.PolicyAdapter`: the observation history lives on the
server (in the served policy); the client queues ``update_observation`` batches and ships them with the next
``reset`` or ``infer``, so one ``predict_action_chunk`` is one round trip carrying the whole ``(B, ...)``
batch. ``RemoteEnv`` is an :class:`~policylink.adapters.env.EnvAdapter` (a ``gymnasium.Env``), so a
simulator or robot can live in its own dependency-isolated process. Protocol: DESIGN.md section 3.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from policylink.adapters import security
from policylink.adapters.env import EnvAdapter
from policylink.adapters.policy import PolicyAdapter
from policylink.adapters.protocol import (
    ENV_REPLIES,
    ENV_REQUESTS,
    POLICY_REPLIES,
    POLICY_REQUESTS,
    ErrorCode,
    ProtocolError,
)
from policylink.adapters.rpc import DEFAULT_MAX_MESSAGE_BYTES, Channel, Server
from policylink.adapters.schema import (
    STEP_BEFORE_RESET,
    TASK_KEY,
    ActionError,
    EnvSpec,
    ObservationError,
    PolicySpec,
    coerce_action,
    validate_observation,
)

__all__ = ["PolicyServer", "RemotePolicy", "EnvServer", "RemoteEnv", "LiveEnv"]


class PolicyServer(Server):
    """Serve a :class:`PolicyAdapter` on a ZeroMQ ROUTER socket (verbs ``hello``, ``ping``, ``reset``, ``infer``).

    Observations are validated against the policy's :class:`PolicySpec` (dtype, shape ``(B, *shape)``) before
    the policy sees them; chunks are checked to be float32 ``(B, chunk_size, A)``. Calls into the policy are
    serialised by :attr:`lock` (share it with another endpoint serving the same policy, e.g. openpi).

    Args:
        policy: the policy to serve.
        bind, curve_keys, insecure, max_message_bytes, name, rescue_after_s: see
            :class:`~policylink.adapters.rpc.Server`.
    """

    kind = "policy"
    requests = POLICY_REQUESTS
    failure_code = ErrorCode.INFER_FAILED

    def __init__(
        self,
        policy: PolicyAdapter,
        bind: str = "tcp://127.0.0.1:5555",
        *,
        curve_keys: str | Path | security.ServerKeys | None = None,
        insecure: bool = False,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        name: str | None = None,
        rescue_after_s: float = 0.003,
        lock: threading.Lock | None = None,
    ):
        super().__init__(
            bind,
            curve_keys=curve_keys,
            insecure=insecure,
            max_message_bytes=max_message_bytes,
            name=name,
            rescue_after_s=rescue_after_s,
        )
        self.policy = policy
        self.lock = lock or threading.Lock()
        self._spec_dict = policy.spec.to_dict()
        feats = policy.spec.observation_features
        self._array_feats = [(k, np.dtype(f.dtype), f.shape) for k, f in feats.items() if not f.is_string]
        self._text_feats = [k for k, f in feats.items() if f.is_string]

    def spec_dict(self) -> dict[str, Any]:
        """The served policy's ``PolicySpec.to_dict()``."""
        return self._spec_dict

    def handle(self, verb: str, body: dict[str, Any]) -> dict[str, Any]:
        """``reset``: apply queued observations, then ``policy.reset(env_ids)``; ``infer``: apply them, then
        return ``{"actions": float32 (B, chunk_size, A)}``.

        Raises:
            ProtocolError: ``invalid_field`` for an off-spec observation (field names the key),
                ``infer_failed`` for a chunk of the wrong shape/dtype.
        """
        with self.lock:
            for i, obs in enumerate(body["updates"]):
                try:
                    if not self._conforms(obs):
                        validate_observation(self.policy.spec, obs, batch_dims=1)  # raises, naming every problem
                        sizes = _batch_sizes(obs, self.policy.spec)
                        if len(set(sizes.values())) > 1:
                            raise ObservationError(
                                [f"batch size: expected one leading dim B for every feature, received {sizes}"]
                            )
                    self.policy.update_observation(obs)
                except ObservationError as e:
                    key = e.problems[0].split(":", 1)[0] if e.problems else ""
                    raise ProtocolError(ErrorCode.INVALID_FIELD, str(e), f"body.updates[{i}].{key}") from None
            if verb == "reset":
                self.policy.reset(body.get("env_ids"))
                return {}
            chunk = self.policy.predict_action_chunk()
        spec = self.policy.spec
        expected = (spec.chunk_size, spec.action.dim)
        if not (
            type(chunk) is np.ndarray
            and chunk.dtype == np.float32
            and chunk.ndim == 3
            and chunk.shape[1:] == expected
            and np.isfinite(chunk).all()
        ):
            problems = spec.action.check(chunk, batch_dims=2) or [
                f"action chunk: expected (B, {expected[0]}, {expected[1]}), received {chunk.shape}"
            ]
            raise ProtocolError(ErrorCode.INFER_FAILED, str(ActionError(problems)), "actions")
        return {"actions": chunk}

    def _conforms(self, obs: dict[str, Any]) -> bool:
        """Fast check of one observation batch: every feature present with dtype, shape ``(B, *shape)`` and one
        ``B`` (``task`` a list of ``B`` str). False sends the batch through the detailed checks."""
        b = None
        for key, dtype, shape in self._array_feats:
            v = obs.get(key)
            if type(v) is not np.ndarray or v.dtype != dtype or v.shape[1:] != shape or v.ndim == 0:
                return False
            if b is None:
                b = v.shape[0]
            elif v.shape[0] != b:
                return False
        for key in self._text_feats:
            v = obs.get(key)
            if type(v) is not list or (b is not None and len(v) != b) or not all(type(t) is str for t in v):
                return False
        return True


def _batch_sizes(obs: Mapping[str, Any], spec: PolicySpec) -> dict[str, int]:
    return {k: len(obs[k]) for k in spec.observation_features if k in obs}


class RemotePolicy:
    """A :class:`PolicyAdapter` served by a :class:`PolicyServer` (or ``policylink serve``) at ``endpoint``.

    The spec comes from the server's ``hello``. Observation batches given to :meth:`update_observation` are
    queued (by reference: do not mutate them before the next call) and sent with the next :meth:`reset` or
    :meth:`predict_action_chunk` in one message; queued batches are dropped if that call fails (at most once).

    Args:
        endpoint: e.g. ``"tcp://127.0.0.1:5555"``.
        timeout_s: per-request timeout, seconds (``hello`` included).
        curve_keys: for a CURVE server: a key folder (its ``client.key_secret`` and ``server.key``) or
            ``security.load_client_keys(folder, "<client name>")``.
        validate: also check observations against the spec locally before sending (raises ObservationError
            without a round trip); the server always checks and answers ``invalid_field`` naming the key.

    Raises:
        EndpointError: ``endpoint`` is malformed (``"127.0.0.1:5599"`` -> "did you mean 'tcp://127.0.0.1:5599'?").
        TimeoutError: no ``hello`` reply within ``timeout_s``.
        VersionMismatchError: the server speaks another protocol version.
    """

    def __init__(
        self,
        endpoint: str,
        *,
        timeout_s: float = 10.0,
        curve_keys: str | Path | security.ClientKeys | None = None,
        validate: bool = False,
    ):
        self.endpoint = endpoint
        self._channel = Channel(endpoint, POLICY_REPLIES, timeout_s=timeout_s, curve_keys=curve_keys)
        self.server_info = self._channel.hello("policy")
        self._spec = PolicySpec.from_dict(self.server_info["spec"])
        self._validate = validate
        self._pending: list[dict[str, Any]] = []

    @property
    def spec(self) -> PolicySpec:
        """The served policy's :class:`PolicySpec` (from ``hello``)."""
        return self._spec

    def reset(self, env_ids: Sequence[int] | None = None) -> None:
        """Reset the episodes ``env_ids`` (``None`` = all) on the server, after any queued observations."""
        ids = None if env_ids is None else [int(i) for i in env_ids]
        updates, self._pending = self._pending, []
        self._channel.request("reset", {"env_ids": ids, "updates": updates})

    def update_observation(self, obs_batch: Mapping[str, Any]) -> None:
        """Queue one observation batch: arrays ``(B, *shape)``, ``task`` a list of ``B`` str.

        Raises:
            ObservationError: (with ``validate``) a feature is missing or has the wrong dtype/shape.
        """
        obs = dict(obs_batch)
        if TASK_KEY in obs and isinstance(obs[TASK_KEY], (list, tuple)):
            obs[TASK_KEY] = [str(s) for s in obs[TASK_KEY]]
        if self._validate:
            validate_observation(self._spec, obs, batch_dims=1)
        self._pending.append(obs)

    def predict_action_chunk(self) -> np.ndarray:
        """float32 ``(B, chunk_size, A)`` from the server, after sending the queued observations.

        Raises:
            TimeoutError: no reply in time (names server and verb).
            RemoteError: the server refused the request (e.g. ``invalid_field``) or the policy failed
                (``infer_failed``).
        """
        updates, self._pending = self._pending, []
        chunk = self._channel.request("infer", {"updates": updates})["actions"]
        spec = self._spec
        if chunk.dtype != np.float32 or chunk.ndim != 3 or chunk.shape[1:] != (spec.chunk_size, spec.action.dim):
            raise ActionError(
                [
                    f"action chunk from {self.endpoint}: expected float32 (B, {spec.chunk_size}, "
                    f"{spec.action.dim}), received {chunk.dtype} {chunk.shape}"
                ]
            )
        return chunk

    def ping(self) -> float:
        """Round-trip time to the server, seconds."""
        return self._channel.ping()

    def close(self) -> None:
        """Close the connection (the server keeps running)."""
        self._channel.close()

    def __enter__(self) -> RemotePolicy:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


@runtime_checkable
class LiveEnv(Protocol):
    """An environment that also reads sensors and sends commands without stepping (a robot; ``real`` builds it)."""

    def get_observation(self) -> dict[str, Any]: ...

    def send_action(self, action: np.ndarray) -> None: ...


class EnvServer(Server):
    """Serve an :class:`EnvAdapter` (verbs ``hello``, ``ping``, ``reset``, ``step``, ``get_observation``,
    ``send_action``); env calls are serialised on the worker thread.

    ``get_observation`` returns ``env.get_observation()`` for a :class:`LiveEnv`, else the latest observation
    of ``reset``/``step``; ``send_action`` needs a :class:`LiveEnv` (else ``unsupported``). Actions go through
    :func:`coerce_action` (float32 ``(A,)``, finite, clipped to the limits) before the env sees them.

    Args:
        env: the environment (its ``env_spec`` is sent in ``hello``).
        bind, curve_keys, insecure, max_message_bytes, name, rescue_after_s: see
            :class:`~policylink.adapters.rpc.Server`.
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
        rescue_after_s: float = 0.003,
    ):
        super().__init__(
            bind,
            curve_keys=curve_keys,
            insecure=insecure,
            max_message_bytes=max_message_bytes,
            name=name,
            rescue_after_s=rescue_after_s,
        )
        self.env = env
        self._spec_dict = env.env_spec.to_dict()
        self._last_obs: dict[str, Any] | None = None

    def spec_dict(self) -> dict[str, Any]:
        """The served env's ``EnvSpec.to_dict()``."""
        return self._spec_dict

    def handle(self, verb: str, body: dict[str, Any]) -> dict[str, Any]:
        """Run ``verb`` on the env. Raises ProtocolError (``invalid_field`` for an off-spec action,
        ``unsupported`` for ``send_action`` on a non-live env, ``env_failed`` when the env raises)."""
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
        endpoint: e.g. ``"tcp://127.0.0.1:5556"``.
        timeout_s: per-request timeout, seconds.
        curve_keys: for a CURVE server: a key folder (its ``client.key_secret`` and ``server.key``) or
            ``security.load_client_keys(folder, "<client name>")``.

    Raises:
        TimeoutError, VersionMismatchError: at construction, as for :class:`RemotePolicy`.
    """

    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(
        self, endpoint: str, *, timeout_s: float = 10.0, curve_keys: str | Path | security.ClientKeys | None = None
    ):
        self.endpoint = endpoint
        self._channel = Channel(endpoint, ENV_REPLIES, timeout_s=timeout_s, curve_keys=curve_keys)
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

    def ping(self) -> float:
        """Round-trip time to the server, seconds."""
        return self._channel.ping()

    def close(self) -> None:
        """Close the connection (the served env keeps running)."""
        self._channel.close()
