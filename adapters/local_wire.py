"""The policylink wire over one Unix-domain stream socket (``unix://PATH``), for a server on the same machine that
its client started (an isolated env family's process): the same envelope, verbs, versions, schema checks, errors
and timeouts as the ZeroMQ wire (:mod:`policylink.adapters.channel`, :mod:`policylink.adapters.rpc`), carried
without ZeroMQ's I/O threads.

Why: ZeroMQ hands every message to an I/O thread on each side, so one round trip wakes six threads (caller ->
its I/O thread -> the server's I/O thread -> the serving thread, and back). On the 2-core, shared benchmark machine
each wake-up waits for a core and runs the caller's Python with cold caches; here the caller's thread writes and
reads the socket itself and the server's serving thread does the same, so a round trip wakes two threads (measured,
empty requests under load 7: 122 us for ZeroMQ ``ipc`` against 23 us for a Unix socket, median of 6 blocks).

Framing (one message, both directions): ``u32 n`` (frame count, 1..:data:`MAX_FRAMES`), ``n x u32`` frame byte
lengths, then the frames' bytes back to back; little-endian. The frames are the codec's (a msgpack header and one
frame per array, :mod:`policylink.adapters.codec`). Received frames are writable views of one buffer per message,
so decoded arrays are writable and never alias a later message.

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
from typing import Any

from policylink.adapters.channel import ALIVE_POLL_S, Channel
from policylink.adapters.protocol import ErrorCode, ProtocolError

__all__ = [
    "LOCAL_SCHEME",
    "MAX_FRAMES",
    "LocalChannel",
    "LocalListener",
    "MessageReader",
    "check_local_endpoint",
    "open_channel",
]

LOCAL_SCHEME = "unix://"
MAX_FRAMES = 4096
"""Most frames one message may have (a header and one frame per array)."""
_COUNT = struct.Struct("<I")
_CHUNK = 64 * 2**10  # bytes read per receive call while a message is incomplete
_ACCEPT_POLL_S = 0.1  # how often the serving thread looks at its stop flag while idle
PARTIAL_MESSAGE_S = 10.0
"""A client that has sent part of a message and nothing more for this long (seconds) is disconnected."""
_EOF = "the peer closed the connection"


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


def send_frames(sock: socket.socket, frames: list) -> None:
    """Write ``frames`` (buffers: ``bytes``, C-contiguous arrays, ``memoryview``) as one message, in one
    ``sendmsg`` call when the socket takes it whole (the frames themselves are handed to the kernel, not copied).

    Raises:
        OSError: the socket failed (``BrokenPipeError`` / ``ConnectionResetError``: the peer is gone;
            ``TimeoutError``: the socket's send timeout passed with the message unsent).
        ValueError: a frame is a non-contiguous array (the codec never makes one).
    """
    lengths = [len(f) if type(f) is bytes else memoryview(f).nbytes for f in frames]
    prefix = _lengths_struct(len(frames) + 1).pack(len(frames), *lengths)
    sent = sock.sendmsg([prefix, *frames])
    total = len(prefix) + sum(lengths)
    if sent == total:
        return
    data = memoryview(b"".join([prefix, *(memoryview(f).cast("B") for f in frames)]))[sent:]  # a partial write
    while data:
        data = data[sock.send(data) :]


_STRUCTS = [struct.Struct(f"<{n}I") for n in range(65)]


def _lengths_struct(n: int) -> struct.Struct:
    """``struct.Struct`` of ``n`` little-endian u32 (made once for up to 64)."""
    return _STRUCTS[n] if n < len(_STRUCTS) else struct.Struct(f"<{n}I")


class MessageReader:
    """Reads framed messages from one stream socket (see the module docstring for the framing).

    Each message's frames are ``memoryview`` slices of a ``bytearray`` of its own (writable; decoded arrays view
    it without a copy). Bytes past the end of a message stay buffered for the next read.

    Args:
        max_bytes: messages whose frames add up to more bytes are not kept (see :meth:`read`).
    """

    def __init__(self, max_bytes: int):
        self.max_bytes = int(max_bytes)
        self._buf = bytearray(_CHUNK)
        self._view = memoryview(self._buf)  # the buffer never changes size
        self._start = self._end = 0

    def read(self, sock: socket.socket, wait: Callable[[], bool]) -> tuple[list, int]:
        """The next message: ``(frames, size)``, ``size`` the sum of its frame lengths. A message over
        ``max_bytes`` is consumed and dropped; its first frame (the envelope) is returned alone when it is under
        1 MiB (so the reply can carry the request's id), else no frame.

        Args:
            sock: a blocking socket; a receive that times out (``SO_RCVTIMEO``) calls ``wait``.
            wait: called when nothing arrived in time; returns True to keep waiting, False to give up.

        Raises:
            TimeoutError: ``wait`` returned False.
            ConnectionError: the peer closed the connection, or sent a malformed prefix (the stream cannot be
                resynchronised: the caller drops the connection).
        """
        if self._end - self._start < _COUNT.size:
            self._fill(sock, _COUNT.size, wait)
        (n,) = _COUNT.unpack_from(self._buf, self._start)
        if not 1 <= n <= MAX_FRAMES:
            raise ConnectionError(f"message prefix: expected 1..{MAX_FRAMES} frames, received {n}")
        head = _COUNT.size * (n + 1)
        if self._end - self._start < head:
            self._fill(sock, head, wait)
        lengths = _lengths_struct(n).unpack_from(self._buf, self._start + _COUNT.size)
        self._start += head
        size = sum(lengths)
        if size > self.max_bytes:
            first = self._take(sock, lengths[0], wait) if lengths[0] <= 2**20 else None
            self._skip(sock, size - (lengths[0] if first is not None else 0), wait)
            return ([memoryview(first)] if first is not None else []), size
        data = memoryview(self._take(sock, size, wait))
        if n == 1:
            return [data], size
        frames, offset = [], 0
        for length in lengths:
            frames.append(data[offset : offset + length])
            offset += length
        return frames, size

    @property
    def buffered(self) -> int:
        """Bytes received past the last message read (the start of the next one)."""
        return self._end - self._start

    def _recv(self, sock: socket.socket, view: memoryview, wait: Callable[[], bool]) -> int:
        """Receive into ``view`` (at least one byte), calling ``wait`` on each timeout."""
        while True:
            try:
                got = sock.recv_into(view)
            except (BlockingIOError, TimeoutError):
                if not wait():
                    raise TimeoutError("no message in time") from None
                continue
            except InterruptedError:
                continue
            if not got:
                raise ConnectionError(_EOF)
            return got

    def _fill(self, sock: socket.socket, need: int, wait: Callable[[], bool]) -> None:
        """Make at least ``need`` (small) bytes available from ``_start``."""
        while self._end - self._start < need:
            if self._start and self._end == self._start:
                self._start = self._end = 0
            elif len(self._buf) - self._start < need:  # move the partial prefix to the front
                kept = self._end - self._start
                self._buf[:kept] = self._buf[self._start : self._end]
                self._start, self._end = 0, kept
            self._end += self._recv(sock, self._view[self._end :], wait)

    def _take(self, sock: socket.socket, size: int, wait: Callable[[], bool]) -> bytearray:
        """The next ``size`` bytes as a new ``bytearray`` (buffered ones copied, the rest received into it)."""
        have = min(size, self._end - self._start)
        out = self._buf[self._start : self._start + have] if have == size else bytearray(size)  # a new bytearray
        if have < size:
            out[:have] = self._buf[self._start : self._start + have]
            view = memoryview(out)
            while have < size:
                have += self._recv(sock, view[have:], wait)
            self._start = self._end = 0
        else:
            self._start += have
        return out

    def _skip(self, sock: socket.socket, size: int, wait: Callable[[], bool]) -> None:
        """Consume and drop the next ``size`` bytes."""
        have = min(size, self._end - self._start)
        self._start += have
        size -= have
        scratch = memoryview(bytearray(_CHUNK))
        while size:
            size -= self._recv(sock, scratch[: min(size, _CHUNK)], wait)


def _set_receive_timeout(sock: socket.socket, seconds: float) -> None:
    """``SO_RCVTIMEO``: a blocking receive returns ``EAGAIN`` after ``seconds`` (one system call per receive, unlike
    Python's socket timeouts, which poll first)."""
    sec = int(seconds)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, struct.pack("ll", sec, int((seconds - sec) * 1e6)))


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
        max_message_bytes: replies larger than this are dropped (``ProtocolError`` ``too_large``).

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
        self._sock: socket.socket | None = None
        self._deadline = 0.0  # of the request waiting for its reply (time.monotonic)
        self._wait_s = -1.0  # the socket's receive timeout (SO_RCVTIMEO), seconds; -1: not set yet
        self._reader = MessageReader(max_message_bytes)
        self._max_bytes = int(max_message_bytes)

    def close(self) -> None:
        """Close the connection (a later request connects again)."""
        with self._lock:
            self._drop_socket()

    def _send(self, frames: list, verb: str) -> None:
        if self._sock is None:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.connect(self._path)
            except OSError as e:
                sock.close()
                raise ConnectionError(f"policylink server {self.endpoint}: cannot connect ({e})") from None
            self._sock, self._reader = sock, MessageReader(self._max_bytes)
            self._wait_s = -1.0
        try:
            send_frames(self._sock, frames)
        except OSError as e:
            self._drop_socket()
            raise self._ended(verb, f"sending failed ({e})") from None

    def _receive(self, verb: str, timeout: float, deadline: float, first: bool) -> list:
        sock = self._sock
        wait_s = timeout if self._alive is None else min(timeout, ALIVE_POLL_S)
        if wait_s != self._wait_s:
            _set_receive_timeout(sock, max(wait_s, 1e-3))
            self._wait_s = wait_s
        self._deadline = deadline
        try:
            frames, size = self._reader.read(sock, self._keep_waiting)
        except TimeoutError:
            self._drop_socket()
            if self._alive is not None and not self._alive():
                raise self._ended(verb) from None
            raise self._timed_out(verb, timeout) from None
        except ConnectionError as e:
            self._drop_socket()
            raise self._ended(verb, str(e)) from None
        if size > self._max_bytes:
            raise ProtocolError(
                ErrorCode.TOO_LARGE, f"reply: expected at most {self._max_bytes} bytes, received {size}", None
            )
        return frames

    def _keep_waiting(self) -> bool:
        """After a receive timeout: whether to wait on (the server's process lives and the deadline is ahead)."""
        return (self._alive is None or self._alive()) and time.monotonic() < self._deadline

    def _timed_out(self, verb: str, timeout: float) -> TimeoutError:
        return TimeoutError(
            f"policylink server {self.endpoint}: no reply to {verb!r} within {timeout:g} s (server stuck or "
            "overloaded); the next call connects afresh"
        )

    def _ended(self, verb: str, why: str = "") -> ConnectionError:
        """The server's side ended: its process (when ``alive`` says so, after up to 1 s for the exit to be
        reaped: the socket closes before the process is a zombie), else the connection."""
        if self._alive is not None:
            until = time.monotonic() + 1.0
            while self._alive() and time.monotonic() < until:
                time.sleep(0.01)
            if not self._alive():
                return ConnectionError(
                    f"policylink server {self.endpoint}: its process ended while {verb!r} waited for the reply"
                )
        return ConnectionError(f"policylink server {self.endpoint}: {why or _EOF} during {verb!r}")

    def _drop_socket(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


class LocalListener:
    """Serves a :class:`~policylink.adapters.rpc.Server`'s verbs on a ``unix://PATH`` socket, every call in one
    serving thread (so an env that renders keeps its GL context on that thread).

    The serving thread polls the listening socket and every connection; for each request it gets the reply from
    ``answer`` (the server's checks, ``hello``/``ping``, :meth:`~policylink.adapters.rpc.Server.handle`, error
    replies) and writes it back. Requests of several clients are answered one after the other; a client that
    stalls inside a message for :data:`PARTIAL_MESSAGE_S` is dropped.

    Args:
        path: the socket file (created by :meth:`start`, removed by :meth:`stop`); its folder should be private.
        answer: ``answer(frames, size) -> reply frames``.
        max_message_bytes: larger requests are drained and answered by ``answer`` with their envelope only.
        name: the serving thread's name.
    """

    def __init__(self, path: str, answer: Callable[[list, int], list], max_message_bytes: int, name: str):
        self.path, self._answer, self._max = path, answer, int(max_message_bytes)
        self._name = name
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._listener: socket.socket | None = None
        self._until = 0.0  # a message being read must be complete by then (time.monotonic)

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
        poller = select.poll()
        poller.register(listener, select.POLLIN)
        conns: dict[int, tuple[socket.socket, MessageReader]] = {}
        try:
            while not self._stop.is_set():
                for fd, _ in poller.poll(_ACCEPT_POLL_S * 1e3):
                    if fd == listener.fileno():
                        try:
                            conn, _ = listener.accept()
                        except OSError:
                            continue
                        _set_receive_timeout(conn, _ACCEPT_POLL_S)
                        conns[conn.fileno()] = (conn, MessageReader(self._max))
                        poller.register(conn, select.POLLIN)
                    elif fd in conns and not self._serve_one(*conns[fd]):
                        conn = conns.pop(fd)[0]
                        poller.unregister(fd)
                        conn.close()
        finally:
            for conn, _ in conns.values():
                conn.close()

    def _serve_one(self, conn: socket.socket, reader: MessageReader) -> bool:
        """Answer the request ``conn`` has (and any further one already buffered); False when the connection ended
        (closed by the client, broken framing, a stalled message, or :meth:`stop`)."""
        while True:
            self._until = time.monotonic() + PARTIAL_MESSAGE_S
            try:
                frames, size = reader.read(conn, self._keep_reading)
            except (TimeoutError, ConnectionError, OSError):
                return False
            reply = self._answer(frames, size)
            try:
                send_frames(conn, reply)
            except OSError:  # the client went away (it timed out and closed the connection)
                return False
            if not reader.buffered:
                return True

    def _keep_reading(self) -> bool:
        """After a receive timeout inside a message: whether to wait on (not stopping, not stalled too long)."""
        return not self._stop.is_set() and time.monotonic() < self._until
