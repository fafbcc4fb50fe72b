"""The wire over a ``unix://`` socket (adapters.local_wire): frames in a message, oversized and malformed messages,
errors, timeouts, a dead server, refusals."""

import os
import socket
import threading
import time
from multiprocessing.connection import Connection

import numpy as np
import pytest

from policylink.adapters.codec import decode, encode
from policylink.adapters.env_transport import EnvServer, RemoteEnv
from policylink.adapters.local_wire import LocalChannel, check_local_endpoint, receive_message, send_message
from policylink.adapters.protocol import ENV_REPLIES, RemoteError, VersionMismatchError
from policylink.adapters.rpc import BindError

from .test_transport_env import PointEnv


def _pair() -> tuple[Connection, Connection]:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    return Connection(a.detach()), Connection(b.detach())


def test_frames_round_trip_exactly_and_decoded_arrays_own_their_memory():
    a, b = _pair()
    with a, b:
        big = np.arange(300_000, dtype=np.float32).reshape(600, 500)  # 1.2 MB: more than one socket buffer
        small = {"x": np.array([1.5, -2.0], np.float32), "task": "reach"}
        image = (np.arange(224 * 224 * 3) % 251).astype(np.uint8).reshape(224, 224, 3)  # long, 1-byte items
        messages = (small, {"big": big, "y": np.ones(3, np.int16), "image": image}, small)
        sender = threading.Thread(target=lambda: [send_message(a, encode(m)) for m in messages])
        sender.start()
        first, size = receive_message(b, 2**30)
        assert size == sum(map(len, first)) == sum(memoryview(f).nbytes for f in encode(small))
        one = decode(first)
        frames, size = receive_message(b, 2**30)
        assert size == 1_200_000 + 6 + 150_528 + len(frames[0])
        assert sorted(len(f) for f in frames[1:]) == [6, 150_528, 1_200_000]
        two = decode(frames)
        three = decode(receive_message(b, 2**30)[0])
        sender.join()
        assert not b.poll(0)  # nothing left over
    np.testing.assert_array_equal(one["x"], [1.5, -2.0])
    assert one["task"] == "reach" and one["x"].dtype == np.float32
    np.testing.assert_array_equal(two["big"], big)
    np.testing.assert_array_equal(two["y"], [1, 1, 1])
    np.testing.assert_array_equal(two["image"], image)
    one["x"][0] = 7.0  # writable, and not shared with the next message's memory
    np.testing.assert_array_equal(three["x"], [1.5, -2.0])


def test_an_oversized_message_is_refused_from_its_head_keeping_its_envelope_and_the_stream_in_step():
    a, b = _pair()
    with a, b:
        frames = encode({"id": 3, "blob": np.zeros(100_000, np.uint8)})
        t = threading.Thread(target=lambda: [send_message(a, frames), send_message(a, encode({"id": 4}))])
        t.start()
        kept, size = receive_message(b, 50_000)
        assert size == 100_000 + len(frames[0]) and len(kept) == 1 and bytes(kept[0]) == frames[0]
        assert decode(receive_message(b, 50_000)[0]) == {"id": 4}
        t.join()


def test_malformed_heads_are_connection_errors():
    a, b = _pair()
    with a, b:
        a.send_bytes(b"\x00\x00\x00\x00")  # a message of zero frames
        with pytest.raises(ConnectionError, match=r"expected 1\.\.4096 frames, received 0"):
            receive_message(b, 2**20)
        a.send_bytes(b"\x01\x00\x00\x00\x03\x00\x00\x00ab")  # one frame of 3 bytes, 2 sent
        with pytest.raises(ConnectionError, match=r"message head: expected 11 bytes, received 10"):
            receive_message(b, 2**20)
    a, b = _pair()
    with b:
        a.close()
        with pytest.raises(EOFError):
            receive_message(b, 2**20)


def test_an_oversized_request_is_answered_too_large_and_the_next_one_served_as_before(tmp_path):
    with EnvServer(PointEnv(), f"unix://{tmp_path}/env.sock", max_message_bytes=50_000) as srv:
        env = RemoteEnv(srv.endpoint, timeout_s=5)
        env.reset(seed=0)
        huge = {"action": np.zeros(2, np.float32), "pad": np.zeros(8_000_000, np.uint8)}
        with pytest.raises(RemoteError, match=r"too_large: message: expected at most 50000 bytes, received 8000"):
            env._channel.request("step", huge)
        obs, *_ = env.step(np.array([0.5, 0.0], np.float32))  # the same connection, still in step
        np.testing.assert_array_equal(obs["observation.state"], np.float32([0.5, 0.0]))
        assert srv.stats.snapshot()["(invalid)"]["errors"] == 1
        env.close()


def test_a_peer_that_breaks_the_framing_is_dropped(tmp_path):
    with EnvServer(PointEnv(), f"unix://{tmp_path}/env.sock") as srv:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(str(tmp_path / "env.sock"))
        conn = Connection(sock.detach())
        conn.send_bytes(b"\x00\x00\x00\x00")
        with pytest.raises(EOFError):
            conn.recv_bytes()  # the server closed it without a reply
        conn.close()
        assert RemoteEnv(srv.endpoint, timeout_s=5).ping() > 0  # and serves others


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
    """A step with ``action[1] > 0`` blocks until the test releases it (no timing race under load)."""

    def __init__(self):
        super().__init__()
        self.release, self.finished = threading.Event(), threading.Event()

    def step(self, action):
        if action[1] > 0:
            self.release.wait(30)
            self.finished.set()
        return super().step(action)


def test_a_timed_out_request_reconnects_and_two_clients_are_both_served(tmp_path):
    slow = SlowEnv()
    with EnvServer(slow, f"unix://{tmp_path}/env.sock") as srv:
        env, other = RemoteEnv(srv.endpoint, timeout_s=2.0), RemoteEnv(srv.endpoint, timeout_s=30)
        env.reset(seed=1)
        with pytest.raises(TimeoutError, match=r"no reply to 'step' within 2(\.0)? s"):
            env.step(np.array([0.0, 0.8], np.float32))
        slow.release.set()  # the server finishes that step (its reply goes to the closed connection)
        assert slow.finished.wait(30)
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
