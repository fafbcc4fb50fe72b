"""The client side of the policylink wire: a DEALER channel to one server with request ids, protocol negotiation
in ``hello``, timeouts, and a fresh socket after a timeout (never REQ/REP: a lost reply cannot wedge it;
DESIGN.md section 3). Servers are in :mod:`policylink.adapters.rpc`.
"""

from __future__ import annotations

import itertools
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import zmq

from policylink.adapters import security
from policylink.adapters.protocol import (
    PROTOCOL_VERSION,
    SUPPORTED_PROTOCOLS,
    ErrorCode,
    ProtocolError,
    RemoteError,
    VersionMismatchError,
    encode_message,
    parse_message,
)

__all__ = ["COPY_THRESHOLD", "Channel", "recv_message", "send_message"]

ALIVE_POLL_S = 0.25
"""With an ``alive`` check, how often (seconds) a request waiting for its reply asks whether the server lives."""

COPY_THRESHOLD = 256 * 2**10
"""Frames under this many bytes are copied when sent (the sockets' pyzmq ``copy_threshold``; pyzmq's default is
64 KiB). A zero-copy send costs a Python-level bookkeeping call in pyzmq and a wake-up of its garbage-collector
thread when ZeroMQ releases the frame; measured on the 2-core benchmark machine, copying is as fast or faster up to
~300 KB (two 150 KB images: p50 151-191 vs 199-204 us) and slower from ~600 KB."""
_SNDMORE = zmq.SNDMORE


def recv_message(sock: zmq.Socket) -> list:
    """Receive one multipart message as zero-copy ``zmq.Frame`` objects (the codec wraps their writable buffers
    without copying).

    Each frame carries its own "more" flag, so no ``getsockopt(RCVMORE)`` call is needed per frame (measured: a
    three-frame message is received in 2.4 us this way, against 3.7 us with bytes copies and ``RCVMORE`` and
    4.5 us with ``recv_multipart(copy=False)``). Raises ``zmq.Again`` when nothing arrives within the socket's
    ``RCVTIMEO``.
    """
    frame = sock.recv(copy=False)
    frames = [frame]
    while frame.more:
        frame = sock.recv(copy=False)
        frames.append(frame)
    return frames


def send_message(sock: zmq.Socket, frames: list) -> None:
    """Send ``frames`` (buffers: ``bytes``, arrays, ``zmq.Frame``) as one multipart message, arrays zero-copy
    (frames under the socket's ``copy_threshold``, :data:`COPY_THRESHOLD` on ours, are copied).

    One ``send`` per frame, without ``send_multipart``'s per-frame type check (measured: 3.5 us against 4.9 us
    for a two-frame message): every caller sends frames made by the codec, or received ones.
    """
    for frame in frames[:-1]:
        sock.send(frame, _SNDMORE, copy=False)
    sock.send(frames[-1], 0, copy=False)


