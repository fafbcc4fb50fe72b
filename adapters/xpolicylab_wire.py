"""XPolicyLab websocket protocol, wire level: message types, error codes, the frame envelope and the
msgpack-numpy codec (``msgpack_numpy`` arrays, object arrays refused).

Source: XPolicyLab ``client_server/ws/protocol/`` (``messages.py``, ``exceptions.py``, ``schemas.py``,
``codec.py``) at commit ``7198143e`` (identical to ``fe71eb54``, the commit the PyPI client
``inspect-robots-xpolicylab`` 0.1.0 was validated against). One protocol message is one *binary* websocket
message: a msgpack map (``use_bin_type=True``) with the envelope keys, in the order XPolicyLab's server writes
them::

    message_type, evaluation_id, action_case_id, trial_id, repeat_index, step, sent_at, message_id, payload

Arrays are ``msgpack_numpy`` maps ``{b"nd": True, b"type": dtype.str, b"kind": b"", b"shape": [...], b"data":
bytes}`` (numpy scalars ``{b"nd": False, b"type", b"data"}``). There is no protocol version field.

Decoding is stricter than ``msgpack_numpy.decode``, which unpickles ``kind == b"O"`` arrays: only numeric
dtypes of the contract (:data:`~policylink.adapters.codec.SUPPORTED_DTYPES`) with a matching byte length
decode; anything else is an ``invalid_frame`` error and nothing is ever unpickled. ``msgpack_numpy`` (the
``xpolicylab`` extra) is imported at the first array.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

import msgpack
import numpy as np

from policylink.adapters.codec import SUPPORTED_DTYPES


class MessageType(StrEnum):
    """Frame kinds (XPolicyLab ``messages.py``); requests go client (environment) -> server (policy)."""

    HELLO = "hello"
    HELLO_ACK = "hello_ack"
    PREPARE_CASE = "prepare_case"
    PREPARE_CASE_ACK = "prepare_case_ack"
    RESET = "reset"
    RESET_RESULT = "reset_result"
    INFER = "infer"
    INFER_RESULT = "infer_result"
    TRIAL_END = "trial_end"
    TRIAL_END_ACK = "trial_end_ack"
    HEARTBEAT = "heartbeat"
    HEARTBEAT_ACK = "heartbeat_ack"
    CLOSE = "close"
    ERROR = "error"


REPLY_OF: dict[MessageType, MessageType] = {
    MessageType.HELLO: MessageType.HELLO_ACK,
    MessageType.PREPARE_CASE: MessageType.PREPARE_CASE_ACK,
    MessageType.RESET: MessageType.RESET_RESULT,
    MessageType.INFER: MessageType.INFER_RESULT,
    MessageType.TRIAL_END: MessageType.TRIAL_END_ACK,
    MessageType.HEARTBEAT: MessageType.HEARTBEAT_ACK,
}
"""Request -> reply type (XPolicyLab ``REQUEST_RESPONSE_PAIRS``); ``close`` has no reply."""


class ErrorCode(StrEnum):
    """``payload["code"]`` of an ``error`` frame (XPolicyLab ``ErrorCode``); ``timeout`` is raised client-side."""

    INVALID_FRAME = "invalid_frame"
    UNKNOWN_MESSAGE_TYPE = "unknown_message_type"
    TIMEOUT = "timeout"
    INFER_FAILED = "infer_failed"
    RESET_FAILED = "reset_failed"
    INTERNAL = "internal"


class XPolicyLabError(RuntimeError):
    """A protocol failure: an undecodable frame, a bad request field, or an ``error`` frame from a server.

    Attributes:
        code: an :class:`ErrorCode` value (str).
        message: human-readable reason (names the field, expected and received values for bad fields).
        details: the ``error`` payload's ``details`` map, e.g. ``{"field": ..., "expected": ..., "received": ...}``.
    """

    def __init__(self, code: str, message: str, details: dict[str, Any] | None = None):
        super().__init__(f"{code}: {message}")
        self.code, self.message, self.details = str(code), message, dict(details or {})


def utc_now_iso() -> str:
    """ISO-8601 UTC timestamp as XPolicyLab writes ``sent_at`` (``datetime.isoformat()``, ``+00:00`` suffix)."""
    return datetime.now(UTC).isoformat()


@dataclass(frozen=True)
class Frame:
    """One protocol message (XPolicyLab ``Frame``); ``message_id`` is called ``request_id`` in their code.

    Attributes:
        message_type: the :class:`MessageType`.
        message_id: request id (a client-chosen string; replies echo the request's).
        evaluation_id: caller-chosen id of the whole evaluation.
        action_case_id, trial_id: optional case and episode ids (str or None).
        repeat_index: optional int.
        step: per-trial infer counter set by the client.
        sent_at: ISO-8601 UTC timestamp.
        payload: the message body (a map; numpy arrays travel as msgpack_numpy maps).
    """

    message_type: MessageType
    message_id: str
    evaluation_id: str
    action_case_id: str | None = None
    trial_id: str | None = None
    repeat_index: int | None = None
    step: int = 0
    sent_at: str = field(default_factory=utc_now_iso)
    payload: dict[str, Any] = field(default_factory=dict)

    def to_wire(self) -> dict[str, Any]:
        """The wire map, keys in XPolicyLab's server order (so equal frames encode to equal bytes)."""
        return {
            "message_type": self.message_type.value,
            "evaluation_id": self.evaluation_id,
            "action_case_id": self.action_case_id,
            "trial_id": self.trial_id,
            "repeat_index": self.repeat_index,
            "step": self.step,
            "sent_at": self.sent_at,
            "message_id": self.message_id,
            "payload": self.payload,
        }

    def reply(self, message_type: MessageType, payload: dict[str, Any] | None = None) -> Frame:
        """A reply to this request: same ids, ``step`` and ``repeat_index`` (XPolicyLab ``_reply``), new ``sent_at``."""
        return Frame(
            message_type,
            self.message_id,
            self.evaluation_id,
            self.action_case_id,
            self.trial_id,
            self.repeat_index,
            self.step,
            payload=dict(payload or {}),
        )

    def error(self, code: str, message: str, details: dict[str, Any] | None = None) -> Frame:
        """An ``error`` reply to this request: ``{"code", "message", "details"}``."""
        return self.reply(MessageType.ERROR, {"code": str(code), "message": message, "details": dict(details or {})})


def encode(obj: Any) -> bytes:
    """msgpack bytes of ``obj`` with numpy arrays/scalars as ``msgpack_numpy`` maps.

    Raises:
        XPolicyLabError: ``invalid_frame`` for object/structured arrays or a type msgpack cannot write.
    """
    try:
        return msgpack.packb(obj, default=_encode_default, use_bin_type=True)
    except XPolicyLabError:
        raise
    except Exception as e:
        raise XPolicyLabError(ErrorCode.INVALID_FRAME, f"msgpack encode failed: {type(e).__name__}: {e}") from None


def encode_frame(frame: Frame) -> bytes:
    """The bytes of one binary websocket message. Raises :class:`XPolicyLabError` like :func:`encode`."""
    return encode(frame.to_wire())


def decode(data: bytes) -> Any:
    """Inverse of :func:`encode`; arrays come back read-only, sharing ``data``'s memory.

    Raises:
        XPolicyLabError: ``invalid_frame`` for bad msgpack, a non-numeric dtype (object, structured, strings),
            or array data whose length is not ``dtype.itemsize * prod(shape)``.
    """
    try:
        return msgpack.unpackb(data, object_hook=_decode_hook, raw=False, strict_map_key=False)
    except XPolicyLabError:
        raise
    except Exception as e:
        raise XPolicyLabError(ErrorCode.INVALID_FRAME, f"msgpack decode failed: {type(e).__name__}: {e}") from None


def decode_frame(data: bytes) -> Frame:
    """A checked :class:`Frame` from one binary message (XPolicyLab ``decode_envelope``).

    Raises:
        XPolicyLabError: ``invalid_frame`` naming the problem: undecodable bytes, not a map, missing
            ``message_type`` / ``message_id`` / ``evaluation_id``, a ``payload`` that is not a map, a ``step``
            that is not an int; ``unknown_message_type`` for a ``message_type`` outside :class:`MessageType`.
            ``details["message_id"]`` holds the request's id when one could be read, so a server can still
            address an error reply.
    """
    wire = decode(data)
    if not isinstance(wire, dict):
        raise XPolicyLabError(ErrorCode.INVALID_FRAME, f"frame: expected a msgpack map, received {describe(wire)}")
    message_id = wire.get("message_id")
    known = {"message_id": str(message_id)} if isinstance(message_id, (str, int)) else {}
    for key in ("message_type", "message_id", "evaluation_id"):
        if wire.get(key) is None:
            raise XPolicyLabError(ErrorCode.INVALID_FRAME, f"{key}: required, received nothing", known)
    try:
        message_type = MessageType(wire["message_type"])
    except ValueError:
        raise XPolicyLabError(
            ErrorCode.UNKNOWN_MESSAGE_TYPE,
            f"message_type: expected one of {[t.value for t in MessageType]}, received {wire['message_type']!r:.60}",
            known,
        ) from None
    payload = wire.get("payload") or {}
    if not isinstance(payload, dict):
        raise XPolicyLabError(ErrorCode.INVALID_FRAME, f"payload: expected a map, received {describe(payload)}", known)
    step = wire.get("step", 0)
    if isinstance(step, bool) or not isinstance(step, int):
        raise XPolicyLabError(ErrorCode.INVALID_FRAME, f"step: expected an int, received {describe(step)}", known)
    return Frame(
        message_type,
        str(wire["message_id"]),
        str(wire["evaluation_id"]),
        _opt_str(wire.get("action_case_id")),
        _opt_str(wire.get("trial_id")),
        wire.get("repeat_index") if isinstance(wire.get("repeat_index"), int) else None,
        step,
        str(wire.get("sent_at") or utc_now_iso()),
        payload,
    )


def _opt_str(value: Any) -> str | None:
    return None if value is None else str(value)


def describe(value: Any) -> str:
    """Short description of a received value for messages: ``float32 array (2, 3)``, ``str``, ``nothing``."""
    if value is None:
        return "nothing"
    if isinstance(value, np.ndarray):
        return f"{value.dtype} array {tuple(value.shape)}"
    return type(value).__name__


def _encode_default(obj: Any) -> Any:
    import msgpack_numpy  # the xpolicylab extra; the core install imports this module without it

    if isinstance(obj, (np.ndarray, np.generic)) and obj.dtype.kind in "OV":
        raise XPolicyLabError(ErrorCode.INVALID_FRAME, f"dtype {obj.dtype}: object/structured arrays are not supported")
    out = msgpack_numpy.encode(obj)
    if out is obj:
        raise TypeError(f"type {type(obj).__name__} cannot be sent (no pickling)")
    return out


def _decode_hook(obj: dict) -> Any:
    if b"nd" not in obj:
        if b"complex" in obj:
            import msgpack_numpy

            return msgpack_numpy.decode(obj)
        return obj
    descr, data = obj.get(b"type"), obj.get(b"data")
    dt = _DTYPES.get((descr, obj.get(b"kind", b""))) if isinstance(descr, str) else None
    if dt is None:
        dt = _numeric_dtype(descr, obj.get(b"kind", b""))
    if not isinstance(data, bytes):
        raise XPolicyLabError(ErrorCode.INVALID_FRAME, f"array data: expected bytes, received {describe(data)}")
    if obj[b"nd"] is not True:  # a numpy scalar
        if len(data) != dt.itemsize:
            raise XPolicyLabError(
                ErrorCode.INVALID_FRAME, f"scalar {dt}: expected {dt.itemsize} bytes, received {len(data)}"
            )
        return np.frombuffer(data, dtype=dt)[0]
    shape = obj.get(b"shape")
    if not isinstance(shape, (list, tuple)) or not all(type(s) is int and s >= 0 for s in shape):
        raise XPolicyLabError(
            ErrorCode.INVALID_FRAME, f"array shape: expected a list of ints >= 0, received {shape!r:.40}"
        )
    if len(data) != math.prod(shape) * dt.itemsize:
        raise XPolicyLabError(
            ErrorCode.INVALID_FRAME,
            f"array {dt} {list(shape)}: expected {math.prod(shape) * dt.itemsize} bytes, received {len(data)}",
        )
    return np.ndarray(shape, dt, data)  # msgpack_numpy.decode's array, without re-parsing the dtype: read-only


_DTYPES: dict[tuple[str, Any], np.dtype] = {}  # (descr, kind) -> checked dtype; a few dozen at most


def _numeric_dtype(descr: Any, kind: Any) -> np.dtype:
    """The numeric dtype of ``descr`` (``"<f4"``), checked against :data:`SUPPORTED_DTYPES` and cached.

    Raises:
        XPolicyLabError: ``invalid_frame`` for object, structured, string or unknown dtypes.
    """
    dt = None
    if isinstance(descr, str) and kind in (b"", "", None):
        try:
            dt = np.dtype(descr)
        except TypeError:
            dt = None
    if dt is None or dt.kind not in "biuf" or dt.newbyteorder("=").name not in SUPPORTED_DTYPES:
        raise XPolicyLabError(
            ErrorCode.INVALID_FRAME,
            f"array dtype: expected one of {list(SUPPORTED_DTYPES)}, received {descr!r:.30} (kind {kind!r:.10}); "
            "object arrays are never unpickled",
        )
    if len(_DTYPES) < 256:
        _DTYPES[(descr, kind)] = dt
    return dt


def encode_actions_reply(
    request: Frame, chunk: np.ndarray, keys: Sequence[tuple[str, int]], latency_ms: float
) -> bytes:
    """The ``infer_result`` reply to ``request`` for one chunk, encoded without per-array hooks.

    Byte-identical to ``encode_frame(request.reply(INFER_RESULT, {"actions": steps, "latency_ms": latency_ms}))``
    where ``steps[h] = {key: chunk[h, a:b]}`` for the ``(key, length)`` pairs of ``keys`` in order (the
    ``msgpack_numpy`` map of each slice, as XPolicyLab's server writes it): the envelope and each step's map headers
    are packed once per call and each slice is copied out of one ``tobytes()`` per key.

    Args:
        request: the ``infer`` frame answered.
        chunk: ``(H, A)`` array, ``A`` the sum of the lengths in ``keys``; a supported numeric dtype.
        keys: ``(action key, length)`` pairs.
        latency_ms: the reply's ``latency_ms``.

    Raises:
        XPolicyLabError: ``invalid_frame`` for an unsupported dtype; ``internal`` for more than 15 keys.
    """
    wire = request.reply(MessageType.INFER_RESULT).to_wire()
    del wire["payload"]
    pack = msgpack.Packer(use_bin_type=True).pack
    head = [b"\x89", *(pack(k) + pack(v) for k, v in wire.items()), pack("payload"), b"\x82", pack("actions")]
    head.append(msgpack.Packer().pack_array_header(len(chunk)))
    descr, start, columns = chunk.dtype.str, 0, []
    _DTYPES.get((descr, b"")) or _numeric_dtype(descr, b"")
    for key, n in keys:
        data = np.ascontiguousarray(chunk[:, start : start + n]).tobytes()
        nbytes = n * chunk.dtype.itemsize
        template = pack({b"nd": True, b"type": descr, b"kind": b"", b"shape": (n,), b"data": bytes(nbytes)})
        columns.append((pack(key) + template[:-nbytes] if nbytes else pack(key) + template, data, nbytes))
        start += n
    if not 0 < len(keys) <= 15:
        raise XPolicyLabError(ErrorCode.INTERNAL, f"action keys: expected 1 to 15 per step, received {len(keys)}")
    step_head = bytes([0x80 | len(keys)])  # a msgpack fixmap
    body = []
    for h in range(len(chunk)):
        body.append(step_head)
        for prefix, data, nbytes in columns:
            body += (prefix, data[h * nbytes : (h + 1) * nbytes])
    return b"".join([*head, *body, pack("latency_ms"), pack(float(latency_ms))])


__all__ = [
    "REPLY_OF",
    "ErrorCode",
    "Frame",
    "MessageType",
    "XPolicyLabError",
    "decode",
    "decode_frame",
    "describe",
    "encode",
    "encode_actions_reply",
    "encode_frame",
    "utc_now_iso",
]
