"""The policylink wire over one Unix-domain stream socket (``unix://PATH``), for a server on the same machine that
its client started (an isolated env family's process): the same envelope, verbs, versions, schema checks, errors
and timeouts as the ZeroMQ wire (:mod:`policylink.adapters.channel`, :mod:`policylink.adapters.rpc`), carried
without ZeroMQ's I/O threads.

Why: ZeroMQ hands every message to an I/O thread on each side, so one round trip wakes six threads (caller ->
its I/O thread -> the server's I/O thread -> the serving thread, and back). On the 2-core, shared benchmark machine
each wake-up waits for a core and runs the caller's Python with cold caches; here the caller's thread writes and
reads the socket itself and the server's serving thread does the same, so a round trip wakes two threads (measured,
empty requests under load 7: 122 us for ZeroMQ ``ipc`` against 23 us for a Unix socket, median of 6 blocks).

The stream is the standard library's :mod:`multiprocessing.connection` (length-prefixed messages: ``send_bytes``,
``recv_bytes``); readiness waits are :func:`select.poll`'s. One policylink message (:func:`send_message`) is a head,
``u32 n`` (frame count, 1..:data:`MAX_FRAMES`), ``n x u32`` frame byte lengths (little-endian) and the frames
under :data:`INLINE_BELOW` bytes back to back, in one ``send_bytes`` message; then the longer frames' bytes, as
they are (``os.write``), received straight into a ``bytearray`` each (``os.readv``): no copy of an image on either
side. The frames are the codec's (a msgpack header and one frame per array, :mod:`policylink.adapters.codec`). The
head carries the message's size, so one over the limit is refused before its long frames are read (they are read
and dropped in pieces, never kept; the envelope, in the head, names the request in the ``too_large`` reply).
Decoded arrays are writable and never alias a later message (the codec copies those of the read-only head; a long
frame's buffer is its array's own).

No CURVE: the socket is a file in a folder only its owner can enter (the isolated env's private temporary folder);
a ``unix://`` server or client refuses CURVE keys (:class:`~policylink.adapters.rpc.Server`, :func:`open_channel`).
"""

from __future__ import annotations

import os
import select
import socket
import struct
import threading
import time
from collections.abc import Callable, Mapping
from multiprocessing.connection import Connection
from typing import Any

from policylink.adapters.channel import ALIVE_POLL_S, Channel
from policylink.adapters.protocol import ErrorCode, ProtocolError

__all__ = [
    "LOCAL_SCHEME",
    "MAX_FRAMES",
    "PARTIAL_MESSAGE_S",
    "LocalChannel",
    "LocalListener",
    "check_local_endpoint",
    "open_channel",
    "receive_message",
    "send_message",
]

LOCAL_SCHEME = "unix://"
MAX_FRAMES = 4096
"""Most frames one message may have (a header and one frame per array)."""
_U32 = struct.Struct("<I")
_STRUCTS = [struct.Struct(f"<{n}I") for n in range(65)]  # u32 runs made once for short messages
_ACCEPT_POLL_S = 0.1  # how often the serving thread looks at its stop flag while idle
INLINE_BELOW = 64 * 2**10
"""Frames shorter than this (bytes) travel in their message's head, copied once; longer ones follow it as they are."""
PARTIAL_MESSAGE_S = 10.0
"""A peer that has sent part of a message and nothing more for this long (seconds) is disconnected."""
_EOF = "the peer closed the connection"
_READ = select.POLLIN


def check_local_endpoint(endpoint: str) -> str:
    """The socket path of ``unix://PATH``.

    Raises:
        ValueError: ``endpoint`` is not ``unix://`` followed by a path (names the received value).
    """
    if not isinstance(endpoint, str) or not endpoint.startswith(LOCAL_SCHEME) or len(endpoint) == len(LOCAL_SCHEME):
        raise ValueError(f"endpoint: expected 'unix://PATH' (a Unix socket file), received {endpoint!r}")
    return endpoint[len(LOCAL_SCHEME) :]


