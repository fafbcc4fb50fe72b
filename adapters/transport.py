"""Policies across processes over ZeroMQ: PolicyServer / RemotePolicy (environments: ``EnvServer`` / ``RemoteEnv``
in :mod:`policylink.adapters.env_transport`, re-exported here).

``RemotePolicy`` is a :class:`~policylink.adapters.policy.PolicyAdapter`: the observation history lives on the
server (in the served policy); the client queues ``update_observation`` batches and ships them with the next
``reset``, ``infer`` or ``embed``, so one ``predict_action_chunk`` is one round trip carrying the whole
``(B, ...)`` batch. It offers the capabilities its server advertises (RTC prefix, embeddings). Protocol:
DESIGN.md section 3.
"""

from __future__ import annotations

import functools
import math
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from policylink.adapters import security
from policylink.adapters.capabilities import ChunkPrefix, capabilities_of
from policylink.adapters.codec import check_keys
from policylink.adapters.env_transport import EnvServer, LiveEnv, RemoteEnv
from policylink.adapters.local_wire import open_channel
from policylink.adapters.policy import PolicyAdapter
from policylink.adapters.protocol import (
    POLICY_REPLIES,
    POLICY_REPLIES_BY_PROTOCOL,
    POLICY_REQUESTS,
    POLICY_REQUESTS_BY_PROTOCOL,
    ErrorCode,
    ProtocolError,
)
from policylink.adapters.rpc import DEFAULT_MAX_MESSAGE_BYTES, Server
from policylink.adapters.schema import (
    TASK_KEY,
    ActionError,
    ObservationError,
    PolicySpec,
)
from policylink.adapters.validation import batch_size_of, validate_observation

__all__ = ["PolicyServer", "RemotePolicy", "WIRE_CAPABILITIES", "EnvServer", "RemoteEnv", "LiveEnv"]

_FLOAT32 = np.dtype(np.float32)  # comparing a dtype with a dtype is cheaper than with the type np.float32