class Channel:
    """Client side of one server: a DEALER socket, request ids, timeouts, and a fresh socket after a timeout.

    Replies whose id is not the pending request's (late replies to timed-out requests) are discarded.
    Requests use :attr:`protocol`, agreed in :meth:`hello` (the newest the server speaks). Thread-safe (one
    request at a time).

    Each channel has a ZeroMQ context, so an I/O thread, of its own (made with its first socket, ended by
    :meth:`close`): its messages never wait in an I/O thread busy with another connection's transfers. Measured on
    the 2-core benchmark machine: a state-only request on a channel whose I/O thread also carries another
    channel's images (the process-wide ``zmq.Context.instance()``) took 0.16-0.19 ms at p50, against 0.14-0.15 ms
    on its own I/O thread (transport benchmark case (a), three alternating runs each).

    Args:
        endpoint: the server's ZeroMQ endpoint, e.g. ``"tcp://127.0.0.1:5555"``.
        replies: verb -> reply body schema of :data:`PROTOCOL_VERSION` (:data:`~policylink.adapters.protocol.
            POLICY_REPLIES`...).
        timeout_s: default per-request timeout, seconds.
        curve_keys: a key folder or :class:`~policylink.adapters.security.ClientKeys` when the server uses CURVE.
        replies_by_protocol: reply schemas of older protocols (used after :meth:`hello` agreed on one).
        alive: optional check that the server's process still lives (a child process the caller started): a
            request then waits in slices of :data:`ALIVE_POLL_S` and raises ``ConnectionError`` soon after the
            process ends instead of at the timeout. None (servers elsewhere): one wait of the whole timeout.

    Raises:
        EndpointError: ``endpoint`` is malformed, e.g. ``"127.0.0.1:5599"`` (names ``tcp://127.0.0.1:5599``).
    """

    def __init__(
        self,
        endpoint: str,
        replies: Mapping[str, Mapping[str, Any]],
        *,
        timeout_s: float = 10.0,
        curve_keys: str | Path | security.ClientKeys | None = None,
        replies_by_protocol: Mapping[int, Mapping[str, Mapping[str, Any]]] | None = None,
        alive: Callable[[], bool] | None = None,
    ):
        security.check_endpoint(endpoint, "connect")
        self._init_common(endpoint, replies, timeout_s, replies_by_protocol, alive)
        self._keys = security.load_client_keys(curve_keys) if isinstance(curve_keys, (str, Path)) else curve_keys
        self._conn = _Connection()
        weakref.finalize(self, self._conn.close)  # a channel dropped unclosed still closes in the right order
        self._rcvtimeo = -1

    def _init_common(
        self,
        endpoint: str,
        replies: Mapping[str, Mapping[str, Any]],
        timeout_s: float,
        replies_by_protocol: Mapping[int, Mapping[str, Mapping[str, Any]]] | None,
        alive: Callable[[], bool] | None,
    ) -> None:
        """The state every channel has, whatever carries its messages (a subclass's ``__init__`` calls this)."""
        self._alive = alive
        self.endpoint, self.timeout_s, self._replies = endpoint, float(timeout_s), replies
        self._by_protocol = replies_by_protocol
        self.protocol = PROTOCOL_VERSION
        self._ids = itertools.count(1)
        self._lock = threading.Lock()

    def request(
        self, verb: str, body: Mapping[str, Any], timeout_s: float | None = None, *, check_keys: bool = True
    ) -> dict[str, Any]:
        """Send ``verb`` with ``body`` (in :attr:`protocol`) and return the reply body (``check_keys``: see
        :func:`~policylink.adapters.codec.encode`).

        Raises:
            TimeoutError: no reply within the timeout (names the server and the verb); the socket is dropped
                and the next request connects afresh.
            ConnectionError: with an ``alive`` check, the server's process ended while waiting (noticed within
                :data:`ALIVE_POLL_S`, not at the timeout).
            RemoteError: the server replied with an error (``code``, ``message``, ``field``);
                :class:`VersionMismatchError` for ``version_mismatch``.
            CodecError: ``body`` holds a value the codec refuses (nothing is sent).
            ProtocolError: the reply breaks the protocol.
        """
        return self._request(verb, body, timeout_s, self.protocol, check_keys)

    def _request(
        self, verb: str, body: Mapping[str, Any], timeout_s: float | None, protocol: int, check_keys: bool = True
    ) -> dict[str, Any]:
        timeout = self.timeout_s if timeout_s is None else float(timeout_s)
        with self._lock:
            frames = encode_message(rid := next(self._ids), verb, body, protocol, check_keys=check_keys)
            self._send(frames, verb)
            deadline = time.monotonic() + timeout
            first = True
            while True:
                frames = self._receive(verb, timeout, deadline, first)
                first = False
                reply = parse_message(frames, self._replies, allow_error=True, by_protocol=self._by_protocol)
                if reply.id != rid:  # a late reply to an earlier, timed-out request
                    continue
                if reply.type == "error":
                    b = reply.body
                    cls = VersionMismatchError if b["code"] == ErrorCode.VERSION_MISMATCH.value else RemoteError
                    raise cls(self.endpoint, verb, b["code"], b["message"], b.get("field"))
                if reply.type != verb:
                    raise ProtocolError(
                        ErrorCode.INVALID_FRAME, f"reply type: expected {verb!r}, received {reply.type!r}", "type", rid
                    )
                return reply.body

    def _send(self, frames: list, verb: str) -> None:
        """Send one request's frames (the transport's part of :meth:`request`; ZeroMQ here)."""
        send_message(self._socket(), frames)

    def _receive(self, verb: str, timeout: float, deadline: float, first: bool) -> list:
        """The frames of the next message on the connection, waiting until ``deadline`` (``time.monotonic``;
        ``first``: the request's first wait, the whole ``timeout``, which keeps ``RCVTIMEO`` unchanged).

        Raises:
            TimeoutError: nothing by the deadline (the socket is dropped).
            ConnectionError: with an ``alive`` check, the server's process ended.
        """
        sock = self._conn.sock
        remaining_ms = int(timeout * 1e3) if first else int(max(0.0, deadline - time.monotonic()) * 1e3)
        while True:
            wait_ms = remaining_ms if self._alive is None else min(remaining_ms, int(ALIVE_POLL_S * 1e3))
            try:
                if not wait_ms:
                    raise zmq.Again
                if wait_ms != self._rcvtimeo:
                    sock.rcvtimeo = self._rcvtimeo = wait_ms
                frames = recv_message(sock)
            except zmq.Again:
                remaining_ms = int(max(0.0, deadline - time.monotonic()) * 1e3)
                lives = self._alive is None or self._alive()
                if self._alive is not None and lives and remaining_ms:
                    continue
                self._drop_socket()
                if not lives:
                    raise ConnectionError(
                        f"policylink server {self.endpoint}: its process ended while {verb!r} waited for the reply"
                    ) from None
                raise self._timed_out(verb, timeout) from None
            return frames

    def _timed_out(self, verb: str, timeout: float) -> TimeoutError:
        return TimeoutError(
            f"policylink server {self.endpoint}: no reply to {verb!r} within {timeout:g} s (server down "
            "or overloaded, or it refused this client's CURVE key); the next call reconnects on a fresh "
            "socket"
        )

    def hello(self, kind: str, timeout_s: float | None = None) -> dict[str, Any]:
        """Run the ``hello`` handshake, agree on :attr:`protocol` and check the server ``kind``.

        The ``hello`` envelope is protocol 1's (no ``v``), so any policylink server can read it; its body offers
        the newest protocol first, and a server that refuses it (``version_mismatch``: an older policylink) is
        asked again with each older protocol of :data:`SUPPORTED_PROTOCOLS`.

        Raises:
            VersionMismatchError: the server speaks none of our protocols.
            ProtocolError: the server is not a ``kind`` server.
        """
        for protocol in sorted(SUPPORTED_PROTOCOLS, reverse=True):
            try:
                reply = self._request("hello", {"protocol": protocol, "client": "policylink"}, timeout_s, 1)
                break
            except VersionMismatchError:
                if protocol == min(SUPPORTED_PROTOCOLS):
                    raise
        if reply["protocol"] != protocol:
            raise VersionMismatchError(
                self.endpoint,
                "hello",
                ErrorCode.VERSION_MISMATCH.value,
                f"protocol: expected {protocol} (client), received {reply['protocol']} (server)",
                "protocol",
            )
        self.protocol = protocol
        if reply["kind"] != kind:
            raise ProtocolError(
                ErrorCode.INVALID_FIELD,
                f"kind: expected a {kind} server at {self.endpoint}, received {reply['kind']!r}",
                "kind",
            )
        return reply

    def ping(self, timeout_s: float | None = None) -> float:
        """Round-trip time of a ``ping``, seconds."""
        t0 = time.perf_counter()
        self.request("ping", {}, timeout_s)
        return time.perf_counter() - t0

    def close(self) -> None:
        """Close the socket and end the channel's ZeroMQ context (a later request opens new ones)."""
        with self._lock:
            self._conn.close()

    def _socket(self) -> zmq.Socket:
        conn = self._conn
        if conn.sock is None:
            if conn.ctx is None:
                conn.ctx = zmq.Context()
            sock = conn.ctx.socket(zmq.DEALER)
            sock.linger = 0
            sock.copy_threshold = COPY_THRESHOLD
            if self._keys is not None:
                security.secure_client_socket(sock, self._keys)
            sock.connect(self.endpoint)
            conn.sock, self._rcvtimeo = sock, -1
        return conn.sock

    def _drop_socket(self) -> None:
        self._conn.drop_socket()


class _Connection:
    """A channel's ZeroMQ context and DEALER socket (either None until needed).

    Kept apart from the :class:`Channel` so that a finalizer can close them when the channel is garbage-collected
    unclosed: the socket first, then the context (``zmq.Context`` ending itself while one of its sockets is still
    open, as its own ``__del__`` can do in a garbage cycle, waits forever)."""

    __slots__ = ("ctx", "sock")

    def __init__(self) -> None:
        self.ctx: zmq.Context | None = None
        self.sock: zmq.Socket | None = None

    def drop_socket(self) -> None:
        """Close the socket, dropping unsent messages."""
        if self.sock is not None:
            self.sock.close(linger=0)
            self.sock = None

    def close(self) -> None:
        """Close the socket, then end the context (its I/O thread)."""
        self.drop_socket()
        if self.ctx is not None:
            self.ctx.term()
            self.ctx = None
