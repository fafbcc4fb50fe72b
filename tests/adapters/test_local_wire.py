"""The wire over a ``unix://`` socket (adapters.local_wire): framing, errors, timeouts, a dead server, refusals."""

import os
import socket
import threading
import time

import numpy as np
import pytest

from policylink.adapters.codec import decode, encode
from policylink.adapters.env_transport import EnvServer, RemoteEnv
from policylink.adapters.local_wire import LocalChannel, MessageReader, check_local_endpoint, send_frames
from policylink.adapters.protocol import ENV_REPLIES, RemoteError, VersionMismatchError
from policylink.adapters.rpc import BindError

from .test_transport_env import PointEnv


def _never() -> bool:
    return False


def test_frames_round_trip_exactly_and_each_message_owns_its_buffer():
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with a, b:
        big = np.arange(300_000, dtype=np.float32).reshape(600, 500)  # 1.2 MB: more than one socket buffer
        small = {"x": np.array([1.5, -2.0], np.float32), "task": "reach"}
        sender = threading.Thread(target=lambda: [send_frames(a, encode(m)) for m in (small, {"big": big}, small)])
        sender.start()
        reader = MessageReader(max_bytes=2**30)
        first, size = reader.read(b, _never)
        assert size == sum(map(len, first))
        one = decode(first)
        two = decode(reader.read(b, _never)[0])
        three = decode(reader.read(b, _never)[0])
        sender.join()
    np.testing.assert_array_equal(one["x"], [1.5, -2.0])
    assert one["task"] == "reach" and one["x"].dtype == np.float32
    np.testing.assert_array_equal(two["big"], big)
    one["x"][0] = 7.0  # writable, and not shared with the next message's buffer
    np.testing.assert_array_equal(three["x"], [1.5, -2.0])
    assert reader.buffered == 0


def test_oversized_message_is_dropped_keeping_its_envelope_and_the_stream_in_step():
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with a, b:
        frames = encode({"id": 3, "blob": np.zeros(100_000, np.uint8)})
        t = threading.Thread(target=lambda: [send_frames(a, frames), send_frames(a, encode({"id": 4}))])
        t.start()
        reader = MessageReader(max_bytes=50_000)
        kept, size = reader.read(b, _never)
        assert size == 100_000 + len(frames[0]) and len(kept) == 1  # the envelope only
        assert decode(reader.read(b, _never)[0]) == {"id": 4}
        t.join()


def test_broken_framing_and_closed_peer_are_connection_errors():
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with a, b:
        a.sendall(b"\x00\x00\x00\x00")  # a message of zero frames
        with pytest.raises(ConnectionError, match=r"expected 1\.\.4096 frames, received 0"):
            MessageReader(2**20).read(b, _never)
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with b:
        a.close()
        with pytest.raises(ConnectionError, match="closed the connection"):
            MessageReader(2**20).read(b, _never)


def test_endpoint_and_key_refusals_name_the_field(tmp_path):
    with pytest.raises(ValueError, match=r"endpoint: expected 'unix://PATH'.*received 'unix://'"):
        check_local_endpoint("unix://")
    with pytest.raises(ValueError, match="curve_keys: expected None for a unix:// bind"):
        EnvServer(PointEnv(), f"unix://{tmp_path}/s.sock", curve_keys=object())
    with pytest.raises(ValueError, match="curve_keys: expected None for a unix:// endpoint"):
        RemoteEnv(f"unix://{tmp_path}/s.sock", curve_keys=tmp_path)
    with pytest.raises(BindError, match=r"^bind unix://.*/no/such/folder/s\.sock: "):
        EnvServer(PointEnv(), f"unix://{tmp_path}/no/such/folder/s.sock").start()


def test_protocol_errors_and_version_negotiation_as_over_zeromq(tmp_path):
    with EnvServer(PointEnv(), f"unix://{tmp_path}/env.sock") as srv:
        chan = LocalChannel(srv.endpoint, ENV_REPLIES, timeout_s=5)
        assert chan.hello("env")["spec"]["name"] == "point" and chan.protocol == 2
        with pytest.raises(VersionMismatchError, match="version_mismatch: protocol: expected 2"):
            chan._request("hello", {"protocol": 99}, None, 1)
        with pytest.raises(RemoteError, match=r"invalid_field: .*\(field body\.action\)"):
            chan.request("step", {"action": np.zeros(3, np.float32)})  # off-spec: the server's check
        with pytest.raises(RemoteError, match="unknown_message_type"):
            chan.request("infer", {})
        assert chan.ping() > 0
        chan.close()
        assert srv.stats.snapshot()["step"]["errors"] == 1


class SlowEnv(PointEnv):
    def step(self, action):
        time.sleep(float(action[1]))
        return super().step(action)


def test_a_timed_out_request_reconnects_and_two_clients_are_both_served(tmp_path):
    with EnvServer(SlowEnv(), f"unix://{tmp_path}/env.sock") as srv:
        env, other = RemoteEnv(srv.endpoint, timeout_s=0.3), RemoteEnv(srv.endpoint, timeout_s=5)
        env.reset(seed=1)
        with pytest.raises(TimeoutError, match=r"no reply to 'step' within 0\.3 s"):
            env.step(np.array([0.0, 0.8], np.float32))
        time.sleep(1.0)  # the server finishes that step (its reply goes to the closed connection)
        obs, *_ = env.step(np.array([-0.5, 0.0], np.float32))  # a fresh connection: this step's reply, not the old one
        np.testing.assert_array_equal(obs["observation.state"], np.float32([0.5, 0.8]))  # the slow step ran first
        assert other.ping() > 0
        env.close()
        other.close()


def test_a_dead_server_is_a_connection_error_at_once(tmp_path):
    srv = EnvServer(PointEnv(), f"unix://{tmp_path}/env.sock").start()
    env = RemoteEnv(srv.endpoint, timeout_s=30)
    env.reset(seed=0)
    srv.stop()
    assert not os.path.exists(tmp_path / "env.sock")
    t0 = time.monotonic()
    with pytest.raises(ConnectionError):
        env.step(np.zeros(2, np.float32))
    assert time.monotonic() - t0 < 5.0  # not the 30 s timeout
    env.close()
