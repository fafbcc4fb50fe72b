"""A minimal XPolicyLab-protocol model server for tests, written from the protocol facts
(``shared/notes/xpolicylab-protocol.md``; XPolicyLab ``client_server/ws/model_server.py``), independent of
policylink's own codec: plain ``msgpack`` + ``msgpack_numpy`` and ``websockets``.

XPolicyLab's server is git-only (not on PyPI), so tests cannot run it; this one reproduces its observable behaviour,
checked byte-for-byte against a transcript recorded from the real one (``fixtures/xpolicylab_transcript.json``):
replies echo the request's envelope in upstream key order, ``hello_ack`` is ``{"ok": True, "server":
"demo_policy_server"}``, an undecodable frame (bad msgpack, not a map, missing ``message_type`` / ``message_id`` /
``evaluation_id``, unknown type, ``payload`` not a map, object arrays) gets no reply, ``infer`` without
``observation`` gets ``error`` ``invalid_frame``, a model failure ``infer_failed``, ``close`` closes the socket.
"""

from __future__ import annotations

import asyncio
import threading
import time
from datetime import UTC, datetime
from typing import Any

import msgpack
import msgpack_numpy
import numpy as np

from tests.adapters.fixtures.xpolicylab_record import ReferenceModel

TYPES = {"hello", "prepare_case", "reset", "infer", "trial_end", "heartbeat", "close"}
REPLY = {
    "hello": "hello_ack",
    "prepare_case": "prepare_case_ack",
    "reset": "reset_result",
    "infer": "infer_result",
    "trial_end": "trial_end_ack",
    "heartbeat": "heartbeat_ack",
}
KNOWN = TYPES | set(REPLY.values()) | {"error"}


def _decode_hook(obj: dict) -> Any:
    if obj.get(b"nd") is True and obj.get(b"kind") == b"O":
        raise ValueError("object dtype numpy arrays are not supported")
    return msgpack_numpy.decode(obj)


def decode_envelope(data: bytes) -> dict | None:
    """The request map, or None when XPolicyLab's server would drop the frame without a reply."""
    try:
        wire = msgpack.unpackb(data, raw=False, object_hook=_decode_hook)
    except Exception:
        return None
    if not isinstance(wire, dict) or any(wire.get(k) is None for k in ("message_type", "message_id", "evaluation_id")):
        return None
    if wire["message_type"] not in KNOWN or not isinstance(wire.get("payload") or {}, dict):
        return None
    return wire


def reply(request: dict, kind: str, payload: dict) -> bytes:
    """Encode a reply the way XPolicyLab's server does (``Frame.to_wire_dict`` key order)."""
    wire = {
        "message_type": kind,
        "evaluation_id": str(request["evaluation_id"]),
        "action_case_id": request.get("action_case_id"),
        "trial_id": request.get("trial_id"),
        "repeat_index": request.get("repeat_index"),
        "step": int(request.get("step", 0)),
        "sent_at": datetime.now(UTC).isoformat(),
        "message_id": str(request["message_id"]),
        "payload": payload,
    }
    return msgpack.packb(wire, default=msgpack_numpy.encode, use_bin_type=True)


class ReferenceServer:
    """Serve ``model`` (default :class:`ReferenceModel`) on a loopback port in a background thread.

    ``hang_infer``: never answer ``infer`` (a stuck model), for timeout tests. ``requests`` records every decoded
    request map, in arrival order.
    """

    def __init__(self, model: Any = None, hang_infer: bool = False):
        self.model, self.hang_infer = model or ReferenceModel(), hang_infer
        self.port = 0
        self.requests: list[dict] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    def start(self) -> ReferenceServer:
        ready = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main(ready)), daemon=True)
        self._thread.start()
        assert ready.wait(10)
        return self

    def stop(self) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(10)

    def __enter__(self) -> ReferenceServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    async def _main(self, ready: threading.Event) -> None:
        from websockets.asyncio.server import serve

        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        async with serve(self._handle, "127.0.0.1", 0, max_size=None) as server:
            self.port = server.sockets[0].getsockname()[1]
            ready.set()
            await self._stop.wait()

    async def _handle(self, ws: Any) -> None:
        async for raw in ws:
            if not isinstance(raw, bytes):
                continue
            request = decode_envelope(raw)
            if request is None:
                continue
            self.requests.append(request)
            kind, payload = request["message_type"], request.get("payload") or {}
            if kind == "close":
                await ws.close()
                return
            if kind not in TYPES:
                await ws.send(
                    reply(request, "error", _error("unknown_message_type", f"unsupported request type: {kind}"))
                )
                continue
            if kind == "infer" and self.hang_infer:
                continue
            await ws.send(reply(request, *self._answer(kind, payload)))

    def _answer(self, kind: str, payload: dict) -> tuple[str, dict]:
        if kind == "hello":
            return "hello_ack", {"ok": True, "server": "demo_policy_server"}
        if kind == "heartbeat":
            return "heartbeat_ack", {"ok": True}
        if kind == "reset":
            try:
                self.model.reset()
            except Exception as e:
                return "error", _error("reset_failed", str(e))
            return "reset_result", {"ok": True}
        if kind == "infer":
            if payload.get("observation") is None:
                return "error", _error("invalid_frame", "infer payload missing observation")
            start = time.perf_counter()
            try:
                actions = self.model.infer(payload["observation"])
            except Exception as e:
                return "error", _error("infer_failed", str(e))
            return "infer_result", {"actions": actions, "latency_ms": (time.perf_counter() - start) * 1e3}
        hook = getattr(self.model, "prepare_case" if kind == "prepare_case" else "on_trial_end", None)
        if callable(hook):
            hook(dict(payload))
        return REPLY[kind], {"ok": True}


def _error(code: str, message: str) -> dict:
    return {"code": code, "message": message, "details": {}}


def normalised(data: bytes) -> bytes:
    """``data`` re-encoded with its two non-deterministic fields fixed (``sent_at``; ``payload.latency_ms``), so
    two replies compare byte-for-byte everywhere else (msgpack re-encodes maps in their order, values unchanged)."""
    wire = msgpack.unpackb(data, raw=False, strict_map_key=False)
    wire["sent_at"] = "SENT_AT"
    if isinstance(wire.get("payload"), dict) and "latency_ms" in wire["payload"]:
        wire["payload"]["latency_ms"] = 0.0
    return msgpack.packb(wire, use_bin_type=True)


def expected_chunk(obs: dict) -> np.ndarray:
    """float32 (4, 3) that :class:`ReferenceModel` answers for ``obs`` (flattened arm, then gripper)."""
    steps = ReferenceModel().infer(obs)
    return np.stack([np.concatenate([s["arm_joint_state"], s["ee_joint_state"]]) for s in steps])