class PolicyServer(Server):
    """Serve a :class:`PolicyAdapter` on a ZeroMQ ROUTER socket (verbs ``hello``, ``ping``, ``reset``, ``infer``,
    and ``embed`` for an :class:`~policylink.adapters.capabilities.Embedder`).

    Observations are validated against the policy's :class:`PolicySpec` (dtype, shape ``(B, *shape)``) before
    the policy sees them; chunks are checked to be float32 ``(B', chunk_size, A)``. ``infer`` may name the rows
    ``env_ids`` (then ``policy.predict_action_chunk(env_ids)``) and carry an RTC ``prefix`` (then
    ``policy.predict_action_chunk_with_prefix(prefix, env_ids)``, for a
    :class:`~policylink.adapters.capabilities.PrefixConditioned` policy); its protocol-2 reply carries server
    ``timing``. ``hello`` advertises :attr:`capabilities`. Calls into the policy are serialised by :attr:`lock`
    (share it with another endpoint serving the same policy, e.g. openpi).

    Args:
        policy: the policy to serve.
        bind, curve_keys, insecure, max_message_bytes, name, inline_below_s: see
            :class:`~policylink.adapters.rpc.Server`.
        lock: the lock serialising policy calls (default: a new one).
    """

    kind = "policy"
    requests = POLICY_REQUESTS
    requests_by_protocol = POLICY_REQUESTS_BY_PROTOCOL
    failure_code = ErrorCode.INFER_FAILED
    user_maps_in_replies = False  # replies hold checked arrays and the server's own timing map

    def __init__(
        self,
        policy: PolicyAdapter,
        bind: str = "tcp://127.0.0.1:5555",
        *,
        curve_keys: str | Path | security.ServerKeys | None = None,
        insecure: bool = False,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        name: str | None = None,
        lock: threading.Lock | None = None,
        inline_below_s: float = 0.002,
    ):
        super().__init__(
            bind,
            curve_keys=curve_keys,
            insecure=insecure,
            max_message_bytes=max_message_bytes,
            name=name,
            inline_below_s=inline_below_s,
        )
        self.policy = policy
        self.lock = lock or threading.Lock()
        self.capabilities: list[str] = [c for c in capabilities_of(policy) if c in WIRE_CAPABILITIES]
        """Capabilities advertised in ``hello`` (those of the policy that the wire carries)."""
        self._spec_dict = policy.spec.to_dict()
        feats = policy.spec.observation_features
        self._array_feats = [(k, np.dtype(f.dtype), f.shape) for k, f in feats.items() if not f.is_string]
        self._text_feats = [k for k, f in feats.items() if f.is_string]
        self._chunk_shape = (policy.spec.chunk_size, policy.spec.action.dim)  # a chunk is (B', *_chunk_shape)

    def spec_dict(self) -> dict[str, Any]:
        """The served policy's ``PolicySpec.to_dict()``."""
        return self._spec_dict

    def hello_extras(self) -> dict[str, Any]:
        """``capabilities`` (sorted names) and, for an Embedder, ``latent_dim``."""
        extras: dict[str, Any] = {"capabilities": self.capabilities}
        if "embedder" in self.capabilities:
            extras["latent_dim"] = int(self.policy.latent_dim)
        return extras

    def handle(self, verb: str, body: dict[str, Any]) -> dict[str, Any]:
        """``reset``: apply queued observations, then ``policy.reset(env_ids)``; ``infer``: apply them, then return
        ``{"actions": float32 (B', chunk_size, A), "timing": {"inference_s"}}``; ``embed``: apply them, then return
        ``{"latent": float32 (B', latent_dim), "timing": ...}``. The request is checked before the policy is touched.

        Raises:
            ProtocolError: ``invalid_field`` for an off-spec observation (field names the key), a bad ``prefix``
                (``body.prefix.<field>``) or ``env_ids`` (``body.env_ids``); ``unsupported`` for a ``prefix`` or
                ``embed`` the policy does not offer; ``infer_failed`` for a chunk/latent of the wrong shape/dtype.
        """
        env_ids = body.get("env_ids")
        if env_ids is not None:
            _check_env_ids(env_ids)
        prefix = body.get("prefix")  # only infer's schema has one
        if prefix is not None:
            prefix = self._prefix(prefix, env_ids)
        if verb == "embed" and "embedder" not in self.capabilities:
            raise ProtocolError(
                ErrorCode.UNSUPPORTED, f"embed: {type(self.policy).__name__} is not an Embedder", "type"
            )
        with self.lock:
            self._apply(body["updates"])
            if verb == "reset":
                self.policy.reset(env_ids)
                return {}
            t0 = time.perf_counter()
            try:
                if verb == "embed":
                    out = self.policy.embed(None, env_ids)
                elif prefix is not None:
                    out = self.policy.predict_action_chunk_with_prefix(prefix, env_ids)
                else:  # a policy written before env_ids is called as before
                    out = (
                        self.policy.predict_action_chunk()
                        if env_ids is None
                        else self.policy.predict_action_chunk(env_ids)
                    )
            except IndexError as e:
                if env_ids is None:
                    raise
                raise ProtocolError(ErrorCode.INVALID_FIELD, str(e), "body.env_ids") from None
            timing = {"inference_s": time.perf_counter() - t0}
        rows = len(env_ids) if env_ids is not None else None if prefix is None else len(prefix.actions)
        if verb == "embed":
            return {"latent": self._checked_latent(out, rows), "timing": timing}
        return {"actions": self._checked_chunk(out, rows), "timing": timing}

    def _apply(self, updates: list[dict[str, Any]]) -> None:
        for i, obs in enumerate(updates):
            try:
                if not self._conforms(obs):
                    validate_observation(self.policy.spec, obs, batch_dims=1)  # raises, naming every problem
                    batch_size_of(obs, self.policy.spec.observation_features)
                self.policy.update_observation(obs)
            except ObservationError as e:
                key = e.problems[0].split(":", 1)[0] if e.problems else ""
                raise ProtocolError(ErrorCode.INVALID_FIELD, str(e), f"body.updates[{i}].{key}") from None

    def _prefix(self, wire: dict[str, Any], env_ids: list[int] | None) -> ChunkPrefix:
        """The request's :class:`ChunkPrefix`, checked (float32, shapes, values); raises ProtocolError."""
        if "prefix" not in self.capabilities:
            raise ProtocolError(
                ErrorCode.UNSUPPORTED,
                f"prefix: {type(self.policy).__name__} is not PrefixConditioned (real-time chunking)",
                "body.prefix",
            )
        for name in ("actions", "weights"):
            if wire[name].dtype != np.float32:
                raise ProtocolError(
                    ErrorCode.INVALID_FIELD,
                    f"prefix.{name}: expected dtype float32, received {wire[name].dtype}",
                    f"body.prefix.{name}",
                )
        method = wire.get("method") or "guidance"
        prefix = ChunkPrefix(wire["actions"], wire["weights"], float(wire["max_guidance"]), method)
        spec = self.policy.spec
        rows = len(env_ids) if env_ids is not None else wire["actions"].shape[0] if wire["actions"].ndim else 0
        try:
            return prefix.validate(rows, spec.chunk_size, spec.action.dim)
        except ValueError as e:
            field = str(e).split(":", 1)[0]
            raise ProtocolError(ErrorCode.INVALID_FIELD, str(e), f"body.{field}") from None

    def _checked_chunk(self, chunk: Any, rows: int | None) -> np.ndarray:
        """``chunk`` when it is float32 ``(B', chunk_size, A)`` (``B'`` = ``rows`` when given) of finite values; else
        ProtocolError ``infer_failed`` naming the problems.

        Finiteness: the dot product ``chunk . chunk`` (one BLAS call, far cheaper per call than a ufunc reduction) is
        finite exactly when every value is, unless a square overflows float32 (a value above ~1.8e19 in magnitude):
        only a non-finite dot goes on to the element-wise test."""
        expected = self._chunk_shape
        if (
            type(chunk) is np.ndarray
            and chunk.dtype == _FLOAT32
            and chunk.ndim == 3
            and chunk.shape[1:] == expected
            and (rows is None or len(chunk) == rows)
            and (math.isfinite(np.vdot(chunk, chunk)) or np.isfinite(chunk).all())
        ):
            return chunk
        problems = self.policy.spec.action.check(chunk, batch_dims=2) or [
            f"action chunk: expected ({'B' if rows is None else rows}, {expected[0]}, {expected[1]}), "
            f"received {getattr(chunk, 'shape', type(chunk).__name__)}"
        ]
        raise ProtocolError(ErrorCode.INFER_FAILED, str(ActionError(problems)), "actions")

    def _checked_latent(self, latent: Any, rows: int | None) -> np.ndarray:
        dim = int(self.policy.latent_dim)
        ok = type(latent) is np.ndarray and latent.dtype == np.float32 and latent.ndim == 2
        if not (ok and latent.shape[1] == dim and (rows is None or len(latent) == rows)):
            got = f"{latent.dtype} {latent.shape}" if isinstance(latent, np.ndarray) else type(latent).__name__
            raise ProtocolError(
                ErrorCode.INFER_FAILED,
                f"latent: expected float32 ({'B' if rows is None else rows}, {dim}), received {got}",
                "latent",
            )
        return latent

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
        for key in self._text_feats:  # a list's items are str already (parse_message checked every value)
            v = obs.get(key)
            if type(v) is not list or (b is not None and len(v) != b):
                return False
        return True


