"""Fixtures shared by every test folder."""

from __future__ import annotations

import pytest


@pytest.fixture
def served():
    """Factory ``served(policy, timeout_s=60.0) -> RemotePolicy``: ``policy`` behind a
    :class:`~policylink.adapters.transport.PolicyServer` on a free loopback tcp port and a client to it; every
    client and server started this way is closed at teardown (also when the test fails)."""
    from policylink.adapters.transport import PolicyServer, RemotePolicy

    opened = []

    def start(policy, timeout_s: float = 60.0):
        server = PolicyServer(policy, "tcp://127.0.0.1:0").start()
        opened.append((server, None))
        remote = RemotePolicy(server.endpoint, timeout_s=timeout_s)
        opened[-1] = (server, remote)
        return remote

    yield start
    for server, remote in reversed(opened):
        try:
            if remote is not None:
                remote.close()
        finally:
            server.stop()
