"""openpi interop: serve any PolicyAdapter to openpi clients over websocket, and use an openpi server as a
PolicyAdapter (``websockets`` is imported lazily).

Protocol (openpi-client 0.1.2 ``websocket_client_policy.py`` / ``msgpack_numpy.py`` and openpi's
``serving/websocket_policy_server.py``): after the handshake the server sends one binary msgpack message of
metadata; then each client message is one msgpack-numpy observation map and each reply one msgpack-numpy map
holding ``"actions"`` (``(H, A)``) and ``"server_timing"``; on failure the server sends a text frame with the
reason and closes with code 1011. Arrays are maps ``{b"__ndarray__": True, b"data": bytes, b"dtype":
dtype.str, b"shape": shape}`` and numpy scalars ``{b"__npgeneric__": True, b"data": item, b"dtype": str}``.
openpi observations are unbatched; keys are mapped to ours by a declared key map.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Mapping
from typing import Any

import msgpack
import numpy as np

from policylink.adapters.codec import SUPPORTED_DTYPES
from policylink.adapters.policy import HistoryPolicy, PolicyAdapter
from policylink.adapters.protocol import PROTOCOL_VERSION, ErrorCode, RemoteError
from policylink.adapters.schema import TASK_KEY, ActionError, PolicySpec
from policylink.adapters.validation import validate_observation
from policylink.adapters.ws import WebsocketServer, connect

DEFAULT_KEY_MAP: Mapping[str, str] = {"prompt": TASK_KEY}
_CLOSE_INTERNAL_ERROR = 1011
log = logging.getLogger(__name__)


def pack(obj: Any) -> bytes:
    """msgpack-numpy encoding as openpi-client writes it. Raises ValueError for object/void/complex dtypes."""
    return msgpack.packb(obj, default=_pack_default, use_bin_type=True)


def unpack(data: bytes) -> Any:
    """Decode openpi msgpack-numpy; arrays come back writable. Raises ValueError for an unsupported dtype,
    a data length that does not match ``dtype`` x ``shape``, or malformed msgpack."""
    try:
        return msgpack.unpackb(data, object_hook=_unpack_hook, raw=False, strict_map_key=False)
    except ValueError:
        raise
    except Exception as e:
        raise ValueError(f"openpi message: invalid msgpack ({type(e).__name__}: {e})") from None


def to_batch(obs: Mapping[str, Any], key_map: Mapping[str, str], spec: PolicySpec) -> tuple[dict[str, Any], bool]:
    """Map an openpi observation to one of our batches; returns ``(batch, was_batched)``.

    Keys go through ``key_map`` (openpi key -> ours); unmapped keys have ``/`` replaced by ``.``
    (``observation/state`` -> ``observation.state``). Unbatched arrays (``ndim == len(feature.shape)``) get a
    leading batch dim of 1 and a ``prompt`` str becomes a one-item list; batched input passes through.
    """
    mapped = {key_map.get(k, k.replace("/", ".")): v for k, v in obs.items()}
    feats = spec.observation_features
    batched = any(
        isinstance(mapped.get(k), np.ndarray) and mapped[k].ndim == len(f.shape) + 1
        for k, f in feats.items()
        if not f.is_string
    )
    if batched:
        return mapped, True
    out = dict(mapped)
    for k, f in feats.items():
        if k not in out:
            continue
        if f.is_string and isinstance(out[k], str):
            out[k] = [out[k]]
        elif not f.is_string:
            out[k] = np.asarray(out[k])[None]
    return out, False


class OpenPIServer(WebsocketServer):
    """Serve ``policy`` to openpi clients (``openpi_client.websocket_client_policy.WebsocketClientPolicy``).

    Each websocket connection is one episode: the policy is reset (all episodes) when a client connects.
    Replies are ``{"actions": float32 (H, A), "server_timing": {"infer_ms": float}}`` for an unbatched
    observation (``(B, H, A)`` for a batched one). ``GET /healthz`` answers 200.

    Args:
        policy: the policy to serve.
        host, port: where to listen; ``port=0`` picks a free port (see :attr:`port` after :meth:`start`).
        key_map: openpi key -> our key (default ``{"prompt": "task"}``; other keys map ``/`` to ``.``).
        lock: lock serialising policy calls (share it with a :class:`PolicyServer` of the same policy).
        insecure: allow a non-loopback ``host`` (websocket has no CURVE; logs a warning).
        metadata: extra entries of the metadata sent on connect (ours: ``{"policylink": {"protocol", "spec"}}``).
        max_message_bytes: larger messages close the connection (websockets ``max_size``).

    Raises:
        InsecureBindError: non-loopback ``host`` without ``insecure``.
    """

    def __init__(
        self,
        policy: PolicyAdapter,
        host: str = "127.0.0.1",
        port: int = 8000,
        *,
        key_map: Mapping[str, str] | None = None,
        lock: threading.Lock | None = None,
        insecure: bool = False,
        metadata: Mapping[str, Any] | None = None,
        max_message_bytes: int = 256 * 2**20,
    ):
        super().__init__(host, port, insecure=insecure, max_message_bytes=max_message_bytes, name="openpi-server")
        self.policy = policy
        self.key_map = dict(DEFAULT_KEY_MAP if key_map is None else key_map)
        self.lock = lock or threading.Lock()
        self.metadata = {
            **dict(metadata or {}),
            "policylink": {"protocol": PROTOCOL_VERSION, "spec": policy.spec.to_dict()},
        }

    async def _handler(self, ws: Any) -> None:
        import websockets

        await asyncio.to_thread(self._locked, self.policy.reset)
        await ws.send(pack(self.metadata))
        while True:
            try:
                message = await ws.recv()
            except websockets.ConnectionClosed:
                return
            try:
                if isinstance(message, str):
                    raise _BadRequest("openpi message: expected a binary msgpack frame, received text")
                reply = await asyncio.to_thread(self._infer, message)
            except Exception as e:  # report like openpi does: a text frame, then close with 1011
                code = ErrorCode.INVALID_FIELD if isinstance(e, _BadRequest) else ErrorCode.INFER_FAILED
                log.warning("openpi client %s: %s: %s", ws.remote_address, code.value, e)
                await ws.send(f"{code.value}: {e}")
                await ws.close(code=_CLOSE_INTERNAL_ERROR, reason=code.value)
                return
            await ws.send(pack(reply))

    def _locked(self, fn: Any, *args: Any) -> Any:
        with self.lock:
            return fn(*args)

    def _infer(self, message: bytes) -> dict[str, Any]:
        try:
            obs = unpack(message)
            if not isinstance(obs, dict):
                raise ValueError(f"openpi observation: expected a map, received {type(obs).__name__}")
            batch, batched = to_batch(obs, self.key_map, self.policy.spec)
            validate_observation(self.policy.spec, batch, batch_dims=1)
        except ValueError as e:  # ObservationError is a ValueError
            raise _BadRequest(str(e)) from None
        t0 = time.perf_counter()
        with self.lock:
            self.policy.update_observation(batch)
            chunk = self.policy.predict_action_chunk()
        infer_ms = (time.perf_counter() - t0) * 1e3
        return {"actions": chunk if batched else chunk[0], "server_timing": {"infer_ms": infer_ms}}


class OpenPIRemotePolicy(HistoryPolicy):
    """A :class:`PolicyAdapter` backed by an openpi websocket policy server (``scripts/serve_policy.py``).

    openpi servers are unbatched and stateless over the wire, so each episode ``b`` of a batch is one
    ``infer`` of its latest observation; the reply's ``actions`` (``(H', A)``) are cut to ``chunk_size``.
    ``predict_action_chunk(env_ids)`` sends only the rows asked for.

    Args:
        uri: ``"ws://host:port"``.
        spec: the served policy's :class:`PolicySpec` in our keys; None reads it from the server metadata
            (present when the server is a policylink :class:`OpenPIServer`).
        key_map: our key -> openpi key, e.g. ``{"observation.images.front": "observation/image",
            "observation.state": "observation/state", "task": "prompt"}``; unmapped keys are sent as they are.
        timeout_s: connect and per-reply timeout, seconds.
        api_key: sent as ``Authorization: Api-Key ...`` like openpi-client.

    Raises:
        TimeoutError: the server does not answer within ``timeout_s``.
        ValueError: ``spec`` is None and the server metadata carries none.
    """

    def __init__(
        self,
        uri: str,
        spec: PolicySpec | None = None,
        key_map: Mapping[str, str] | None = None,
        *,
        timeout_s: float = 30.0,
        api_key: str | None = None,
    ):
        self.uri, self.timeout_s = uri, timeout_s
        self.key_map = dict(key_map or {})
        self._headers = {"Authorization": f"Api-Key {api_key}"} if api_key else None
        self._ws: Any = None
        self.metadata = self._connect()
        if spec is None:
            theirs = self.metadata.get("policylink", {}) if isinstance(self.metadata, dict) else {}
            if "spec" not in theirs:
                raise ValueError(
                    f"spec: the openpi server at {uri} sends no policylink spec in its metadata "
                    f"(keys {sorted(self.metadata) if isinstance(self.metadata, dict) else []}); "
                    "pass spec=PolicySpec(...)"
                )
            spec = PolicySpec.from_dict(theirs["spec"])
        super().__init__(spec)

    def close(self) -> None:
        """Close the websocket."""
        if self._ws is not None:
            self._ws.close()
            self._ws = None

    def _connect(self) -> Any:
        try:
            self._ws = connect(self.uri, self.timeout_s, self._headers)
            return unpack(self._ws.recv(timeout=self.timeout_s))
        except TimeoutError:
            self.close()
            raise TimeoutError(f"openpi server {self.uri}: no metadata within {self.timeout_s:g} s") from None

    def _predict(self, history: dict[str, np.ndarray], pad_mask: np.ndarray, tasks: list[str] | None) -> np.ndarray:
        spec = self.spec
        chunks = []
        for b in range(len(pad_mask)):  # the rows asked for (predict_action_chunk(env_ids)), not always all B
            obs: dict[str, Any] = {self.key_map.get(k, k): v[b, -1] for k, v in history.items()}
            if tasks is not None:
                obs[self.key_map.get(TASK_KEY, TASK_KEY)] = tasks[b]
            actions = np.asarray(self._infer(obs).get("actions"), dtype=np.float32)
            if actions.ndim != 2 or actions.shape[1] != spec.action.dim or actions.shape[0] < spec.chunk_size:
                raise ActionError(
                    [
                        f"actions: expected ({spec.chunk_size}+, {spec.action.dim}) from {self.uri}, "
                        f"received {actions.shape}"
                    ]
                )
            chunks.append(actions[: spec.chunk_size])
        return np.stack(chunks)

    def _infer(self, obs: dict[str, Any]) -> dict[str, Any]:
        if self._ws is None:
            self._connect()
        try:
            self._ws.send(pack(obs))
            reply = self._ws.recv(timeout=self.timeout_s)
        except TimeoutError:
            self.close()  # a late reply must not answer the next request
            raise TimeoutError(
                f"openpi server {self.uri}: no reply to 'infer' within {self.timeout_s:g} s; the next call reconnects"
            ) from None
        if isinstance(reply, str):
            self.close()
            raise RemoteError(self.uri, "infer", ErrorCode.INFER_FAILED.value, reply, None)
        return unpack(reply)


class _BadRequest(ValueError):
    """An openpi request that cannot be decoded or does not match the served spec."""


def _pack_default(obj: Any) -> Any:
    if isinstance(obj, (np.ndarray, np.generic)):
        if obj.dtype.kind in "VOcUSM" or np.dtype(obj.dtype).newbyteorder("=").name not in SUPPORTED_DTYPES:
            raise ValueError(
                f"openpi message: dtype {obj.dtype} is not supported (expected one of {list(SUPPORTED_DTYPES)})"
            )
        if isinstance(obj, np.ndarray):
            return {
                b"__ndarray__": True,
                b"data": np.ascontiguousarray(obj).tobytes(),
                b"dtype": obj.dtype.str,
                b"shape": obj.shape,
            }
        return {b"__npgeneric__": True, b"data": obj.item(), b"dtype": obj.dtype.str}
    raise TypeError(f"openpi message: type {type(obj).__name__} is not supported (no pickling)")


def _unpack_hook(obj: dict) -> Any:
    if b"__ndarray__" in obj:
        dt = _safe_dtype(obj.get(b"dtype"))
        shape, data = obj.get(b"shape"), obj.get(b"data")
        if (
            not isinstance(shape, (list, tuple))
            or not all(isinstance(s, int) and s >= 0 for s in shape)
            or not isinstance(data, bytes)
        ):
            raise ValueError(f"openpi array: invalid shape {shape!r:.40} or data")
        if len(data) != int(np.prod(shape)) * dt.itemsize:
            raise ValueError(
                f"openpi array: expected {int(np.prod(shape)) * dt.itemsize} bytes for {dt} "
                f"{list(shape)}, received {len(data)}"
            )
        return np.frombuffer(data, dtype=dt).reshape(shape).copy()
    if b"__npgeneric__" in obj:
        return _safe_dtype(obj.get(b"dtype")).type(obj.get(b"data"))
    return obj


def _safe_dtype(s: Any) -> np.dtype:
    try:
        dt = np.dtype(s if isinstance(s, str) else "")
    except TypeError:
        dt = None
    if dt is None or dt.kind not in "biuf" or dt.newbyteorder("=").name not in SUPPORTED_DTYPES:
        raise ValueError(f"openpi array: dtype {s!r:.20} is not supported (expected one of {list(SUPPORTED_DTYPES)})")
    return dt