def _check_env_ids(env_ids: list[int]) -> None:
    """``env_ids`` of a request: non-negative and distinct, else ProtocolError naming ``body.env_ids``."""
    if any(i < 0 for i in env_ids) or len(set(env_ids)) != len(env_ids):
        raise ProtocolError(
            ErrorCode.INVALID_FIELD, f"env_ids: expected distinct indices >= 0, received {env_ids[:20]}", "body.env_ids"
        )


class RemotePolicy:
    """A :class:`PolicyAdapter` served by a :class:`PolicyServer` (or ``policylink serve``) at ``endpoint``.

    The spec and the capabilities come from the server's ``hello``: the instance is of a subclass of
    ``RemotePolicy`` that also implements :class:`~policylink.adapters.capabilities.PrefixConditioned` (the prefix
    rides ``infer``) and/or :class:`~policylink.adapters.capabilities.Embedder` (the ``embed`` verb) exactly when
    the server advertises them, so ``isinstance(remote, PrefixConditioned)`` answers truthfully. Observation
    batches given to :meth:`update_observation` are queued (by reference: do not mutate them before the next call)
    and sent with the next :meth:`reset`, :meth:`predict_action_chunk` or ``embed`` in one message; queued batches
    are dropped if that call fails (at most once). :attr:`last_timing` holds the timing of the latest call.

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
        VersionMismatchError: the server speaks none of this client's protocols.
    """

    _capabilities: frozenset[str] = frozenset()

    def __new__(
        cls,
        endpoint: str,
        *,
        timeout_s: float = 10.0,
        curve_keys: str | Path | security.ClientKeys | None = None,
        validate: bool = False,
    ) -> RemotePolicy:
        channel = open_channel(
            endpoint,
            POLICY_REPLIES,
            timeout_s=timeout_s,
            curve_keys=curve_keys,
            replies_by_protocol=POLICY_REPLIES_BY_PROTOCOL,
        )
        info = channel.hello("policy")
        self = super().__new__(_remote_class(cls, frozenset(info.get("capabilities", ()))))
        self._channel, self.server_info = channel, info
        return self

    def __init__(
        self,
        endpoint: str,
        *,
        timeout_s: float = 10.0,
        curve_keys: str | Path | security.ClientKeys | None = None,
        validate: bool = False,
    ):
        self.endpoint = endpoint
        self._spec = PolicySpec.from_dict(self.server_info["spec"])
        self._chunk_shape = (self._spec.chunk_size, self._spec.action.dim)  # a chunk is (B', *_chunk_shape)
        self._validate = validate
        self._pending: list[dict[str, Any]] = []
        self.last_timing: dict[str, float] = {}
        """Seconds: ``round_trip_s`` (client) and the server's ``receive_to_reply_s``, ``queue_s``,
        ``inference_s`` (protocol 2) of the latest ``infer``/``embed``."""

    @property
    def spec(self) -> PolicySpec:
        """The served policy's :class:`PolicySpec` (from ``hello``)."""
        return self._spec

    @property
    def capabilities(self) -> frozenset[str]:
        """Capability names this client offers (advertised by the server and carried by the wire)."""
        return type(self)._capabilities

    def reset(self, env_ids: Sequence[int] | None = None) -> None:
        """Reset the episodes ``env_ids`` (``None`` = all) on the server, after any queued observations."""
        ids = None if env_ids is None else [int(i) for i in env_ids]
        updates, self._pending = self._pending, []
        self._channel.request("reset", {"env_ids": ids, "updates": updates})

    def update_observation(self, obs_batch: Mapping[str, Any]) -> None:
        """Queue one observation batch: arrays ``(B, *shape)``, ``task`` a list of ``B`` str.

        Raises:
            CodecError: a map key in the batch (or nested in it) is not a str (nothing is queued).
            ObservationError: (with ``validate``) a feature is missing or has the wrong dtype/shape.
        """
        obs = dict(obs_batch)
        if TASK_KEY in obs and isinstance(obs[TASK_KEY], (list, tuple)):
            obs[TASK_KEY] = [str(s) for s in obs[TASK_KEY]]
        check_keys(obs, "observation")  # here, so that requests carrying it skip the codec's key walk
        if self._validate:
            validate_observation(self._spec, obs, batch_dims=1)
        self._pending.append(obs)

    def predict_action_chunk(self, env_ids: Sequence[int] | None = None) -> np.ndarray:
        """float32 ``(B', chunk_size, A)`` for rows ``env_ids`` (``None`` = all) from the server, after sending the
        queued observations. (A protocol-1 server computes every row; the rows asked for are returned.)

        Raises:
            TimeoutError: no reply in time (names server and verb).
            RemoteError: the server refused the request (e.g. ``invalid_field``) or the policy failed
                (``infer_failed``).
            ActionError: the reply is not float32 ``(B', chunk_size, A)``.
        """
        return self._infer(env_ids, None)

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

    def _call(self, verb: str, body: dict[str, Any]) -> dict[str, Any]:
        """One request carrying the queued observations; records :attr:`last_timing`."""
        updates, self._pending = self._pending, []
        t0 = time.perf_counter()
        # every map in the request: a queued observation (keys checked when queued) or built here with str keys
        reply = self._channel.request(verb, {"updates": updates, **body}, check_keys=False)
        self.last_timing = {"round_trip_s": time.perf_counter() - t0, **reply.get("timing", {})}
        return reply

    def _infer(self, env_ids: Sequence[int] | None, prefix: ChunkPrefix | None) -> np.ndarray:
        ids = None if env_ids is None else [int(i) for i in env_ids]
        body: dict[str, Any] = {}
        if self._channel.protocol >= 2:
            if ids is not None:  # absent = every row
                body["env_ids"] = ids
            if prefix is not None:
                body["prefix"] = {
                    "actions": np.asarray(prefix.actions, np.float32),
                    "weights": np.asarray(prefix.weights, np.float32),
                    "max_guidance": float(prefix.max_guidance),
                    **({"method": prefix.method} if prefix.method != "guidance" else {}),
                }
        chunk = self._call("infer", body)["actions"]
        if ids is not None and self._channel.protocol < 2:
            chunk = chunk[ids]
        rows = None if ids is None else len(ids)
        if (
            chunk.dtype != _FLOAT32
            or chunk.ndim != 3
            or chunk.shape[1:] != self._chunk_shape
            or rows not in (None, len(chunk))
        ):
            expected = ("B" if rows is None else rows, *self._chunk_shape)
            got = f"{chunk.dtype} {chunk.shape}"
            raise ActionError([f"action chunk from {self.endpoint}: expected float32 {expected}, received {got}"])
        return chunk


