"""Who gets served: loopback by default, CURVE keys or --insecure elsewhere; CURVE refuses unknown clients."""

import errno
import logging
import os
import stat

import numpy as np
import pytest

from policylink.adapters.rpc import BindError
from policylink.adapters.schema import ActionSpec, FeatureSpec, PolicySpec
from policylink.adapters.security import (
    EndpointError,
    InsecureBindError,
    KeyFileError,
    KeysExistError,
    check_endpoint,
    generate_keys,
    is_loopback,
)
from policylink.adapters.transport import PolicyServer, RemotePolicy

SPEC = PolicySpec(
    {"observation.state": FeatureSpec("float32", (1,))},
    ActionSpec(("x",), "joint_position", ("rad",), (-1.0,), (1.0,)),
    chunk_size=2,
)


class HalfPolicy:
    """Stateless PolicyAdapter: the chunk repeats half the latest state."""

    spec = SPEC

    def reset(self, env_ids=None):
        self._state = None

    def update_observation(self, obs):
        self._state = obs["observation.state"]

    def predict_action_chunk(self):
        return np.repeat(self._state[:, None] / 2, 2, axis=1).astype(np.float32)


@pytest.mark.parametrize(
    ("endpoint", "local"),
    [
        ("tcp://127.0.0.1:5555", True),
        ("tcp://localhost:1", True),
        ("tcp://[::1]:5", True),
        ("ipc:///tmp/x", True),
        ("tcp://0.0.0.0:5555", False),
        ("tcp://*:5555", False),
        ("tcp://10.0.0.7:5555", False),
    ],
)
def test_is_loopback(endpoint, local):
    assert is_loopback(endpoint) is local


def test_non_loopback_bind_needs_keys_or_insecure(caplog):
    with pytest.raises(InsecureBindError, match=r"'tcp://0.0.0.0:5555'.*--curve-keys DIR.*--insecure"):
        PolicyServer(HalfPolicy(), "tcp://0.0.0.0:5555")
    with caplog.at_level(logging.WARNING):
        PolicyServer(HalfPolicy(), "tcp://0.0.0.0:5555", insecure=True)  # constructed, never started
    assert "WITHOUT authentication" in caplog.text


def test_curve_serves_authorized_clients_only(tmp_path):
    keys = generate_keys(tmp_path / "keys")
    strangers = generate_keys(tmp_path / "strangers")  # knows the protocol, not authorized
    (strangers / "server.key").write_bytes((keys / "server.key").read_bytes())  # even knows the server key
    srv = PolicyServer(HalfPolicy(), "tcp://127.0.0.1:0", curve_keys=keys).start()  # CURVE forced on loopback
    try:
        remote = RemotePolicy(srv.endpoint, timeout_s=5, curve_keys=keys)
        remote.update_observation({"observation.state": np.array([[0.5]], np.float32)})
        np.testing.assert_array_equal(remote.predict_action_chunk(), [[[0.25], [0.25]]])
        remote.close()
        for creds in (strangers, None):
            with pytest.raises(TimeoutError, match="no reply to 'hello'.*CURVE key"):
                RemotePolicy(srv.endpoint, timeout_s=0.5, curve_keys=creds)
        assert "hello" in srv.stats.snapshot() and srv.stats.snapshot()["hello"]["count"] == 1
    finally:
        srv.stop()


def test_missing_key_files_are_named(tmp_path):
    with pytest.raises(KeyFileError, match="server.key_secret"):
        PolicyServer(HalfPolicy(), "tcp://127.0.0.1:0", curve_keys=tmp_path)
    with pytest.raises(KeyFileError, match="client.key_secret"):
        RemotePolicy("tcp://127.0.0.1:1", curve_keys=tmp_path)


