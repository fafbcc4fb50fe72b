"""``policylink serve``: serve one policy (a checkpoint folder, a registry name, or a served policy to relay) over
ZeroMQ, optionally also over openpi's and XPolicyLab's websocket protocols, or over one of those alone
(``--protocol``), with CURVE security (ZeroMQ) and periodic per-verb statistics.

    policylink serve --checkpoint outputs/push_diffusion --bind tcp://127.0.0.1:5555 --stats
    policylink serve --policy NAME --openpi-port 8000 --xpolicylab-port 19000
    policylink serve CHECKPOINT --protocol xpolicylab --port 19000       # only XPolicyLab's protocol
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
from typing import Any

from policylink.adapters import security
from policylink.adapters.config_checks import require_integers_within
from policylink.adapters.registry import unknown_name_message
from policylink.adapters.rpc import BindError
from policylink.adapters.transport import PolicyServer

log = logging.getLogger(__name__)
PROTOCOLS = ("zmq", "openpi", "xpolicylab")
PORT_FIELDS = ("port", "openpi_port", "xpolicylab_port")  # websocket ports: PORT_RANGE when given
PORT_RANGE = "[1, 65535]"
DEFAULT_PORTS = {"openpi": 8000, "xpolicylab": 19000}  # openpi's serve_policy.py, XPolicyLab's PolicyServerConfig


@dataclass
class ServeConfig:
    """Options of ``policylink serve``.

    Attributes:
        checkpoint: checkpoint folder, or ``lerobot:PATH`` for a LeRobot ``pretrained_model/`` folder (exclusive
            with ``policy``).
        policy: registry name built with ``policylink.adapters.registry.make_policy`` (exclusive with
            ``checkpoint``).
        device: torch device for ``checkpoint``: ``"auto"`` (CUDA when present), ``"cpu"`` or ``"cuda[:N]"``.
        cfg_scale: classifier-free guidance weight ``w`` of a checkpoint trained with advantage conditioning (0 =
            unconditional, 1 = conditional, > 1 guided); None = the checkpoint's own ``policy.cfg_scale``.
        bind: ZeroMQ endpoint ``tcp://HOST:PORT`` (PORT in 1..65535, or 0 for a free one) or ``ipc://PATH``;
            anything but loopback needs ``curve_keys`` or ``insecure``.
        protocol: ``"zmq"`` (ZeroMQ on ``bind``, plus the websocket ports given), or ``"openpi"`` /
            ``"xpolicylab"``: only that websocket protocol, on ``port``.
        port: the websocket port of ``protocol`` openpi (default 8000) or xpolicylab (default 19000).
        openpi_port: also serve openpi clients on this websocket port (None = off).
        openpi_host: websocket host (loopback by default; other hosts need ``insecure``).
        xpolicylab_port: also serve XPolicyLab clients (its evaluator, inspect-robots-xpolicylab) on this websocket
            port (None = off).
        xpolicylab_host: its host (loopback by default; other hosts need ``insecure``: the protocol has no
            authentication).
        xpolicylab_cameras: XPolicyLab (Observation Format v1.0) camera slot -> our camera, e.g.
            ``cam_head:front,cam_wrist:wrist``; None = derived from the policy's spec
            (:meth:`policylink.adapters.xpolicylab_keymap.KeyMap.for_spec`).
        xpolicylab_state: the v1.0 state keys with their lengths that, concatenated in order, are our
            ``observation.state``, e.g. ``arm_joint_state:6,ee_joint_state:1``; None = derived from the spec.
        xpolicylab_action: the v1.0 action keys with their lengths that, concatenated in order, are our action
            vector, e.g. ``arm_joint_state:6,ee_joint_state:1``; None = derived from the spec.
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
    protocol: str = "zmq"
    port: int | None = None
    openpi_port: int | None = None
    openpi_host: str = "127.0.0.1"
    xpolicylab_port: int | None = None
    xpolicylab_host: str = "127.0.0.1"
    xpolicylab_cameras: str | None = None
    xpolicylab_state: str | None = None
    xpolicylab_action: str | None = None
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
            ``insecure``, unreadable keys (each message names the address or the file); an unknown ``protocol`` or a
            ``port`` without a websocket ``protocol``, a websocket port outside ``PORT_RANGE`` (EndpointError naming
            the field, the expected and the received value; an unknown protocol names the closest one).
    """
    if cfg.protocol not in PROTOCOLS:
        raise security.EndpointError(unknown_name_message("protocol", cfg.protocol, PROTOCOLS))
    ports = {name: PORT_RANGE for name in PORT_FIELDS if getattr(cfg, name) is not None}
    try:
        require_integers_within(cfg, **ports)  # before any address is formed or bound
    except ValueError as e:
        raise security.EndpointError(str(e)) from None
    if cfg.protocol == "zmq" and cfg.port is not None:
        raise security.EndpointError(
            f"port: applies to --protocol openpi or xpolicylab, received --port {cfg.port} with --protocol zmq "
            "(ZeroMQ listens on --bind; add a websocket endpoint with --openpi-port / --xpolicylab-port)"
        )
    _check_single_protocol_ports(cfg)
    keys = security.load_server_keys(cfg.curve_keys) if cfg.curve_keys else None
    if cfg.protocol == "zmq":
        security.check_bind(cfg.bind, keys, cfg.insecure)
    for name, host, port in websocket_endpoints(cfg):
        try:
            security.check_bind(f"tcp://{host}:{port}", None, cfg.insecure)
        except security.InsecureBindError:
            raise security.InsecureBindError(
                f"{name} bind: ws://{host}:{port} is reachable from other machines and the {name} protocol has no "
                f"authentication or encryption; expected host 127.0.0.1 (default) or an explicit --insecure"
            ) from None
    return keys


def _check_single_protocol_ports(cfg: ServeConfig) -> None:
    """With ``--protocol openpi|xpolicylab`` only that protocol is served, on one port: an extra-endpoint port of the
    other protocol, or its own extra port disagreeing with ``--port``, would be silently ignored, so it is an
    EndpointError naming the flag, the expected and the received value."""
    if cfg.protocol == "zmq":
        return
    for name in ("openpi", "xpolicylab"):
        extra = getattr(cfg, f"{name}_port")
        if extra is None:
            continue
        if name != cfg.protocol:
            raise security.EndpointError(
                f"{name}_port: applies beside ZeroMQ (--protocol zmq) or with --protocol {name}, received "
                f"--{name}-port {extra} with --protocol {cfg.protocol} (which serves only {cfg.protocol}, on --port)"
            )
        if cfg.port is not None and cfg.port != extra:
            raise security.EndpointError(
                f"{name}_port: expected the same port as --port {cfg.port} (or only one of them) with --protocol "
                f"{name}, received --{name}-port {extra}"
            )


def websocket_endpoints(cfg: ServeConfig) -> list[tuple[str, str, int]]:
    """``(protocol, host, port)`` of each websocket endpoint ``cfg`` asks for (``--protocol`` or extra ports)."""
    if cfg.protocol != "zmq":
        host = cfg.openpi_host if cfg.protocol == "openpi" else cfg.xpolicylab_host
        extra = cfg.openpi_port if cfg.protocol == "openpi" else cfg.xpolicylab_port
        port = next(p for p in (cfg.port, extra, DEFAULT_PORTS[cfg.protocol]) if p is not None)
        return [(cfg.protocol, host, port)]
    wanted = (("openpi", cfg.openpi_host, cfg.openpi_port), ("xpolicylab", cfg.xpolicylab_host, cfg.xpolicylab_port))
    return [(name, host, port) for name, host, port in wanted if port is not None]


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
    server = None
    if cfg.protocol == "zmq":
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
    endpoints: list[tuple[str, Any]] = [] if server is None else [(server.endpoint, server)]
    try:
        endpoints += _start_websockets(cfg, policy, server.lock if server is not None else threading.Lock())
    except OSError as e:
        if server is not None:
            server.stop()
        print(f"policylink serve: {e}", file=sys.stderr)
        return 2
    print(
        f"serving {cfg.checkpoint or cfg.policy} on "
        + " and ".join(where for where, _ in endpoints)
        + (f" (CURVE, keys {cfg.curve_keys})" if keys else "")
        + (f"; capabilities: {', '.join(server.capabilities) or 'none'}" if server is not None else ""),
        flush=True,
    )
    try:
        _wait(cfg, server)
    finally:
        for _, running in reversed(endpoints):
            running.stop()
        if cfg.stats and server is not None:
            print(f"final statistics:\n{server.stats.format()}", flush=True)
    return 0


def _start_websockets(cfg: ServeConfig, policy: Any, lock: threading.Lock) -> list[tuple[str, Any]]:
    """Start each websocket endpoint of :func:`websocket_endpoints` (stopping those started when one fails); returns
    ``(description, server)`` pairs, e.g. ``("XPolicyLab ws://127.0.0.1:19000", XPolicyLabServer)``.

    Raises:
        OSError: a port is taken (the message names the protocol and address).
    """
    from policylink.adapters.openpi import OpenPIServer
    from policylink.adapters.xpolicylab import XPolicyLabServer
    from policylink.adapters.xpolicylab_keymap import KeyMap

    started: list[tuple[str, Any]] = []
    for name, host, port in websocket_endpoints(cfg):
        if name == "openpi":
            ep = OpenPIServer(policy, host, port, lock=lock, insecure=cfg.insecure)
        else:
            key_map = KeyMap.for_spec(policy.spec, cfg.xpolicylab_cameras, cfg.xpolicylab_state, cfg.xpolicylab_action)
            ep = XPolicyLabServer(policy, host, port, key_map=key_map, lock=lock, insecure=cfg.insecure)
            if not security.is_loopback(f"tcp://{host}:{port}"):
                print(
                    f"warning: ws://{host}:{port} speaks XPolicyLab's protocol, which has no authentication or "
                    "encryption: anyone who can reach it can run the policy on any observation (infer), reset it "
                    "and read its spec (hello)",
                    file=sys.stderr,
                )
        try:
            started.append((f"{'openpi' if name == 'openpi' else 'XPolicyLab'} {ep.start().url}", ep))
        except OSError as e:
            for _, running in started:
                running.stop()
            raise OSError(f"{name} bind ws://{host}:{port}: {e}") from None
    return started


def _load(cfg: ServeConfig):
    from policylink.policies import load_policy

    if cfg.checkpoint is not None:  # a folder, or kind:folder (lerobot:PATH), resolved as policylink eval/run do
        return load_policy(cfg.checkpoint, device=cfg.device, cfg_scale=cfg.cfg_scale)
    if cfg.cfg_scale is not None:
        raise ValueError(f"cfg_scale: applies to --checkpoint, received it with --policy {cfg.policy!r}")
    from policylink.adapters.registry import make_policy

    return make_policy(cfg.policy)


def _wait(cfg: ServeConfig, server: PolicyServer | None) -> None:
    """Block until Ctrl-C, SIGTERM or ``duration_s``; print statistics every ``stats_interval_s`` with ``stats``
    (ZeroMQ's; none without ``server``)."""
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
            if cfg.stats and server is not None and now >= next_stats:
                print(server.stats.format(), flush=True)
                next_stats = now + cfg.stats_interval_s
            wake = min(t for t in (deadline, next_stats if cfg.stats else None, now + 1.0) if t is not None)
            stop.wait(max(0.0, wake - now))
    except KeyboardInterrupt:
        return
