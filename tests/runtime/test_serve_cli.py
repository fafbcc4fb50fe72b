"""``policylink serve`` and ``policylink keys``: a registry policy served over ZMQ and openpi, statistics on exit,
checkpoints through ``load_policy``, refusal of unsafe binds, key generation."""

import socket
import threading
import time

import numpy as np
import pytest

from policylink.adapters import registry
from policylink.adapters.schema import ActionSpec, FeatureSpec, PolicySpec
from policylink.adapters.transport import RemotePolicy
from policylink.cli import keys
from policylink.cli import serve as serve_cli

# openpi-client 0.1.2 opens its websocket the pre-websockets-17 way; that warning is theirs, not ours.
pytestmark = pytest.mark.filterwarnings("ignore:connect\\(\\) must be used as a context manager:DeprecationWarning")

SPEC = PolicySpec(
    {"observation.state": FeatureSpec("float32", (1,))},
    ActionSpec(("x",), "joint_position", ("rad",), (-10.0,), (10.0,)),
    chunk_size=2,
)


class DoublePolicy:
    """Stateless PolicyAdapter: chunk = [2 * state, 2 * state]."""

    spec = SPEC

    def __init__(self, **kwargs):
        self.kwargs, self._state = kwargs, None

    def reset(self, env_ids=None):
        pass

    def update_observation(self, obs):
        self._state = obs["observation.state"]

    def predict_action_chunk(self):
        return np.repeat(2 * self._state[:, None], 2, axis=1).astype(np.float32)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve_in_thread(argv):
    result = {}
    t = threading.Thread(target=lambda: result.setdefault("rc", serve_cli.main(argv)), daemon=True)
    t.start()
    return t, result


def test_normalise_flags():
    assert serve_cli.normalise_flags(["--openpi-port", "8000", "--stats", "--insecure", "--bind=tcp://x:1"]) == [
        "--openpi_port",
        "8000",
        "--stats=true",
        "--insecure=true",
        "--bind=tcp://x:1",
    ]
    assert serve_cli.normalise_flags(["--stats", "false"]) == ["--stats", "false"]


def test_serve_a_registry_policy_over_zmq_and_openpi_with_stats(capsys):
    registry.register_policy("serve-cli-double", DoublePolicy, overwrite=True)
    port, ws_port = _free_port(), _free_port()
    t, result = _serve_in_thread(
        [
            "--policy",
            "serve-cli-double",
            "--bind",
            f"tcp://127.0.0.1:{port}",
            "--openpi-port",
            str(ws_port),
            "--stats",
            "--stats_interval_s",
            "0.3",
            "--duration_s",
            "3",
        ]
    )
    remote = RemotePolicy(f"tcp://127.0.0.1:{port}", timeout_s=5)
    for v in (1.0, 2.5):
        remote.update_observation({"observation.state": np.array([[v]], np.float32)})
        np.testing.assert_array_equal(remote.predict_action_chunk(), [[[2 * v], [2 * v]]])
    from openpi_client.websocket_client_policy import WebsocketClientPolicy

    for _ in range(50):  # the websocket endpoint starts right after the ZMQ one
        try:
            client = WebsocketClientPolicy("127.0.0.1", ws_port)
            break
        except OSError:
            time.sleep(0.05)
    np.testing.assert_array_equal(
        client.infer({"observation/state": np.array([3.0], np.float32)})["actions"], [[6.0], [6.0]]
    )
    remote.close()
    t.join(15)
    assert result["rc"] == 0
    out = capsys.readouterr().out
    assert f"on tcp://127.0.0.1:{port}" in out and f"openpi ws://127.0.0.1:{ws_port}" in out
    assert "; capabilities: none" in out  # DoublePolicy offers no RTC prefix and no embedding
    final = out.split("final statistics:")[1]
    rows = {line.split()[0]: line.split()[1:3] for line in final.strip().splitlines()[1:]}
    assert rows["infer"] == ["2", "0"] and rows["hello"] == ["1", "0"]
    assert out.count("verb") >= 2  # at least one periodic print before the final one


