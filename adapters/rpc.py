"""ZeroMQ request/reply machinery under the policy and env servers: a ROUTER server with one serving loop that
answers ``hello`` and ``ping`` even while a slow call runs on its worker, with per-verb metrics. The client side,
:class:`~policylink.adapters.channel.Channel`, lives in :mod:`policylink.adapters.channel` (re-exported here).
Never REQ/REP: a lost reply cannot wedge either side (DESIGN.md section 3).
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import Counter, defaultdict, deque
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import zmq

from policylink.adapters import security
from policylink.adapters.channel import COPY_THRESHOLD, Channel, recv_message, send_message
from policylink.adapters.codec import CodecError
from policylink.adapters.local_wire import LOCAL_SCHEME, LocalListener, check_local_endpoint
from policylink.adapters.protocol import (
    PROTOCOL_VERSION,
    SUPPORTED_PROTOCOLS,
    ErrorCode,
    Message,
    ProtocolError,
    encode_message,
    error_frames,
    parse_message,
)

__all__ = [
    "COPY_THRESHOLD",
    "BindError",
    "Channel",
    "DEFAULT_MAX_MESSAGE_BYTES",
    "Server",
    "ServerStats",
    "recv_message",
    "send_message",
]

DEFAULT_MAX_MESSAGE_BYTES = 256 * 2**20
_POLL_MS = 100
_INLINE_AFTER = 8  # consecutive fast calls of a verb before the serving loop runs that verb inline
_server_ids = itertools.count()
log = logging.getLogger(__name__)


class BindError(OSError):
    """A server could not listen on its endpoint (port in use, address not on this machine); one-line message
    ``"bind tcp://127.0.0.1:5555: address already in use"``; ``errno`` is ZeroMQ's (the system's for ``unix://``)."""

    def __init__(self, endpoint: str, error: zmq.ZMQError | OSError):
        reason = zmq.strerror(error.errno) if error.errno else str(error)  # error.strerror also repeats the address
        super().__init__(f"bind {endpoint}: {reason[:1].lower()}{reason[1:]}")
        self.errno, self.endpoint = error.errno, endpoint


class ServerStats:
    """Thread-safe per-verb request counts, error counts and latency percentiles (last ``window`` requests).

    Latency is measured on the server from receiving a request to handing its reply to the socket, in seconds.
    """

    def __init__(self, window: int = 10_000):
        self._lock = threading.Lock()
        self._latency: dict[str, deque[float]] = defaultdict(lambda: deque(maxlen=window))
        self._count: Counter[str] = Counter()
        self._errors: Counter[str] = Counter()

    def record(self, verb: str, seconds: float, error: str | None = None) -> None:
        """Count one reply to ``verb`` that took ``seconds``; ``error`` is its error code or None."""
        with self._lock:
            self._count[verb] += 1
            self._latency[verb].append(seconds)
            if error is not None:
                self._errors[verb] += 1

    def snapshot(self) -> dict[str, dict[str, float]]:
        """``{verb: {"count", "errors", "p50_ms", "p99_ms"}}`` for every verb seen so far."""
        with self._lock:
            out = {}
            for verb in sorted(self._count):
                lat = np.asarray(self._latency[verb], dtype=np.float64) * 1e3
                out[verb] = {
                    "count": self._count[verb],
                    "errors": self._errors[verb],
                    "p50_ms": float(np.percentile(lat, 50)),
                    "p99_ms": float(np.percentile(lat, 99)),
                }
            return out

    def format(self) -> str:
        """A fixed-width table of :meth:`snapshot` (one line per verb)."""
        lines = [f"{'verb':<16}{'count':>9}{'errors':>8}{'p50 ms':>10}{'p99 ms':>10}"]
        for verb, s in self.snapshot().items():
            lines.append(f"{verb:<16}{s['count']:>9d}{s['errors']:>8d}{s['p50_ms']:>10.3f}{s['p99_ms']:>10.3f}")
        return "\n".join(lines)