class _RemotePrefixConditioned:
    """:class:`~policylink.adapters.capabilities.PrefixConditioned` over the wire (mixed into RemotePolicy)."""

    def predict_action_chunk_with_prefix(self, prefix: ChunkPrefix, env_ids: Sequence[int] | None = None) -> np.ndarray:
        """float32 ``(B', H, A)`` for rows ``env_ids``, sampled on the server toward ``prefix`` (rows follow
        ``env_ids``); raises as :meth:`RemotePolicy.predict_action_chunk` (``invalid_field`` names
        ``body.prefix.<field>`` for a malformed prefix)."""
        return self._infer(env_ids, prefix)


class _RemoteEmbedder:
    """:class:`~policylink.adapters.capabilities.Embedder` over the wire (mixed into RemotePolicy)."""

    @property
    def latent_dim(self) -> int:
        """``D`` (from ``hello``)."""
        return int(self.server_info["latent_dim"])

    def embed(self, obs: Mapping[str, Any] | None = None, env_ids: Sequence[int] | None = None) -> np.ndarray:
        """float32 ``(B', D)``: the server policy's latent of its current history windows for rows ``env_ids``,
        after sending the queued observations.

        Raises:
            ValueError: ``obs`` is not None (the server embeds its own windows; queue observations with
                :meth:`update_observation`).
            RemoteError, TimeoutError: as for ``predict_action_chunk``.
        """
        if obs is not None:
            raise ValueError(
                "obs: expected None (a remote policy embeds the server's history windows; send observations with "
                "update_observation first)"
            )
        ids = None if env_ids is None else [int(i) for i in env_ids]
        latent = self._call("embed", {"env_ids": ids})["latent"]
        if latent.dtype != np.float32 or latent.ndim != 2 or latent.shape[1] != self.latent_dim:
            raise ValueError(
                f"latent from {self.endpoint}: expected float32 (B, {self.latent_dim}), received "
                f"{latent.dtype} {latent.shape}"
            )
        return latent


_MIXINS = {"prefix": _RemotePrefixConditioned, "embedder": _RemoteEmbedder}
WIRE_CAPABILITIES = tuple(sorted(_MIXINS))
"""Capabilities the policy protocol carries (names of :data:`~policylink.adapters.capabilities.CAPABILITIES`)."""


@functools.cache
def _remote_class(base: type, advertised: frozenset[str]) -> type:
    """``base`` itself, or a subclass of it mixing in the wire capabilities in ``advertised``."""
    caps = frozenset(advertised & _MIXINS.keys())
    if not caps:
        return base
    mixins = tuple(_MIXINS[c] for c in sorted(caps))
    name = base.__name__ + "".join(f"[{c}]" for c in sorted(caps))
    return type(name, (base, *mixins), {"_capabilities": caps, "__module__": base.__module__})