def test_serve_checkpoint_goes_through_load_policy(monkeypatch, tmp_path):
    import policylink.policies

    calls = []
    monkeypatch.setattr(
        policylink.policies,
        "load_policy",
        lambda path, device="auto", cfg_scale=None: calls.append((path, device, cfg_scale)) or DoublePolicy(),
    )
    port = _free_port()
    t, result = _serve_in_thread(
        [
            "--checkpoint",
            str(tmp_path),
            "--device",
            "cpu",
            "--bind",
            f"tcp://127.0.0.1:{port}",
            "--duration_s",
            "2",
            "--cfg_scale",
            "1.5",
        ]  # fmt: skip
    )
    remote = RemotePolicy(f"tcp://127.0.0.1:{port}", timeout_s=5)
    assert remote.spec == SPEC
    remote.close()
    t.join(10)
    assert result["rc"] == 0 and calls == [(str(tmp_path), "cpu", 1.5)]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "expected exactly one of --checkpoint DIR or --policy NAME"),
        (["--policy", "a", "--checkpoint", "b"], "expected exactly one"),
        (["--policy", "a", "--bind", "tcp://0.0.0.0:5555"], "--insecure"),
        (["--policy", "a", "--openpi-port", "8000", "--openpi_host", "0.0.0.0"], "--insecure"),
        (["--policy", "a", "--bind", "tcp://0.0.0.0:5555", "--curve-keys", "/nonexistent"], "server.key_secret"),
        (["--policy", "a", "--bind", "tcp://127.0.0.1:99999"], "(port '99999' is not in 1..65535"),
        (["--policy", "a", "--bind", "127.0.0.1:5593"], "(no scheme); did you mean 'tcp://127.0.0.1:5593'?"),
        (["--policy", "a", "--openpi-port", "70000"], "openpi_port: expected an integer in [1, 65535], received 70000"),
        (["--policy", "a", "--xpolicylab-port", "0"], "xpolicylab_port: expected an integer in [1, 65535], received 0"),
        (
            ["--policy", "a", "--protocol", "openpi", "--port", "70000"],
            "port: expected an integer in [1, 65535], received",
        ),
        (
            ["--policy", "a", "--protocol", "openpi", "--port", "8001", "--openpi-port", "8000"],
            "openpi_port: expected the same port as --port 8001 (or only one of them) with --protocol openpi, "
            "received --openpi-port 8000",
        ),
        (
            ["--policy", "a", "--protocol", "openpi", "--xpolicylab-port", "19000"],
            "xpolicylab_port: applies beside ZeroMQ (--protocol zmq) or with --protocol xpolicylab, received "
            "--xpolicylab-port 19000 with --protocol openpi",
        ),
        (
            ["--policy", "a", "--protocol", "zmqq"],
            "protocol: expected one of ['zmq', 'openpi', 'xpolicylab'], received 'zmqq'; did you mean 'zmq'?",
        ),
    ],
)
def test_bad_configurations_exit_2_with_a_reason(argv, message, capsys):
    assert serve_cli.main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    if "99999" in message or "no scheme" in message:
        assert "reachable from other machines" not in err  # a malformed address is not an unsafe one


def test_serve_on_a_port_in_use_exits_2_with_one_line(capsys):
    registry.register_policy("serve-cli-double", DoublePolicy, overwrite=True)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert serve_cli.main(["--policy", "serve-cli-double", "--bind", f"tcp://127.0.0.1:{port}"]) == 2
    assert capsys.readouterr().err == f"policylink serve: bind tcp://127.0.0.1:{port}: address already in use\n"


def test_keys_generate_writes_server_and_client_pairs(tmp_path, capsys):
    assert keys.main(["generate", "--out", str(tmp_path / "k"), "--clients", "robot1,robot2"]) == 0
    names = sorted(p.name for p in (tmp_path / "k").iterdir())
    assert names == [
        "authorized_clients",
        "robot1.key",
        "robot1.key_secret",
        "robot2.key",
        "robot2.key_secret",
        "server.key",
        "server.key_secret",
    ]
    assert sorted(p.name for p in (tmp_path / "k" / "authorized_clients").iterdir()) == ["robot1.key", "robot2.key"]
    assert keys.main(["rotate"]) == 2
    assert "policylink keys: action: expected one of ['generate'], received 'rotate'\n" in capsys.readouterr().err
    assert keys.main(["generat"]) == 2
    assert "received 'generat'; did you mean 'generate'?\n" in capsys.readouterr().err


def test_keys_generate_refuses_to_overwrite_without_force(tmp_path):
    out = tmp_path / "k"
    assert keys.main(["generate", "--out", str(out)]) == 0
    assert oct(out.stat().st_mode & 0o777) == "0o700"
    assert oct((out / "client.key_secret").stat().st_mode & 0o777) == "0o600"
    secret = (out / "server.key_secret").read_bytes()
    with pytest.raises(FileExistsError, match=r"pass --force to overwrite or choose another --out$"):
        keys.main(["generate", "--out", str(out)])
    assert (out / "server.key_secret").read_bytes() == secret
    assert keys.main(["generate", "--out", str(out), "--force"]) == 0
    assert (out / "server.key_secret").read_bytes() != secret
    assert oct((out / "server.key_secret").stat().st_mode & 0o777) == "0o600"
