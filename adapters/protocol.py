"""The strict message envelope of the policylink wire protocol: versions, verbs, typed bodies and error codes.

Every message is ``{"id": int, "type": str, "body": map}`` encoded by :mod:`policylink.adapters.codec`.
Requests carry a verb as ``type``; replies echo the request ``id`` with ``type`` = the verb, or
``"error"`` with body ``{"code", "message", "field"}``. Each verb has a typed body schema; unknown or
missing fields are rejected with ``invalid_field`` (DESIGN.md section 3; XPolicyLab-style strict envelope).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, NamedTuple

import numpy as np

from policylink.adapters.codec import CodecError, decode, encode

PROTOCOL_VERSION = 1
ERROR = "error"


class ErrorCode(StrEnum):
    """Closed set of error codes carried by ``error`` replies."""

    INVALID_FRAME = "invalid_frame"  # not decodable / not an envelope
    UNKNOWN_MESSAGE_TYPE = "unknown_message_type"  # verb not served by this server
    INVALID_FIELD = "invalid_field"  # body field missing, unknown, of the wrong type, or off-spec
    TOO_LARGE = "too_large"  # message over the server's size cap
    TIMEOUT = "timeout"  # client-side: no reply in time
    INFER_FAILED = "infer_failed"  # the policy raised
    ENV_FAILED = "env_failed"  # the environment raised
    VERSION_MISMATCH = "version_mismatch"  # hello with another protocol version
    UNSUPPORTED = "unsupported"  # verb valid but not offered by this server's object
    INTERNAL = "internal"  # server bug; the server keeps serving


class ProtocolError(Exception):
    """A request or reply violates the protocol; becomes an ``error`` reply on the server side.

    Attributes:
        code: an :class:`ErrorCode`.
        message: human-readable reason naming the expected and received value.
        field: dotted path of the offending field (``"body.updates[0].observation.state"``) or None.
        request_id: the request's id when it could be read, else None.
    """

    def __init__(self, code: ErrorCode, message: str, field: str | None = None, request_id: int | None = None):
        super().__init__(f"{code.value}: {message}" + (f" (field {field})" if field else ""))
        self.code, self.message, self.field, self.request_id = code, message, field, request_id


class RemoteError(RuntimeError):
    """The server answered a request with an ``error`` reply.

    Attributes: ``code`` (:class:`ErrorCode` value, str), ``message``, ``field``, ``server`` (endpoint),
    ``verb``.
    """

    def __init__(self, server: str, verb: str, code: str, message: str, field: str | None):
        where = f" (field {field})" if field else ""
        super().__init__(f"{server} {verb}: {code}: {message}{where}")
        self.server, self.verb, self.code, self.message, self.field = server, verb, code, message, field


class VersionMismatchError(RemoteError):
    """Client and server speak different protocol versions (raised at ``hello``)."""


@dataclass(frozen=True)
class Message:
    """A decoded, schema-checked message: ``id``, ``type`` (verb or ``"error"``) and ``body``."""

    id: int | None
    type: str
    body: dict[str, Any]


class Field(NamedTuple):
    """Schema of one body field.

    ``kind`` is a tuple of Python types (``(int,)``, ``(str,)``...; bool is not an int, an int is a float) or
    one of ``"array"`` (numpy array), ``"obs"`` (map of key -> array / str / list of str), ``"obs_list"``
    (list of those), ``"int_list"`` or ``"any_map"``. ``optional`` fields may be absent or None.
    """

    kind: Any
    optional: bool = False


_f = Field
Schema = Mapping[str, Mapping[str, Field]]
_INT = (int,)
_HELLO_REQ = {"protocol": _f(_INT), "client": _f((str,), optional=True)}
_HELLO_REP = {"protocol": _f(_INT), "kind": _f((str,)), "spec": _f("any_map"), "server": _f((str,))}
_PING_REP = {"time": _f((float,))}

POLICY_REQUESTS: dict[str, dict[str, Field]] = {
    "hello": _HELLO_REQ,
    "ping": {},
    "reset": {"env_ids": _f("int_list", optional=True), "updates": _f("obs_list")},
    "infer": {"updates": _f("obs_list")},
}
POLICY_REPLIES: dict[str, dict[str, Field]] = {
    "hello": _HELLO_REP,
    "ping": _PING_REP,
    "reset": {},
    "infer": {"actions": _f("array")},
}
ENV_REQUESTS: dict[str, dict[str, Field]] = {
    "hello": _HELLO_REQ,
    "ping": {},
    "reset": {"seed": _f(_INT, optional=True), "options": _f("any_map", optional=True)},
    "step": {"action": _f("array")},
    "get_observation": {},
    "send_action": {"action": _f("array")},
}
ENV_REPLIES: dict[str, dict[str, Field]] = {
    "hello": _HELLO_REP,
    "ping": _PING_REP,
    "reset": {"observation": _f("obs"), "info": _f("any_map")},
    "step": {
        "observation": _f("obs"),
        "reward": _f((float,)),
        "terminated": _f((bool,)),
        "truncated": _f((bool,)),
        "info": _f("any_map"),
    },
    "get_observation": {"observation": _f("obs")},
    "send_action": {},
}
_ERROR_BODY = {"code": _f((str,)), "message": _f((str,)), "field": _f((str,), optional=True)}


def encode_message(request_id: int | None, type_: str, body: Mapping[str, Any]) -> list:
    """Frames of ``{"id", "type", "body"}``. Raises :class:`~policylink.adapters.codec.CodecError`."""
    return encode({"id": request_id, "type": type_, "body": dict(body)})


def error_frames(err: ProtocolError) -> list:
    """Frames of the ``error`` reply for ``err``."""
    return encode_message(err.request_id, ERROR, {"code": err.code.value, "message": err.message, "field": err.field})


def parse_message(frames: list, schemas: Schema, allow_error: bool = False) -> Message:
    """Decode and check ``frames`` against ``schemas`` (verb -> body field schema).

    Args:
        frames: the message frames (without the ROUTER identity frame).
        schemas: e.g. :data:`POLICY_REQUESTS` (server side) or :data:`POLICY_REPLIES` (client side).
        allow_error: accept ``type == "error"`` (client side).

    Raises:
        ProtocolError: ``invalid_frame`` (undecodable / not an envelope), ``unknown_message_type``,
            ``invalid_field`` (a body field missing, unknown or of the wrong type).
    """
    try:
        msg = decode(frames)
    except CodecError as e:
        raise ProtocolError(ErrorCode.INVALID_FRAME, str(e)) from None
    if type(msg) is not dict or len(msg) != 3 or "id" not in msg or "type" not in msg or "body" not in msg:
        got = sorted(msg) if isinstance(msg, dict) else type(msg).__name__
        raise ProtocolError(ErrorCode.INVALID_FRAME, f"envelope: expected keys ['body', 'id', 'type'], received {got}")
    rid = msg["id"]
    if rid is not None and (not isinstance(rid, int) or isinstance(rid, bool)):
        raise ProtocolError(ErrorCode.INVALID_FRAME, f"id: expected int, received {type(rid).__name__}")
    type_, body = msg["type"], msg["body"]
    if not isinstance(type_, str):
        raise ProtocolError(
            ErrorCode.INVALID_FRAME, f"type: expected str, received {type(type_).__name__}", "type", rid
        )
    if allow_error and type_ == ERROR:
        schema = _ERROR_BODY
    elif type_ in schemas:
        schema = schemas[type_]
    else:
        raise ProtocolError(
            ErrorCode.UNKNOWN_MESSAGE_TYPE,
            f"type: expected one of {sorted(schemas)}, received {type_[:60]!r}",
            "type",
            rid,
        )
    if not isinstance(body, dict):
        raise ProtocolError(
            ErrorCode.INVALID_FIELD, f"body: expected a map, received {type(body).__name__}", "body", rid
        )
    unknown = sorted(set(body) - set(schema))
    if unknown:
        raise ProtocolError(
            ErrorCode.INVALID_FIELD,
            f"unknown field(s) {unknown}; {type_} accepts {sorted(schema)}",
            f"body.{unknown[0]}",
            rid,
        )
    for name, (kind, optional) in schema.items():
        value = body.get(name)
        if value is None:
            if not optional:
                raise ProtocolError(ErrorCode.INVALID_FIELD, f"missing required field {name!r}", f"body.{name}", rid)
            continue
        problem = _type_problem(kind, value)
        if problem:
            raise ProtocolError(ErrorCode.INVALID_FIELD, f"{name}: {problem}", f"body.{name}", rid)
    return Message(rid, type_, body)


def _type_problem(kind: Any, value: Any) -> str | None:
    if isinstance(kind, tuple):
        if kind == (float,) and isinstance(value, int) and not isinstance(value, bool):
            return None
        if not isinstance(value, kind) or (kind == _INT and isinstance(value, bool)):
            return f"expected {kind[0].__name__}, received {type(value).__name__}"
        return None
    if kind == "array":
        return None if isinstance(value, np.ndarray) else f"expected an array, received {type(value).__name__}"
    if kind == "any_map":
        return None if isinstance(value, dict) else f"expected a map, received {type(value).__name__}"
    if kind == "int_list":
        ok = isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
        return None if ok else "expected a list of int"
    if kind == "obs":
        return _obs_problem(value)
    if kind == "obs_list":
        if not isinstance(value, list):
            return f"expected a list of observation maps, received {type(value).__name__}"
        for i, obs in enumerate(value):
            problem = _obs_problem(obs)
            if problem:
                return f"[{i}] {problem}"
        return None
    raise AssertionError(f"unknown schema kind {kind!r}")


def _obs_problem(obs: Any) -> str | None:
    if not isinstance(obs, dict):
        return f"expected an observation map, received {type(obs).__name__}"
    for key, value in obs.items():
        if type(value) is np.ndarray:
            continue
        is_text = isinstance(value, str) or (isinstance(value, list) and all(isinstance(v, str) for v in value))
        if not is_text:
            return f"{key}: expected an array, a str or a list of str, received {type(value).__name__}"
    return None
