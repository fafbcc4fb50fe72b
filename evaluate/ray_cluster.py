"""Joining Ray for evaluation: a local single-node cluster bound to loopback, or an existing cluster by address.

A local cluster (``--ray_address local``) binds 127.0.0.1 only, as our ZeroMQ servers do by default. Ray itself
picks the machine's outward interface for a node started on Linux, even when asked for ``127.0.0.1``
(``ray._private.services.resolve_ip_for_localhost`` swaps a loopback address for that interface); it keeps a
node on loopback only where multi-node clusters are switched off, which ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``
does on any platform (Ray 2.x, ``ray._private.ray_constants.ENABLE_RAY_CLUSTER``). :func:`start_local` sets it
for the processes of the new cluster only and checks the result in ``ray.nodes()``. A real multi-machine
cluster is started with ``ray start`` (README, "Evaluation on a Ray cluster") and joined by its address.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

LOCAL = "local"  # --ray_address value that starts a single-node cluster here
LOOPBACK = "127.0.0.1"

# Ray reads these at import time (cluster switch) and when a node starts (usage stats); see the module docstring.
_LOCAL_ONLY_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0"}


class RayClusterError(RuntimeError):
    """A local Ray cluster came up on an address other than loopback (names the addresses received)."""


def connect(address: str, num_cpus: int | None = None) -> bool:
    """Make this process a Ray driver unless it already is one.

    Args:
        address: ``"local"`` starts a single-node cluster on 127.0.0.1 (:func:`start_local`); ``"auto"`` joins
            the cluster started on this machine with ``ray start``; ``"<host>:<port>"`` joins that head node
            (its GCS port, 6379 by default).
        num_cpus: CPUs of a local cluster (``None``: Ray counts them); ignored when joining a cluster.

    Returns:
        True when this call initialised Ray, False when Ray was already initialised (left as it is).

    Raises:
        ValueError: ``address`` is empty.
        ConnectionError: no cluster answers at ``address`` (raised by Ray).
        RayClusterError: a local cluster did not bind loopback.
    """
    import ray

    if not address:
        raise ValueError(f"ray_address: expected 'local', 'auto' or '<host>:<port>', received {address!r}")
    if ray.is_initialized():
        return False
    if address == LOCAL:
        start_local(num_cpus)
    else:
        ray.init(address=address, log_to_driver=False)
    return True


def start_local(num_cpus: int | None = None) -> None:
    """Start a single-node Ray cluster whose node, GCS and workers bind 127.0.0.1 only, and join it.

    No dashboard, no usage-stats report. The loopback switch is set for the cluster's processes (they inherit
    it) and restored in this process afterwards, so a later ``ray.init(address=...)`` here behaves as usual.

    Args:
        num_cpus: logical CPUs of the node (``None``: Ray counts them).

    Raises:
        RuntimeError: Ray is already initialised in this process (``ray.shutdown()`` first).
        RayClusterError: a node's address in ``ray.nodes()`` is not 127.0.0.1 (the cluster is shut down).
    """
    with _loopback_only():
        import ray

        if ray.is_initialized():
            raise RuntimeError("start_local: Ray is already initialised in this process; call ray.shutdown() first")
        ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=False, _node_ip_address=LOOPBACK)
    addresses = node_addresses()
    if addresses != [LOOPBACK]:
        ray.shutdown()
        raise RayClusterError(f"local Ray cluster: expected nodes at ['{LOOPBACK}'], received {addresses}")


def node_addresses() -> list[str]:
    """IP addresses of the live nodes of the cluster this process is connected to (``ray.nodes()``)."""
    import ray

    return [n["NodeManagerAddress"] for n in ray.nodes() if n.get("Alive", True)]


@contextmanager
def _loopback_only() -> Iterator[None]:
    """Set :data:`_LOCAL_ONLY_ENV` (and Ray's cluster switch, if Ray was imported before) for the block."""
    saved_env = {k: os.environ.get(k) for k in _LOCAL_ONLY_ENV}
    os.environ.update(_LOCAL_ONLY_ENV)
    from ray._private import ray_constants  # read the switch from the environment at import

    saved_switch = ray_constants.ENABLE_RAY_CLUSTER
    ray_constants.ENABLE_RAY_CLUSTER = False  # when Ray was imported before the environment was set
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = saved_switch
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