class Server:
    """Base of :class:`~policylink.adapters.transport.PolicyServer` and ``EnvServer``.

    Subclasses set ``kind``, ``requests`` (verb -> body schema of :data:`PROTOCOL_VERSION`), optionally
    ``requests_by_protocol`` (older protocols' schemas) and ``failure_code``, and implement :meth:`handle` and
    :meth:`spec_dict` (and :meth:`hello_extras` for fields a protocol-2 ``hello`` adds).

    One serving loop: the serving thread owns the ROUTER socket and polls it together with an ``inproc`` pipe
    from one worker thread. It answers ``hello``/``ping`` and malformed requests itself, at once, and hands other
    requests to the worker, which runs :meth:`handle` (one call at a time, in arrival order), encodes the reply
    and sends it back through the pipe; the loop forwards it to the client. So ``hello``/``ping`` are answered
    while a slow call runs, and neither thread wakes unless a message arrives. A thread hand-off costs two
    thread wake-ups per call (tens of microseconds; far more on a loaded machine), so a call whose verb has been
    fast (its last 8 calls each under ``inline_below_s``) runs inline on the serving loop when the worker is idle:
    ``hello``/``ping`` then wait at most for that call. The first calls of every verb, and every call after a slow
    one, go to the worker.

    A ``unix://PATH`` bind serves the same verbs, checks and errors over a Unix socket file without ZeroMQ
    (:mod:`policylink.adapters.local_wire`, for a server its client started on the same machine): every call then
    runs on one serving thread, one client connection at a time, and ``hello``/``ping`` wait for a running call.

    Replies use the request's protocol (envelope ``v``); a reply body holding ``"timing"`` (see
    :data:`~policylink.adapters.protocol.TIMING_FIELDS`) gets ``queue_s`` and ``receive_to_reply_s`` filled in
    here, and loses ``timing`` for a protocol-1 request.

    Args:
        bind: ZeroMQ endpoint, default loopback; a port of ``0`` or ``*`` picks a free one (see ``endpoint``); or
            ``unix://PATH`` (no CURVE: the socket file's folder guards it).
        curve_keys: a key folder (``policylink keys generate``) or :class:`~policylink.adapters.security.ServerKeys`;
            required for a non-loopback ``bind`` unless ``insecure``.
        insecure: allow a non-loopback ``bind`` without CURVE (logs a warning).
        max_message_bytes: requests larger than this get a ``too_large`` error reply; single frames over twice
            this are dropped by ZeroMQ before allocation (the client then times out).
        name: shown in ``hello`` replies and logs.
        inline_below_s: a verb whose last 8 calls each ran under this many seconds runs inline (0 = never).

    Raises:
        EndpointError: ``bind`` is malformed (no ``tcp://``, port outside 1..65535...); a ``ValueError``.
        ValueError: a ``unix://`` bind without a path, or with ``curve_keys``.
        InsecureBindError: non-loopback ``bind`` without keys or ``insecure``.
        BindError: (from :meth:`start`) the endpoint cannot be bound (port in use); an ``OSError``.
    """

    kind: str = ""
    requests: Mapping[str, Mapping[str, Any]] = {}
    requests_by_protocol: Mapping[int, Mapping[str, Mapping[str, Any]]] | None = None
    failure_code: ErrorCode = ErrorCode.INTERNAL
    user_maps_in_replies: bool = True
    """Whether :meth:`handle`'s replies may hold maps from user code (an env's ``info``), whose keys the codec then
    checks; a server whose replies it builds entirely itself sets ``False``."""

    def __init__(
        self,
        bind: str = "tcp://127.0.0.1:5555",
        *,
        curve_keys: str | Path | security.ServerKeys | None = None,
        insecure: bool = False,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        name: str | None = None,
        inline_below_s: float = 0.002,
    ):
        if bind.startswith("tcp://") and bind.endswith(":0"):
            bind = bind[:-1] + "*"
        keys = security.load_server_keys(curve_keys) if isinstance(curve_keys, (str, Path)) else curve_keys
        if bind.startswith(LOCAL_SCHEME):  # a socket file: reachable only through its folder's permissions
            check_local_endpoint(bind)
            if keys is not None:
                raise ValueError(
                    f"curve_keys: expected None for a {LOCAL_SCHEME} bind (CURVE is for tcp), received keys"
                )
        else:
            security.check_bind(bind, keys, insecure)
        self.bind, self.name, self.max_message_bytes = bind, name or f"policylink-{self.kind}", max_message_bytes
        self.inline_below_s = float(inline_below_s)
        self.stats = ServerStats()
        self.endpoint: str | None = None
        self._fast_streak: dict[str, int] = {}  # verb -> how many of its latest calls in a row ran under inline_below_s
        self._keys = keys
        self._ctx: zmq.Context | None = None
        self._auth = None
        self._router: zmq.Socket | None = None
        self._threads: list[threading.Thread] = []
        self._stop = threading.Event()
        self._local: LocalListener | None = None
        self._jobs: deque = deque()  # (identity, Message, receive time) handed to the worker; None = stop
        self._pipe = f"inproc://policylink-pipe-{next(_server_ids)}"

    # -- to implement ------------------------------------------------------------------------------------------
    def spec_dict(self) -> dict[str, Any]:
        """The served object's spec as a plain dict (sent in ``hello``)."""
        raise NotImplementedError

    def hello_extras(self) -> dict[str, Any]:
        """Fields a protocol-2 ``hello`` reply adds to ``protocol``/``kind``/``spec``/``server`` (none here)."""
        return {}

    def handle(self, verb: str, body: dict[str, Any]) -> dict[str, Any]:
        """Serve one verb other than ``hello``/``ping``; return the reply body or raise ProtocolError."""
        raise NotImplementedError

    # -- lifecycle ---------------------------------------------------------------------------------------------
    def start(self) -> Server:
        """Bind and start the serving loop and the worker; returns ``self`` (``endpoint`` = the bound address).

        Raises:
            BindError: the endpoint cannot be bound, e.g. ``"bind tcp://127.0.0.1:5555: address already in use"``.
        """
        if self._threads or self._local is not None:
            return self
        if self.bind.startswith(LOCAL_SCHEME):
            return self._start_local()
        self._stop.clear()
        self._jobs.clear()  # a stop() may have left calls (and the worker's stop mark) behind
        self._ctx = zmq.Context()
        router = self._ctx.socket(zmq.ROUTER)
        router.linger = 0
        router.copy_threshold = COPY_THRESHOLD
        router.setsockopt(zmq.MAXMSGSIZE, max(2 * self.max_message_bytes, self.max_message_bytes + 2**20))
        if self._keys is not None:
            self._auth = security.secure_server_socket(self._ctx, router, self._keys)
        try:
            router.bind(self.bind)
        except zmq.ZMQError as e:
            router.close()
            self._close_context()
            raise BindError(self.bind, e) from None
        self.endpoint = router.getsockopt_string(zmq.LAST_ENDPOINT)
        self._router = router
        loop_end, worker_end = self._ctx.socket(zmq.PAIR), self._ctx.socket(zmq.PAIR)
        loop_end.linger = worker_end.linger = 0
        loop_end.bind(self._pipe)
        worker_end.connect(self._pipe)
        self._threads = [
            threading.Thread(target=self._serve_loop, args=(loop_end,), daemon=True, name=f"{self.name}-serve"),
            threading.Thread(target=self._work_loop, args=(worker_end,), daemon=True, name=f"{self.name}-worker"),
        ]
        for t in self._threads:
            t.start()
        log.info("%s serving on %s", self.name, self.endpoint)
        return self

    def _start_local(self) -> Server:
        """Serve a ``unix://PATH`` bind: every call on one serving thread (:class:`LocalListener`)."""
        local = LocalListener(
            check_local_endpoint(self.bind), self.answer, self.max_message_bytes, f"{self.name}-serve"
        )
        try:
            local.start()
        except OSError as e:
            raise BindError(self.bind, e) from None
        self._local, self.endpoint = local, self.bind
        log.info("%s serving on %s", self.name, self.endpoint)
        return self

    def serve_forever(self, duration_s: float | None = None) -> None:
        """Start (if needed) and block until :meth:`stop`, Ctrl-C, or ``duration_s`` seconds."""
        self.start()
        deadline = None if duration_s is None else time.monotonic() + duration_s
        try:
            while not self._stop.is_set() and (deadline is None or time.monotonic() < deadline):
                self._stop.wait(0.2)
        except KeyboardInterrupt:
            pass
        finally:
            self.stop()

    def stop(self) -> None:
        """Stop the threads and release the socket (pending requests get no reply; a running call is abandoned
        after 10 s)."""
        self._stop.set()
        if self._local is not None:
            self._local.stop()
            self._local = None
        for t in self._threads:
            t.join(timeout=10.0)
        self._threads = []
        if self._router is not None:
            self._router.close(linger=0)
            self._router = None
        self._close_context()

    def __enter__(self) -> Server:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # -- threads -----------------------------------------------------------------------------------------------
    def _close_context(self) -> None:
        if self._auth is not None:
            self._auth.stop()
            self._auth = None
        if self._ctx is not None:
            self._ctx.destroy(linger=0)
            self._ctx = None

    def _serve_loop(self, pipe: zmq.Socket) -> None:
        """Poll the ROUTER socket and the worker's pipe; answer hello/ping, run a call inline when the worker is
        idle and the verb has been fast (:meth:`_inline`), else queue it for the worker; forward finished calls.

        While no call is queued the pipe cannot speak, so the loop then blocks in a plain receive on the ROUTER
        socket (``RCVTIMEO``), which costs less than ``zmq_poll`` over two sockets (measured: ~15 us per request
        on the benchmark machine)."""
        router = self._router
        router.rcvtimeo = _POLL_MS
        poller = zmq.Poller()
        poller.register(router, zmq.POLLIN)
        poller.register(pipe, zmq.POLLIN)
        queued = 0  # calls handed to the worker and not yet answered
        try:
            while not self._stop.is_set():
                if queued:
                    events = dict(poller.poll(_POLL_MS))
                    if pipe in events:  # a finished call: [identity, *reply frames]
                        send_message(router, recv_message(pipe))
                        queued -= 1
                    if router not in events:
                        continue
                try:
                    frames = recv_message(router)
                except zmq.Again:
                    continue
                job = self._receive(router, frames)
                if job is None:
                    continue
                if not queued and self._inline(job[1].type):  # nothing to overtake: no hand-off
                    send_message(router, self._call(*job))
                else:
                    self._jobs.append(job)
                    queued += 1
                    pipe.send(b"")
        finally:
            self._jobs.append(None)
            pipe.send(b"")
            pipe.close(linger=0)

    def _work_loop(self, pipe: zmq.Socket) -> None:
        """Run queued calls one at a time; send each encoded reply back through the pipe."""
        try:
            while True:
                pipe.recv()
                job = self._jobs.popleft()
                if job is None or self._stop.is_set():
                    return
                frames = self._call(*job)
                if self._stop.is_set():
                    return  # the serving loop is gone: nobody would forward the reply
                send_message(pipe, frames)
        finally:
            pipe.close(linger=0)

    def _inline(self, verb: str) -> bool:
        """True when the last :data:`_INLINE_AFTER` calls of ``verb`` each ran under ``inline_below_s``."""
        return self._fast_streak.get(verb, 0) >= _INLINE_AFTER

    def _call(self, identity: Any, msg: Message, t0: float) -> list:
        """Run one call (:meth:`_run`), record its statistics and duration; returns ``[identity, *reply]``."""
        started = time.perf_counter()
        out, error = self._run(msg, t0, started)
        now = time.perf_counter()
        fast = now - started < self.inline_below_s
        self._fast_streak[msg.type] = self._fast_streak.get(msg.type, 0) + 1 if fast else 0
        self.stats.record(msg.type, now - t0, error)  # before the client can see the reply
        return [identity, *out]

    def _receive(self, router: zmq.Socket, frames: list) -> tuple | None:
        """Check one request; answer hello/ping/errors at once, return ``(identity, Message, t0)`` for others."""
        t0 = time.perf_counter()
        identity, payload = frames[0], frames[1:]
        triaged = self._triage(payload, sum(map(len, payload)), t0)  # received frames: len is the byte count
        if type(triaged) is Message:
            return identity, triaged, t0
        send_message(router, [identity, *triaged])
        return None

    def answer(self, payload: list, size: int) -> list:
        """The reply frames to one request (``size``: its byte count), everything in the calling thread: the checks
        and ``hello``/``ping`` of the serving loop, then :meth:`handle` (what a ``unix://`` server runs)."""
        t0 = time.perf_counter()
        triaged = self._triage(payload, size, t0)
        if type(triaged) is Message:
            return self._call(None, triaged, t0)[1:]
        return triaged

    def _triage(self, payload: list, size: int, t0: float) -> Message | list:
        """A checked request to run (its :class:`Message`), or the reply frames of one answered here: ``hello``,
        ``ping``, or an error (too large, not the protocol); those are counted in :attr:`stats`."""
        verb, protocol = "(invalid)", 1
        try:
            if size > self.max_message_bytes:
                raise ProtocolError(
                    ErrorCode.TOO_LARGE,
                    f"message: expected at most {self.max_message_bytes} bytes, received {size}",
                    None,
                    _peek_id(payload),
                )
            msg = parse_message(payload, self.requests, by_protocol=self.requests_by_protocol)
            verb, protocol = msg.type, msg.protocol
            if verb == "hello":
                body = self._hello(msg)
                out, error = encode_message(msg.id, verb, body, body["protocol"]), None
            elif verb == "ping":
                out, error = encode_message(msg.id, verb, {"time": time.time()}, protocol), None
            else:
                return msg
        except ProtocolError as e:
            out, error = error_frames(e, protocol), e.code.value
        except Exception as e:  # never let one request kill the server
            log.exception("%s: internal error on a %s request", self.name, verb)
            err = ProtocolError(ErrorCode.INTERNAL, f"{type(e).__name__}: {e}")
            out, error = error_frames(err, protocol), "internal"
        self.stats.record(verb, time.perf_counter() - t0, error)
        return out

    def _hello(self, msg: Message) -> dict[str, Any]:
        """The ``hello`` reply in the client's protocol (its body's ``protocol``)."""
        protocol = msg.body["protocol"]
        if protocol not in SUPPORTED_PROTOCOLS:
            older = ", ".join(str(p) for p in SUPPORTED_PROTOCOLS if p != PROTOCOL_VERSION)
            raise ProtocolError(
                ErrorCode.VERSION_MISMATCH,
                f"protocol: expected {PROTOCOL_VERSION} (this server), received {protocol} (client); this server "
                f"also speaks {older}; run the same policylink version on both sides",
                "body.protocol",
                msg.id,
            )
        reply = {"protocol": protocol, "kind": self.kind, "spec": self.spec_dict(), "server": self.name}
        if protocol > 1:
            reply.update(self.hello_extras())
        return reply

    def _run(self, msg: Message, t0: float, started: float) -> tuple[list, str | None]:
        """Call :meth:`handle` and encode its reply (in the request's protocol, with its timing: received at ``t0``,
        started at ``started``, ``time.perf_counter`` seconds); every failure becomes an error reply."""
        try:
            body = self.handle(msg.type, msg.body)
            timing = body.get("timing")
            if timing is not None:
                if msg.protocol < 2:
                    body = {k: v for k, v in body.items() if k != "timing"}
                else:
                    timing["queue_s"] = started - t0
                    timing["receive_to_reply_s"] = time.perf_counter() - t0
            return encode_message(msg.id, msg.type, body, msg.protocol, check_keys=self.user_maps_in_replies), None
        except ProtocolError as e:
            e.request_id = msg.id
            return error_frames(e, msg.protocol), e.code.value
        except CodecError as e:
            err = ProtocolError(self.failure_code, f"reply not encodable: {e}", None, msg.id)
        except Exception as e:
            log.exception("%s: %s failed", self.name, msg.type)
            err = ProtocolError(self.failure_code, f"{type(e).__name__}: {e}", None, msg.id)
        return error_frames(err, msg.protocol), err.code.value


def _peek_id(frames: list) -> int | None:
    """The request id of an otherwise rejected message, when its envelope (the first frame; a refused message's
    array frames may be missing) can be read."""
    try:
        rid = msgpack.unpackb(frames[0], ext_hook=lambda code, data: None)["id"]
    except Exception:
        return None
    return rid if type(rid) is int else None