def open_channel(
    endpoint: str,
    replies: Mapping[str, Mapping[str, Any]],
    *,
    timeout_s: float = 10.0,
    curve_keys: Any = None,
    replies_by_protocol: Mapping[int, Mapping[str, Mapping[str, Any]]] | None = None,
    alive: Callable[[], bool] | None = None,
) -> Channel:
    """The client channel for ``endpoint``: a :class:`LocalChannel` for ``unix://PATH``, else a ZeroMQ
    :class:`~policylink.adapters.channel.Channel` (arguments as there).

    Raises:
        ValueError: ``curve_keys`` with a ``unix://`` endpoint (CURVE is for ZeroMQ's tcp; the socket file's folder
            guards a local server).
        EndpointError: a malformed ZeroMQ endpoint (see :class:`~policylink.adapters.channel.Channel`).
    """
    if not endpoint.startswith(LOCAL_SCHEME):
        return Channel(
            endpoint,
            replies,
            timeout_s=timeout_s,
            curve_keys=curve_keys,
            replies_by_protocol=replies_by_protocol,
            alive=alive,
        )
    if curve_keys is not None:
        raise ValueError(f"curve_keys: expected None for a {LOCAL_SCHEME} endpoint (CURVE is for tcp), received a key")
    return LocalChannel(endpoint, replies, timeout_s=timeout_s, replies_by_protocol=replies_by_protocol, alive=alive)


def _u32s(n: int) -> struct.Struct:
    return _STRUCTS[n] if n < len(_STRUCTS) else struct.Struct(f"<{n}I")


def send_message(conn: Connection, frames: list) -> None:
    """Write ``frames`` (buffers: ``bytes``, C-contiguous arrays, ``memoryview``) as one policylink message: its
    head (the frame count, the frames' byte lengths, and every frame under :data:`INLINE_BELOW` bytes, copied once)
    as a ``send_bytes`` message, then the longer frames' bytes as they are (not copied).

    Raises:
        OSError: the connection failed (``BrokenPipeError``: the peer closed it).
        ValueError: a frame is a non-contiguous array (the codec never makes one).
    """
    lengths = [len(f) if type(f) is bytes else memoryview(f).nbytes for f in frames]
    head = [_u32s(len(frames) + 1).pack(len(frames), *lengths)]
    head += [f for f, n in zip(frames, lengths) if n < INLINE_BELOW]
    conn.send_bytes(b"".join(head))
    for f, n in zip(frames, lengths):
        if n >= INLINE_BELOW:
            view = memoryview(f).cast("B")
            while view:
                view = view[os.write(conn.fileno(), view) :]


def receive_message(conn: Connection, max_bytes: int) -> tuple[list, int]:
    """The next message of :func:`send_message`: ``(frames, size)``, ``size`` the sum of its frame lengths; a
    short frame is a read-only ``memoryview`` of the head, a long one a writable one of its own ``bytearray``
    (received into it). A message over ``max_bytes`` is refused from its head: its frames are not kept (the long
    ones are read and dropped in 64 KiB pieces, so the stream stays in step) and its first frame (the envelope)
    comes back alone when it was in the head, else no frame.

    Raises:
        EOFError: the peer closed the connection between messages.
        OSError: the connection failed or ended inside a message, or the head alone is longer than ``max_bytes``
            (``"bad message length"``: left unread, so the stream is out of step: the caller closes it).
        ConnectionError: a malformed head (frame count outside 1..:data:`MAX_FRAMES`, lengths that do not add
            up); out of step.
    """
    head = conn.recv_bytes(max_bytes + 4 * (MAX_FRAMES + 1))
    (n,) = _U32.unpack_from(head) if len(head) >= 4 else (0,)
    if not 1 <= n <= MAX_FRAMES or len(head) < 4 * (n + 1):
        raise ConnectionError(f"message prefix: expected 1..{MAX_FRAMES} frames, received {n}")
    lengths = _u32s(n).unpack_from(head, 4)
    offset, view, size = 4 * (n + 1), memoryview(head), sum(lengths)
    inline = offset + sum(x for x in lengths if x < INLINE_BELOW)
    if inline != len(head):
        raise ConnectionError(f"message head: expected {inline} bytes, received {len(head)}")
    frames, kept = [], size <= max_bytes
    for length in lengths:
        if length < INLINE_BELOW:
            frames.append(view[offset : offset + length])
            offset += length
        elif kept:
            frames.append(_read_into(conn, memoryview(bytearray(length))))
        else:
            scratch = memoryview(bytearray(INLINE_BELOW))
            while length:
                length -= len(_read_into(conn, scratch[: min(length, INLINE_BELOW)]))
    return (frames if kept else frames[:1] if lengths[0] < INLINE_BELOW else []), size


