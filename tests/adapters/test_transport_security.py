"""Who gets served: loopback by default, CURVE keys or --insecure elsewhere; CURVE refuses unknown clients."""

import logging

import numpy as np
import pytest

from policylink.adapters.schema import ActionSpec, FeatureSpec, PolicySpec
from policylink.adapters.security import InsecureBindError, KeyFileError, generate_keys, is_loopback
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
