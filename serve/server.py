"""``policylink serve``: serve one policy (a checkpoint folder or a registry name) over ZeroMQ, optionally also
over openpi's websocket protocol, with CURVE security and periodic per-verb statistics.

    policylink serve --checkpoint outputs/push_diffusion --bind tcp://127.0.0.1:5555 --stats
    policylink serve --policy NAME --openpi-port 8000
    policylink serve --checkpoint DIR --bind tcp://0.0.0.0:5555 --curve-keys keys/   # see 'policylink keys'

Dashed flags (``--openpi-port``) and the field names (``--openpi_port``) are both accepted; ``--stats`` and
``--insecure`` may be given without a value.
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
import time
from dataclasses import dataclass

from policylink.adapters import security
from policylink.adapters.rpc import BindError
from policylink.adapters.transport import PolicyServer

log = logging.getLogger(__name__)


@dataclass
class ServeConfig:
    """Options of ``policylink serve``.

    Attributes:
        checkpoint: checkpoint folder, or ``lerobot:PATH`` for a LeRobot ``pretrained_model/`` folder (exclusive
            with ``policy``).
        policy: registry name built with ``policylink.adapters.registry.make_policy`` (exclusive with
            ``checkpoint``).
        device: torch device for ``checkpoint`` (``"auto"``, ``"cpu"``, ``"cuda"``).
        cfg_scale: classifier-free guidance weight ``w`` of a checkpoint trained with advantage conditioning (0 =
            unconditional, 1 = conditional, > 1 guided); None = the checkpoint's own ``policy.cfg_scale``.
        bind: ZeroMQ endpoint ``tcp://HOST:PORT`` (PORT in 1..65535, or 0 for a free one) or ``ipc://PATH``;
            anything but loopback needs ``curve_keys`` or ``insecure``.
        openpi_port: also serve openpi clients on this websocket port (None = off).
        openpi_host: websocket host (loopback by default; other hosts need ``insecure``).
        stats: print per-verb count / errors / p50 / p99 latency every ``stats_interval_s`` and on exit.
        stats_interval_s: seconds between statistics prints.
        curve_keys: CURVE key folder from ``policylink keys generate`` (server key + authorized clients).
        insecure: allow a non-loopback bind without authentication or encryption (logs a warning).
        max_message_mb: requests over this many MiB get a ``too_large`` error reply.
        duration_s: stop after this many seconds (None = until Ctrl-C / SIGTERM).
    """

    checkpoint: str | None = None
    policy: str | None = None
    device: str = "auto"
    cfg_scale: float | None = None
    bind: str = "tcp://127.0.0.1:5555"
    openpi_port: int | None = None
    openpi_host: str = "127.0.0.1"
    stats: bool = False
    stats_interval_s: float = 30.0
    curve_keys: str | None = None
    insecure: bool = False
    max_message_mb: float = 256.0
    duration_s: float | None = None


def check_binds(cfg: ServeConfig) -> security.ServerKeys | None:
    """The server's CURVE keys (None without ``curve_keys``) after checking every bind address against them.

    Raises:
        EndpointError, InsecureBindError, KeyFileError: a malformed address, a non-loopback bind without keys or
            ``insecure``, unreadable keys (each message names the address or the file).
    """
    keys = security.load_server_keys(cfg.curve_keys) if cfg.curve_keys else None
    security.check_bind(cfg.bind, keys, cfg.insecure)
    if cfg.openpi_port is not None:
        security.check_bind(f"tcp://{cfg.openpi_host}:{cfg.openpi_port}", None, cfg.insecure)
    return keys


def serve(cfg: ServeConfig) -> int:
    """Serve ``cfg.checkpoint`` (or the registry policy ``cfg.policy``) until interrupted or ``duration_s``; returns
    the exit code (2 for a bad configuration: a malformed ``--bind``, an unsafe bind, missing keys, a port already
    in use; the reason is printed as one line on stderr)."""
    try:
        keys = check_binds(cfg)
    except (security.EndpointError, security.InsecureBindError, security.KeyFileError) as e:
        print(f"policylink serve: {e}", file=sys.stderr)
        return 2
    policy = _load(cfg)
    try:
        server = PolicyServer(
            policy,
            cfg.bind,
            curve_keys=keys,
            insecure=cfg.insecure,
            max_message_bytes=int(cfg.max_message_mb * 2**20),
            name=f"policylink-serve:{cfg.checkpoint or cfg.policy}",
        ).start()
    except BindError as e:
        print(f"policylink serve: {e}", file=sys.stderr)
        return 2
    openpi = None
    if cfg.openpi_port is not None:
        from policylink.adapters.openpi import OpenPIServer

        try:
            openpi = OpenPIServer(
                policy, cfg.openpi_host, cfg.openpi_port, lock=server.lock, insecure=cfg.insecure
            ).start()
        except OSError as e:
            server.stop()
            print(f"policylink serve: openpi bind ws://{cfg.openpi_host}:{cfg.openpi_port}: {e}", file=sys.stderr)
            return 2
    print(
        f"serving {cfg.checkpoint or cfg.policy} on {server.endpoint}"
        + (f" (CURVE, keys {cfg.curve_keys})" if keys else "")
        + (f" and openpi ws://{cfg.openpi_host}:{openpi.port}" if openpi else "")
        + f"; capabilities: {', '.join(server.capabilities) or 'none'}",
        flush=True,
    )
    try:
        _wait(cfg, server)
    finally:
        if openpi is not None:
            openpi.stop()
        server.stop()
        if cfg.stats:
            print(f"final statistics:\n{server.stats.format()}", flush=True)
    return 0


def _load(cfg: ServeConfig):
    from policylink.policies import load_policy

    if cfg.checkpoint is not None:  # a folder, or kind:folder (lerobot:PATH), resolved as policylink eval/run do
        return load_policy(cfg.checkpoint, device=cfg.device, cfg_scale=cfg.cfg_scale)
    if cfg.cfg_scale is not None:
        raise ValueError(f"cfg_scale: applies to --checkpoint, received it with --policy {cfg.policy!r}")
    from policylink.adapters.registry import make_policy

    return make_policy(cfg.policy)


def _wait(cfg: ServeConfig, server: PolicyServer) -> None:
    """Block until Ctrl-C, SIGTERM or ``duration_s``; print statistics every ``stats_interval_s`` with ``stats``."""
    stop = threading.Event()
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
    deadline = None if cfg.duration_s is None else time.monotonic() + cfg.duration_s
    next_stats = time.monotonic() + cfg.stats_interval_s
    try:
        while not stop.is_set():
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                return
            if cfg.stats and now >= next_stats:
                print(server.stats.format(), flush=True)
                next_stats = now + cfg.stats_interval_s
            wake = min(t for t in (deadline, next_stats if cfg.stats else None, now + 1.0) if t is not None)
            stop.wait(max(0.0, wake - now))
    except KeyboardInterrupt:
        return
