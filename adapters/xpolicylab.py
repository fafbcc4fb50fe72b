"""XPolicyLab interop, both directions: serve any PolicyAdapter to XPolicyLab clients (its evaluator's
``WsModelClient``, inspect-robots-xpolicylab), and use any XPolicyLab model server as a PolicyAdapter (``xpl://``).

Protocol: XPolicyLab ``client_server/ws/`` (websocket, msgpack-numpy frames; :mod:`.xpolicylab_wire`), requests
``hello``, ``prepare_case``, ``reset``, ``infer``, ``trial_end``, ``heartbeat``, ``close``; observations in
Observation Format v1.0 and actions as a chunk of per-step maps, mapped to our contract by a
:class:`~policylink.adapters.xpolicylab_keymap.KeyMap`.

Where we differ from XPolicyLab's own server (``model_server.py``), on purpose:

- a request whose envelope is broken but whose ``message_id`` can be read (missing ``evaluation_id``, unknown
  ``message_type``, a ``payload`` that is not a map) gets an ``error`` frame with that id (``invalid_frame`` or
  ``unknown_message_type``) instead of silence; frames without a readable id (bad msgpack, not a map, no id) get
  no reply, as upstream;
- ``infer`` checks the observation against the served policy's spec and answers ``invalid_frame`` naming each bad
  field (``details``: ``field``, ``expected``, ``received``, ``problems``) before the policy is called;
- ``hello_ack`` also carries ``policylink: {protocol, spec, key_map}`` (XPolicyLab clients ignore extra keys),
  which our client uses; the server name is ``"policylink"``;
- it listens on loopback unless ``insecure`` (the protocol has no authentication at all).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import parse_qs, urlsplit

import numpy as np

from policylink.adapters.policy import HistoryPolicy, PolicyAdapter
from policylink.adapters.protocol import RemoteError
from policylink.adapters.schema import (
    STATE_KEY,
    TASK_KEY,
    ActionError,
    EnvSpec,
    ObservationError,
    PolicySpec,
)
from policylink.adapters.ws import WebsocketServer, connect
from policylink.adapters.xpolicylab_keymap import FieldError, KeyMap, spec_from_env
from policylink.adapters.xpolicylab_wire import (
    REPLY_OF,
    ErrorCode,
    Frame,
    MessageType,
    XPolicyLabError,
    decode_frame,
    encode_actions_reply,
    encode_frame,
)

INLINE_AFTER = 8  # fast calls in a row before a request kind runs inline (as adapters/rpc.py's serving loop)
SCHEME = "xpl://"
DEFAULT_PORT = 19000  # XPolicyLab PolicyServerConfig.port
log = logging.getLogger(__name__)


class XPolicyLabServer(WebsocketServer):
    """Serve ``policy`` over XPolicyLab's websocket protocol.

    One policy state for every connection, as upstream: ``reset`` resets the policy (all episodes), ``infer``
    appends one observation (``B = 1``) and replies ``{"actions": [H maps of float32 arrays], "latency_ms":
    float}``, ``prepare_case`` remembers the case's ``instruction`` (or ``task``) for observations without one,
    ``trial_end`` and ``heartbeat`` are acknowledged, ``close`` closes the connection. Each request runs in its
    own task; policy calls are serialised by ``lock`` and run on a worker thread, so heartbeats are answered during
    inference, except that, as :class:`~policylink.adapters.rpc.RpcServer` does, a request kind whose last 8 calls
    each took under ``inline_below_s`` runs inline on the event loop when no call is on the worker (a thread
    hand-off costs two wake-ups, milliseconds on a loaded machine).

    Args:
        policy: the policy to serve.
        host, port: where to listen (default loopback, XPolicyLab's port 19000; ``port=0`` picks a free one).
        key_map: how v1.0 keys map to the policy's (default :meth:`KeyMap.for_spec`).
        lock: lock serialising policy calls (share it with a :class:`PolicyServer` of the same policy).
        insecure: allow a non-loopback ``host``; anyone who can reach it can run and reset the policy.
        max_message_bytes: larger messages close the connection (None = no limit, as upstream).
        inline_below_s: see above (0 = every policy call on the worker thread).

    Raises:
        InsecureBindError: non-loopback ``host`` without ``insecure``.
        ValueError: the policy requires a feature the key map does not carry (e.g. ``observation.
            environment_state``), naming it.
    """

    def __init__(
        self,
        policy: PolicyAdapter,
        host: str = "127.0.0.1",
        port: int = DEFAULT_PORT,
        *,
        key_map: KeyMap | None = None,
        lock: threading.Lock | None = None,
        insecure: bool = False,
        max_message_bytes: int | None = 256 * 2**20,
        inline_below_s: float = 0.002,
    ):
        super().__init__(host, port, insecure=insecure, max_message_bytes=max_message_bytes, name="xpolicylab-server")
        self.inline_below_s, self._fast_streak, self._on_worker = float(inline_below_s), {}, 0
        self.policy, self.spec = policy, policy.spec
        self.key_map = key_map or KeyMap.for_spec(self.spec)
        carried = {k for _, k in self.key_map.cameras} | ({STATE_KEY} if self.key_map.state else set()) | {TASK_KEY}
        missing = sorted(set(self.spec.observation_features) - carried)
        if missing:
            raise ValueError(
                f"key map: the policy requires {missing}, which Observation Format v1.0 does not carry here; "
                f"mapped: {sorted(carried - {TASK_KEY})}"
            )
        self.lock = lock or threading.Lock()
        self.instruction: str | None = None
        self.hello = {
            "ok": True,
            "server": "policylink",
            "policylink": {"protocol": "xpolicylab", "spec": self.spec.to_dict(), "key_map": self.key_map.to_dict()},
        }

    async def _handler(self, ws: Any) -> None:
        import websockets

        send_lock, pending, closing = asyncio.Lock(), set(), False

        async def send(frame: Frame | bytes) -> None:
            async with send_lock:
                await ws.send(frame if isinstance(frame, bytes) else encode_frame(frame))

        try:
            async for raw in ws:
                if not isinstance(raw, (bytes, bytearray)):
                    continue  # text frames are skipped, as upstream
                try:
                    frame = decode_frame(bytes(raw))
                except XPolicyLabError as e:
                    log.warning("xpolicylab client %s: %s", ws.remote_address, e)
                    if "message_id" in e.details:
                        bad = Frame(MessageType.ERROR, e.details.pop("message_id"), "")
                        await send(bad.error(e.code, e.message, e.details))
                    continue
                if frame.message_type == MessageType.CLOSE:  # no reply; answer what is pending, then close
                    closing = True
                    break
                task = asyncio.create_task(self._respond(frame, send))
                pending.add(task)
                task.add_done_callback(pending.discard)
        except websockets.ConnectionClosed:
            pass
        finally:
            if pending:
                await asyncio.gather(*pending, return_exceptions=True)
            if closing:
                await ws.close()

    async def _respond(self, frame: Frame, send: Any) -> None:
        try:
            reply = await self._dispatch(frame)
        except XPolicyLabError as e:
            reply = frame.error(e.code, e.message, e.details)
        except Exception as e:  # never lose the connection over one request
            log.exception("xpolicylab %s failed", frame.message_type.value)
            reply = frame.error(ErrorCode.INTERNAL, f"{type(e).__name__}: {e}")
        try:
            await send(reply)
        except Exception as e:  # the client left, or a reply that cannot be encoded
            log.warning("xpolicylab reply to %s not sent: %s", frame.message_type.value, e)

    async def _dispatch(self, frame: Frame) -> Frame | bytes:
        kind, payload = frame.message_type, frame.payload
        if kind == MessageType.HELLO:
            return frame.reply(MessageType.HELLO_ACK, self.hello)
        if kind == MessageType.HEARTBEAT:
            return frame.reply(MessageType.HEARTBEAT_ACK, {"ok": True})
        if kind == MessageType.PREPARE_CASE:
            text = payload.get("instruction", payload.get("task"))
            self.instruction = text if isinstance(text, str) else None
            return frame.reply(MessageType.PREPARE_CASE_ACK, {"ok": True})
        if kind == MessageType.RESET:
            await self._policy_call(kind, self._reset)
            return frame.reply(MessageType.RESET_RESULT, {"ok": True})
        if kind == MessageType.INFER:
            return await self._policy_call(kind, self._infer, frame)
        if kind == MessageType.TRIAL_END:
            return frame.reply(MessageType.TRIAL_END_ACK, {"ok": True})
        raise XPolicyLabError(ErrorCode.UNKNOWN_MESSAGE_TYPE, f"message_type: {kind.value!r} is not a request")

    async def _policy_call(self, kind: MessageType, fn: Any, *args: Any) -> Any:
        """``fn(*args)`` inline when ``kind`` has been fast and the worker is idle, else on the worker thread."""
        if self._fast_streak.get(kind, 0) >= INLINE_AFTER and not self._on_worker:
            return self._timed(kind, fn, *args)
        self._on_worker += 1
        try:
            return await asyncio.to_thread(self._timed, kind, fn, *args)
        finally:
            self._on_worker -= 1

    def _timed(self, kind: MessageType, fn: Any, *args: Any) -> Any:
        started = time.perf_counter()
        try:
            return fn(*args)
        finally:
            fast = time.perf_counter() - started < self.inline_below_s
            self._fast_streak[kind] = self._fast_streak.get(kind, 0) + 1 if fast else 0

    def _reset(self) -> None:
        try:
            with self.lock:
                self.policy.reset()
        except Exception as e:
            raise XPolicyLabError(ErrorCode.RESET_FAILED, f"{type(e).__name__}: {e}") from None

    def _infer(self, frame: Frame) -> bytes:
        """The encoded ``infer_result`` (``{"actions": [H maps], "latency_ms": float}``) for ``frame.payload[
        "observation"]``.

        Raises:
            XPolicyLabError: ``invalid_frame`` for a missing or mis-shaped field; ``infer_failed`` when the
                policy raises.
        """
        obs = frame.payload.get("observation")
        if obs is None:  # upstream's one payload check
            raise XPolicyLabError(
                ErrorCode.INVALID_FRAME,
                "payload.observation: expected a map (Observation Format v1.0), received nothing",
                {"field": "payload.observation", "expected": "a map", "received": "nothing"},
            )
        try:
            batch = self.key_map.to_batch(obs, self.spec, self.instruction)  # checks every carried feature
        except FieldError as e:
            raise XPolicyLabError(ErrorCode.INVALID_FRAME, str(e), e.details) from None
        t0 = time.perf_counter()
        try:
            with self.lock:
                self.policy.update_observation(batch)
                chunk = self.policy.predict_action_chunk()
        except ObservationError as e:  # the policy's own checks (a HistoryPolicy validates again)
            raise XPolicyLabError(ErrorCode.INVALID_FRAME, str(e), {"problems": e.problems}) from None
        except Exception as e:
            raise XPolicyLabError(ErrorCode.INFER_FAILED, f"{type(e).__name__}: {e}") from None
        latency_ms = (time.perf_counter() - t0) * 1e3
        return encode_actions_reply(frame, chunk[0], self.key_map.action, latency_ms)


class XPolicyLabRemotePolicy(HistoryPolicy):
    """A :class:`PolicyAdapter` backed by an XPolicyLab model server (any ``policy/<NAME>`` served with
    ``python -m client_server.ws``, or our :class:`XPolicyLabServer`).

    XPolicyLab servers are unbatched and hold one model state, so each row ``b`` asked for is one ``infer`` of its
    latest observation, sent in order; ``reset`` ends the open trial (``trial_end``) and sends ``reset`` (a
    global reset on the server: run stateful remote models with one episode at a time). The reply's actions
    (``H'`` per-step maps) become a chunk ``(H', A)`` cut to ``spec.chunk_size``.

    The spec: ``spec`` if given, else the one a policylink server advertises in ``hello_ack``, else built from
    ``env_spec`` by :func:`spec_from_env` (the env the policy runs on: XPolicyLab exchanges no spec).

    Args:
        address: ``xpl://HOST:PORT`` or ``ws://HOST:PORT``.
        spec: the served policy's spec in our keys (None: see above).
        env_spec: the env the policy runs on, when the server advertises no spec.
        key_map: v1.0 <-> our keys (None: the server's, else :meth:`KeyMap.for_spec`); ``cameras``, ``state``,
            ``action`` override parts of the default (see :meth:`KeyMap.for_spec`).
        chunk_size, n_action_steps: horizons of a spec built from ``env_spec`` (default 1 and ``chunk_size``).
        timeout_s: connect and per-reply timeout, seconds.
        evaluation_id: the envelope's ``evaluation_id`` (default a fresh uuid).

    Raises:
        ConnectionError: nothing answers at ``address`` (the message names it and the timeout).
        TimeoutError: no websocket handshake or ``hello_ack`` within ``timeout_s``.
        ValueError: no spec can be had (no ``spec``, none advertised, no ``env_spec``).
    """

    def __init__(
        self,
        address: str,
        spec: PolicySpec | None = None,
        *,
        env_spec: EnvSpec | None = None,
        key_map: KeyMap | None = None,
        cameras: Mapping[str, str] | str | None = None,
        state: Sequence[tuple[str, int]] | str | None = None,
        action: Sequence[tuple[str, int]] | str | None = None,
        chunk_size: int | None = None,
        n_action_steps: int | None = None,
        timeout_s: float = 30.0,
        evaluation_id: str | None = None,
    ):
        self.address, self.timeout_s = address, float(timeout_s)
        self.url = "ws://" + address[len(SCHEME) :] if address.startswith(SCHEME) else address
        self.evaluation_id = evaluation_id or f"policylink-{uuid.uuid4()}"
        self._ws: Any = None
        self._trial: str | None = None
        self._trials = self._step = 0
        self.server_info = self._connect()
        theirs = self.server_info.get("policylink") if isinstance(self.server_info.get("policylink"), dict) else {}
        overrides = (cameras, state, action)
        if spec is None and "spec" in theirs:
            spec = PolicySpec.from_dict(theirs["spec"])
            if key_map is None and "key_map" in theirs and overrides == (None, None, None):
                key_map = KeyMap.from_dict(theirs["key_map"])
        if spec is None:
            if env_spec is None:
                self.close()
                raise ValueError(
                    f"spec: the XPolicyLab server at {address} advertises none (hello_ack keys "
                    f"{sorted(self.server_info)}); evaluate it on an env (policylink run/eval/deploy pass theirs), add "
                    f"?env=NAME to the reference, or pass spec=PolicySpec(...)"
                )
            spec = spec_from_env(env_spec, chunk_size or 1, n_action_steps, cameras, state, action)
        super().__init__(spec)
        self.key_map = key_map or KeyMap.for_spec(spec, cameras, state, action)

    def close(self) -> None:
        """End the open trial, send ``close`` and drop the socket (best effort; idempotent)."""
        if self._ws is None:
            return
        try:
            if self._trial is not None:
                self._request(MessageType.TRIAL_END, {"trial_id": self._trial}, trial_id=self._trial)
            self._ws.send(
                encode_frame(
                    Frame(MessageType.CLOSE, str(uuid.uuid4()), self.evaluation_id, payload={"reason": "client closed"})
                )
            )
        except Exception as e:  # close never raises
            log.debug("xpolicylab close %s: %s", self.address, e)
        finally:
            self._trial = None
            self._drop()

    def reset(self, env_ids: Sequence[int] | None = None) -> None:
        """Reset rows ``env_ids`` here and the server's model (``trial_end`` of the open trial, then ``reset``)."""
        super().reset(env_ids)
        if self._trial is not None:
            self._request(MessageType.TRIAL_END, {"trial_id": self._trial}, trial_id=self._trial)
        self._trials += 1
        self._trial, self._step = f"{self.evaluation_id}-{self._trials}", 0
        self._request(MessageType.RESET, {"trial_id": self._trial}, trial_id=self._trial)

    def _predict(self, history: dict[str, np.ndarray], pad_mask: np.ndarray, tasks: list[str] | None) -> np.ndarray:
        chunks, h = [], self.spec.chunk_size
        for b in range(len(pad_mask)):  # the rows asked for, in order
            row = {k: v[b, -1] for k, v in history.items()}
            obs = self.key_map.to_observation(row, tasks[b] if tasks is not None else None)
            reply = self._request(MessageType.INFER, {"observation": obs}, trial_id=self._trial, step=self._step)
            self._step += 1
            try:
                chunk = self.key_map.to_chunk(reply.payload.get("actions"), f"{self.address} infer_result actions")
            except FieldError as e:
                raise ActionError([str(e)]) from None
            if chunk.shape[0] < h:
                raise ActionError(
                    [f"actions: expected >= {h} steps (chunk_size) from {self.address}, received {chunk.shape[0]}"]
                )
            chunks.append(chunk[:h])
        return np.stack(chunks)

    def _connect(self) -> dict[str, Any]:
        """Open the socket and do the ``hello`` handshake; the ``hello_ack`` payload."""
        try:
            self._ws = connect(self.url, self.timeout_s)
        except TimeoutError:
            raise TimeoutError(
                f"XPolicyLab server {self.address}: no websocket handshake within {self.timeout_s:g} s"
            ) from None
        except OSError as e:
            raise ConnectionError(
                f"XPolicyLab server {self.address}: cannot connect ({type(e).__name__}: {e}; timeout "
                f"{self.timeout_s:g} s); start one (policylink serve CHECKPOINT --protocol xpolicylab --port PORT, "
                "or XPolicyLab's setup_eval_policy_server.sh)"
            ) from None
        return self._request(MessageType.HELLO, {}).payload

    def _request(self, kind: MessageType, payload: dict[str, Any], trial_id: str | None = None, step: int = 0) -> Frame:
        """Send one request, block for its reply (matched by id; other frames are skipped).

        Raises:
            RemoteError: the server answered with an ``error`` frame (code, message, field).
            TimeoutError: no reply within ``timeout_s`` (the socket is dropped; the next call reconnects).
            ConnectionError: the connection is gone (the next call reconnects).
            XPolicyLabError: a reply of the wrong type.
        """
        import websockets

        if self._ws is None:
            self._connect()
        frame = Frame(kind, str(uuid.uuid4()), self.evaluation_id, trial_id=trial_id, step=step, payload=payload)
        deadline = time.monotonic() + self.timeout_s
        try:
            self._ws.send(encode_frame(frame))
            while True:
                raw = self._ws.recv(timeout=max(0.0, deadline - time.monotonic()))
                if not isinstance(raw, bytes):
                    continue
                try:
                    reply = decode_frame(raw)
                except XPolicyLabError as e:
                    log.warning("xpolicylab server %s sent an undecodable frame: %s", self.address, e)
                    continue
                if reply.message_id == frame.message_id:
                    break
        except TimeoutError:
            self._drop()
            raise TimeoutError(
                f"XPolicyLab server {self.address}: no reply to {kind.value!r} within {self.timeout_s:g} s; "
                "the next call reconnects"
            ) from None
        except (websockets.ConnectionClosed, OSError) as e:
            self._drop()
            raise ConnectionError(
                f"XPolicyLab server {self.address}: connection lost during {kind.value!r}: {e}"
            ) from None
        if reply.message_type == MessageType.ERROR:
            err = reply.payload
            details = err.get("details") if isinstance(err.get("details"), dict) else {}
            raise RemoteError(
                self.address, kind.value, str(err.get("code")), str(err.get("message")), details.get("field")
            )
        if reply.message_type != REPLY_OF[kind]:
            raise XPolicyLabError(
                ErrorCode.INVALID_FRAME,
                f"{self.address}: expected {REPLY_OF[kind].value} to {kind.value}, received {reply.message_type.value}",
            )
        return reply

    def _drop(self) -> None:
        ws, self._ws = self._ws, None
        if ws is not None:
            try:
                ws.close()
            except Exception:  # already dead
                pass


def parse_ref(ref: str) -> tuple[str, dict[str, Any]]:
    """``(address, options)`` of ``xpl://HOST:PORT[?key=value&...]``.

    Options (all optional): ``chunk_size``, ``n_action_steps`` (int >= 1), ``timeout_s`` (float > 0), ``env`` (a
    registry env name whose spec is used), ``cameras`` / ``state`` / ``action`` (key map parts: ``cam_head:front``,
    ``arm_joint_state:6``; several entries comma-separated or the key repeated).

    Raises:
        ValueError: not ``xpl://HOST:PORT``, an unknown option or a bad value, naming it.
    """
    parts = urlsplit(ref)
    if not ref.startswith(SCHEME) or not parts.hostname or parts.port is None or parts.path not in ("", "/"):
        raise ValueError(f"policy: expected xpl://HOST:PORT[?option=value&...], received {ref!r}")
    address = f"{SCHEME}{parts.netloc}"
    options: dict[str, Any] = {}
    for key, values in parse_qs(parts.query, keep_blank_values=True).items():
        if key in ("chunk_size", "n_action_steps", "timeout_s"):
            kind = "a positive number" if key == "timeout_s" else "a positive integer"
            try:
                options[key] = (float if key == "timeout_s" else int)(values[-1])
            except ValueError:
                raise ValueError(f"policy {ref!r}: option {key}: expected {kind}, received {values[-1]!r}") from None
            if not options[key] > 0:  # also refuses nan
                raise ValueError(f"policy {ref!r}: option {key}: expected {kind}, received {values[-1]!r}")
        elif key in ("cameras", "state", "action"):
            options[key] = ",".join(values)
        elif key == "env":
            options[key] = values[-1]
        else:
            raise ValueError(
                f"policy {ref!r}: unknown option {key!r} (expected chunk_size, n_action_steps, timeout_s, env, "
                "cameras, state, action)"
            )
    return address, options


def load_remote(ref: str, env_spec: EnvSpec | None = None, timeout_s: float | None = None) -> XPolicyLabRemotePolicy:
    """The policy of reference ``xpl://HOST:PORT[?options]`` (:func:`parse_ref`); ``env=NAME`` in the reference
    takes the spec of registry env ``NAME`` (default settings) instead of ``env_spec``; ``timeout_s`` is the
    default of the reference's ``timeout_s`` (None: 30 s)."""
    address, options = parse_ref(ref)
    if timeout_s is not None:
        options.setdefault("timeout_s", timeout_s)
    name = options.pop("env", None)
    if name:
        from policylink.adapters.registry import make_env

        env = make_env(name)
        try:
            env_spec = env.get_wrapper_attr("env_spec") if hasattr(env, "get_wrapper_attr") else env.env_spec
        finally:
            env.close()
    return XPolicyLabRemotePolicy(address, env_spec=env_spec, **options)


__all__ = [
    "DEFAULT_PORT",
    "SCHEME",
    "XPolicyLabRemotePolicy",
    "XPolicyLabServer",
    "load_remote",
    "parse_ref",
    "spec_from_env",
]