@pytest.mark.parametrize(
    ("endpoint", "reason"),
    [
        ("tcp://127.0.0.1:99999", "(port '99999' is not in 1..65535; 0 or * picks a free port)"),
        ("tcp://127.0.0.1:-1", "(port '-1' is not in 1..65535; 0 or * picks a free port)"),
        ("127.0.0.1:5593", "(no scheme); did you mean 'tcp://127.0.0.1:5593'?"),
        ("udp://127.0.0.1:5593", "(unknown scheme 'udp')"),
        ("tcp://127.0.0.1", "(expected HOST:PORT after tcp://)"),
        ("tcp://:5593", "(expected HOST:PORT after tcp://)"),
    ],
)
def test_malformed_bind_addresses_are_refused_before_binding(endpoint, reason):
    expected = "tcp://HOST:PORT (PORT in 1..65535), ipc://PATH or inproc://NAME"
    message = f"bind: expected {expected}, received {endpoint!r} {reason}"
    with pytest.raises(EndpointError) as err:
        PolicyServer(HalfPolicy(), endpoint)
    assert str(err.value) == message and isinstance(err.value, ValueError)
    assert "reachable from other machines" not in str(err.value)


def test_valid_addresses_pass_unchanged():
    for endpoint in ("tcp://127.0.0.1:1", "tcp://*:65535", "tcp://[::1]:0", "tcp://localhost:*", "ipc:///tmp/p"):
        assert check_endpoint(endpoint) == endpoint
    assert check_endpoint("tcp://example.org:5555", "connect") == "tcp://example.org:5555"
    for endpoint in ("tcp://127.0.0.1:0", "tcp://*:5555"):  # a client needs a real port and host
        with pytest.raises(EndpointError, match="^connect: "):
            check_endpoint(endpoint, "connect")


def test_client_address_without_scheme_suggests_tcp():
    with pytest.raises(
        EndpointError,
        match=r"^connect: .*received '127.0.0.1:5599' \(no scheme\); did you mean "
        r"'tcp://127.0.0.1:5599'\?$",
    ):
        RemotePolicy("127.0.0.1:5599", timeout_s=0.5)


def test_port_in_use_is_a_one_line_os_error():
    first = PolicyServer(HalfPolicy(), "tcp://127.0.0.1:0").start()
    try:
        second = PolicyServer(HalfPolicy(), first.endpoint)
        with pytest.raises(BindError) as err:
            second.start()
        assert str(err.value) == f"bind {first.endpoint}: address already in use"
        assert isinstance(err.value, OSError) and err.value.errno == errno.EADDRINUSE
        assert second._ctx is None  # nothing left open
    finally:
        first.stop()


def test_generated_secret_keys_are_private_and_never_silently_replaced(tmp_path):
    out = tmp_path / "new" / "keys"
    generate_keys(out, ("robot",))
    mode = lambda p: stat.S_IMODE(os.stat(p).st_mode)  # noqa: E731
    assert mode(out / "server.key_secret") == 0o600 and mode(out / "robot.key_secret") == 0o600
    assert mode(out) == 0o700 and mode(out / "authorized_clients") == 0o700
    server_secret = (out / "server.key_secret").read_bytes()
    with pytest.raises(KeysExistError) as err:
        generate_keys(out, ("robot",))
    assert isinstance(err.value, FileExistsError) and "pass --force" in str(err.value)
    assert f"{out / 'server.key'}, {out / 'server.key_secret'}" in str(err.value)
    assert (out / "server.key_secret").read_bytes() == server_secret  # nothing written
    (out / "server.key_secret").chmod(0o644)  # a loose old file is re-created, not reused
    generate_keys(out, ("robot",), force=True)
    assert (out / "server.key_secret").read_bytes() != server_secret
    assert mode(out / "server.key_secret") == 0o600


def test_keys_for_a_new_client_go_next_to_existing_ones_only_with_force(tmp_path):
    generate_keys(tmp_path, ("a",))
    with pytest.raises(KeysExistError, match="server.key"):
        generate_keys(tmp_path, ("b",))  # would replace the server key that client a trusts
    with pytest.raises(ValueError, match="clients: expected names usable as file stems other than 'server'"):
        generate_keys(tmp_path / "x", ("server",))
