"""The websocket plumbing of our foreign-protocol endpoints (openpi, XPolicyLab), both ends: an asyncio
``websockets`` server on a background thread, loopback by default, with ``GET /healthz``
(:class:`WebsocketServer`; subclasses implement ``_handler``, one coroutine per connection), and a blocking client
connection (:func:`connect`). ``websockets`` is imported lazily.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
from typing import Any

from policylink.adapters.security import check_bind


class WebsocketServer:
    """A websocket listener on its own thread and event loop.

    Args:
        host, port: where to listen; ``port=0`` picks a free port (see :attr:`port` after :meth:`start`).
        insecure: allow a non-loopback ``host`` (websocket endpoints have no CURVE; logs a warning naming what is
            exposed).
        max_message_bytes: larger messages close the connection (websockets ``max_size``; None = no limit).
        name: thread name and the label of messages.

    Raises:
        InsecureBindError: non-loopback ``host`` without ``insecure``.
    """

    def __init__(
        self,
        host: str,
        port: int,
        *,
        insecure: bool = False,
        max_message_bytes: int | None = 256 * 2**20,
        name: str = "websocket-server",
    ):
        check_bind(f"tcp://{host}:{port}", None, insecure)
        self.host, self.port, self.name = host, port, name
        self.max_message_bytes = max_message_bytes
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stopped: asyncio.Event | None = None

    @property
    def url(self) -> str:
        """``ws://host:port`` (the bound port once started)."""
        return f"ws://{self.host}:{self.port}"

    def start(self, timeout_s: float = 10.0) -> WebsocketServer:
        """Listen on a background thread; returns ``self`` once listening.

        Raises:
            OSError: the port is taken.
            TimeoutError: not listening after ``timeout_s`` seconds.
        """
        ready, failure = threading.Event(), []
        self._thread = threading.Thread(target=self._run, args=(ready, failure), daemon=True, name=self.name)
        self._thread.start()
        if not ready.wait(timeout_s):
            raise TimeoutError(f"{self.name} on {self.host}:{self.port}: not listening after {timeout_s} s")
        if failure:
            raise failure[0]
        return self

    def stop(self) -> None:
        """Close the listener and every connection."""
        if self._loop is not None and self._stopped is not None:
            self._loop.call_soon_threadsafe(self._stopped.set)
        if self._thread is not None:
            self._thread.join(timeout=10.0)
        self._thread = None

    def __enter__(self) -> WebsocketServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    async def _handler(self, ws: Any) -> None:
        """Serve one connection until it closes."""
        raise NotImplementedError

    def _run(self, ready: threading.Event, failure: list) -> None:
        asyncio.run(self._main(ready, failure))

    async def _main(self, ready: threading.Event, failure: list) -> None:
        import websockets.asyncio.server as ws_server

        self._loop, self._stopped = asyncio.get_running_loop(), asyncio.Event()
        try:
            server = await ws_server.serve(
                self._handler,
                self.host,
                self.port,
                compression=None,
                max_size=self.max_message_bytes,
                process_request=_health_check,
            )
        except OSError as e:
            failure.append(e)
            ready.set()
            return
        self.port = server.sockets[0].getsockname()[1]
        ready.set()
        async with server:
            await self._stopped.wait()


def connect(uri: str, timeout_s: float, headers: dict[str, str] | None = None) -> Any:
    """A blocking ``websockets.sync`` client connection to ``uri`` (no compression, no size limit, no proxy).

    Raises:
        TimeoutError: no websocket handshake within ``timeout_s`` seconds.
        OSError: nothing listens there (connection refused, unknown host).
        websockets.InvalidHandshake: the peer is not a websocket server.
    """
    import websockets.sync.client

    # websockets >= 17 wants connect() as a context manager unless legacy=True; the connection outlives
    # this call, so ask for the direct form where the option exists.
    extra = {"legacy": True} if "legacy" in inspect.signature(websockets.sync.client.connect).parameters else {}
    return websockets.sync.client.connect(
        uri,
        compression=None,
        max_size=None,
        open_timeout=timeout_s,
        additional_headers=headers,
        proxy=None,
        **extra,
    )


def _health_check(connection: Any, request: Any) -> Any:
    import http

    if request.path == "/healthz":
        return connection.respond(http.HTTPStatus.OK, "OK\n")
    return None


__all__ = ["WebsocketServer", "connect"]
