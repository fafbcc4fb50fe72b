"""A local Ray cluster (``--ray_address local``) binds 127.0.0.1 only, as our servers do; joining leaves Ray as is."""

import os
import socket

import pytest

from policylink.evaluate.ray_cluster import LOOPBACK, connect, node_addresses

pytestmark = [pytest.mark.ray, pytest.mark.slow]


@pytest.fixture
def ray():
    ray = pytest.importorskip("ray")
    assert not ray.is_initialized()
    yield ray
    ray.shutdown()


def _outward_address() -> str | None:
    """This machine's address on its default route (no packet is sent), or None without one."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("203.0.113.1", 9))  # TEST-NET-3: only the routing table is consulted
        except OSError:
            return None
        address = s.getsockname()[0]
    return None if address.startswith("127.") else address


def test_local_cluster_binds_loopback_only(ray):
    from ray._private import ray_constants

    switch = ray_constants.ENABLE_RAY_CLUSTER
    env = os.environ.get("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER")
    assert connect("local", num_cpus=1) is True
    assert connect("local", num_cpus=1) is False  # already a driver: left as it is

    nodes = ray.nodes()
    assert [n["NodeManagerAddress"] for n in nodes] == ["127.0.0.1"] == node_addresses()
    gcs_host, gcs_port = ray.get_runtime_context().gcs_address.rsplit(":", 1)
    assert gcs_host == LOOPBACK

    @ray.remote(num_cpus=1)
    def node_ip():
        import ray

        return ray.util.get_node_ip_address()

    assert ray.get(node_ip.remote()) == "127.0.0.1"  # workers too
    outward = _outward_address()
    if outward is not None:  # nothing of the node answers on the machine's network address
        ports = [int(gcs_port), nodes[0]["NodeManagerPort"], nodes[0]["ObjectManagerPort"]]
        for port in ports:
            with pytest.raises(ConnectionRefusedError):
                socket.create_connection((outward, port), timeout=2).close()
    # the loopback switch was for the new cluster only: this process is as before
    assert ray_constants.ENABLE_RAY_CLUSTER is switch
    assert os.environ.get("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER") == env


def test_address_must_be_named(ray):
    with pytest.raises(ValueError, match=r"ray_address: expected 'local', 'auto' or '<host>:<port>', received ''"):
        connect("")
    assert not ray.is_initialized()