def _read_into(conn: Connection, view: memoryview) -> memoryview:
    """Fill ``view`` from ``conn``'s stream; returns it. Raises OSError when the stream ends first."""
    got = 0
    while got < len(view):
        n = os.readv(conn.fileno(), [view[got:]])
        if not n:
            raise OSError("got end of file during message")
        got += n
    return view


def _connection(sock: socket.socket) -> Connection:
    """``sock`` as a :class:`~multiprocessing.connection.Connection` whose reads inside a message give up after
    :data:`PARTIAL_MESSAGE_S` (``SO_RCVTIMEO``; every read starts once ``poll`` says bytes are there)."""
    sec = int(PARTIAL_MESSAGE_S)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, struct.pack("ll", sec, int((PARTIAL_MESSAGE_S - sec) * 1e6)))
    return Connection(sock.detach())


class LocalChannel(Channel):
    """:class:`~policylink.adapters.channel.Channel` over a ``unix://PATH`` socket (see the module docstring): the
    same requests, ``hello`` negotiation, reply checks, errors and timeouts; the calling thread writes the request
    and reads the reply itself.

    A request that times out closes the connection (the next one connects afresh, so a late reply is never read
    as the next one's). The server ending its side (its process died) is a ``ConnectionError`` at once, not at
    the timeout.

    Args:
        endpoint: ``unix://PATH``.
        replies, timeout_s, replies_by_protocol, alive: as :class:`~policylink.adapters.channel.Channel`.
        max_message_bytes: a longer reply is refused from its head and not kept (``ProtocolError``
            ``too_large``).

    Raises:
        ValueError: ``endpoint`` is not ``unix://PATH``.
    """

    def __init__(
        self,
        endpoint: str,
        replies: Mapping[str, Mapping[str, Any]],
        *,
        timeout_s: float = 10.0,
        replies_by_protocol: Mapping[int, Mapping[str, Mapping[str, Any]]] | None = None,
        alive: Callable[[], bool] | None = None,
        max_message_bytes: int = 2**31,
    ):
        self._path = check_local_endpoint(endpoint)
        self._init_common(endpoint, replies, timeout_s, replies_by_protocol, alive)
        self._conn: Connection | None = None
        self._ready: Any = None  # a select.poll of the connection: tells when it has bytes to read
        self._max_bytes = int(max_message_bytes)

    def close(self) -> None:
        """Close the connection (a later request connects again)."""
        with self._lock:
            self._drop()

    def _send(self, frames: list, verb: str) -> None:
        if self._conn is None:
            self._connect()
        try:
            send_message(self._conn, frames)
        except OSError as e:
            raise self._ended(verb, f"sending failed ({e})") from None

    def _connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(self._path)
        except OSError as e:
            sock.close()
            raise ConnectionError(f"policylink server {self.endpoint}: cannot connect ({e})") from None
        self._conn = _connection(sock)
        self._ready = select.poll()
        self._ready.register(self._conn, _READ)

    def _receive(self, verb: str, timeout: float, deadline: float, first: bool) -> list:
        wait_s = timeout if self._alive is None else min(timeout, ALIVE_POLL_S)
        while not self._ready.poll(wait_s * 1e3):
            if (self._alive is None or self._alive()) and time.monotonic() < deadline:
                wait_s = min(wait_s, max(deadline - time.monotonic(), 1e-3))
                continue
            self._drop()
            if self._alive is not None and not self._alive():
                raise self._ended(verb) from None
            raise self._timed_out(verb, timeout) from None
        try:
            frames, size = receive_message(self._conn, self._max_bytes)
        except EOFError:
            raise self._ended(verb) from None
        except OSError as e:  # ConnectionError: broken framing; errno None: an over-long head, or cut short
            raise self._ended(verb, f"receiving failed ({e})") from None
        if size > self._max_bytes:
            raise ProtocolError(
                ErrorCode.TOO_LARGE, f"reply: expected at most {self._max_bytes} bytes, received {size}", None
            )
        return frames

    def _timed_out(self, verb: str, timeout: float) -> TimeoutError:
        return TimeoutError(
            f"policylink server {self.endpoint}: no reply to {verb!r} within {timeout:g} s (server stuck or "
            "overloaded); the next call connects afresh"
        )

    def _ended(self, verb: str, why: str = "") -> ConnectionError:
        """The server's side ended (the connection is dropped): its process (when ``alive`` says so, after up to
        1 s for the exit to be reaped: the socket closes before the process is a zombie), else the connection."""
        self._drop()
        if self._alive is not None:
            until = time.monotonic() + 1.0
            while self._alive() and time.monotonic() < until:
                time.sleep(0.01)
            if not self._alive():
                return ConnectionError(
                    f"policylink server {self.endpoint}: its process ended while {verb!r} waited for the reply"
                )
        return ConnectionError(f"policylink server {self.endpoint}: {why or _EOF} during {verb!r}")

    def _drop(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = self._ready = None


class LocalListener:
    """Serves a :class:`~policylink.adapters.rpc.Server`'s verbs on a ``unix://PATH`` socket, every call in one
    serving thread (so an env that renders keeps its GL context on that thread).

    The serving thread waits on the listening socket and every connection; for each request it gets the reply from
    ``answer`` (the server's checks, ``hello``/``ping``, :meth:`~policylink.adapters.rpc.Server.handle`, error
    replies) and writes it back. Requests of several clients are answered one after the other. A request over
    ``max_message_bytes`` is refused from its head and not kept (:func:`receive_message`): ``answer`` replies
    ``too_large`` with the request's id. A client that stalls inside a message for :data:`PARTIAL_MESSAGE_S` is
    dropped.

    Args:
        path: the socket file (created by :meth:`start`, removed by :meth:`stop`); its folder should be private.
        answer: ``answer(frames, size) -> reply frames`` (``size``: the frames' byte count).
        max_message_bytes: the longest request read.
        name: the serving thread's name.
    """

    def __init__(self, path: str, answer: Callable[[list, int], list], max_message_bytes: int, name: str):
        self.path, self._answer, self._max = path, answer, int(max_message_bytes)
        self._name = name
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._listener: socket.socket | None = None

    def start(self) -> None:
        """Bind and listen, then start the serving thread.

        Raises:
            OSError: the path cannot be bound (exists, folder missing, name too long).
        """
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            listener.bind(self.path)
            listener.listen(16)
        except OSError:
            listener.close()
            raise
        self._listener = listener
        self._stop.clear()
        self._thread = threading.Thread(target=self._serve, daemon=True, name=self._name)
        self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop serving (a running call is abandoned after ``timeout_s``), close the socket and remove its file."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None
        if self._listener is not None:
            self._listener.close()
            self._listener = None
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass

    def _serve(self) -> None:
        listener = self._listener
        ready, conns = select.poll(), {}  # conns: fd -> Connection
        ready.register(listener, _READ)
        try:
            while not self._stop.is_set():
                for fd, _ in ready.poll(_ACCEPT_POLL_S * 1e3):
                    if fd == listener.fileno():
                        try:
                            conn = _connection(listener.accept()[0])
                        except OSError:
                            continue
                        conns[conn.fileno()] = conn
                        ready.register(conn, _READ)
                    elif fd in conns and not self._serve_one(conns[fd]):
                        ready.unregister(fd)
                        conns.pop(fd).close()
        finally:
            for conn in conns.values():
                conn.close()

    def _serve_one(self, conn: Connection) -> bool:
        """Answer the request ``conn`` has; False when the connection ended (closed by the client, broken
        framing, a stalled message)."""
        try:
            frames, size = receive_message(conn, self._max)
        except (EOFError, OSError):
            return False
        try:
            send_message(conn, self._answer(frames, size))
        except OSError:  # the client went away (it timed out and closed the connection)
            return False
        return True
