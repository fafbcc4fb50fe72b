"""PolicyServer / RemotePolicy: batched infer with server-side history, structured errors, slow calls,
timeouts without stale replies, a killed and restarted server process, fuzzed frames, metrics, no torch."""

import gc
import socket
import subprocess
import sys
import textwrap
import threading
import time

import msgpack
import numpy as np
import pytest
import zmq
from hypothesis import given, settings
from hypothesis import strategies as st

from policylink.adapters.codec import CodecError
from policylink.adapters.policy import HistoryPolicy
from policylink.adapters.protocol import (
    POLICY_REQUESTS,
    PROTOCOL_VERSION,
    ErrorCode,
    ProtocolError,
    RemoteError,
    VersionMismatchError,
    encode_message,
    parse_message,
)
from policylink.adapters.rpc import Channel
from policylink.adapters.schema import ActionSpec, FeatureSpec, ObservationError, PolicySpec
from policylink.adapters.transport import PolicyServer, RemotePolicy

SPEC = PolicySpec(
    {"observation.state": FeatureSpec("float32", (2,)), "task": FeatureSpec("string", ())},
    ActionSpec(("x", "y"), "ee_delta", ("m", "m"), (-100.0, -100.0), (100.0, 100.0)),
    n_obs_steps=2,
    chunk_size=3,
    n_action_steps=2,
)


class WindowMeanPolicy(HistoryPolicy):
    """chunk[b, h] = mean of episode b's state window + h; records the tasks it saw; optional delay."""

    def __init__(self, delay_s: float = 0.0):
        super().__init__(SPEC)
        self.delay_s, self.calls, self.tasks_seen = delay_s, 0, []

    def _predict(self, history, pad_mask, tasks):
        self.calls += 1
        self.tasks_seen.append(tasks)
        if self.delay_s:
            time.sleep(self.delay_s)
        mean = history["observation.state"].mean(axis=1)  # (B, 2)
        return (mean[:, None, :] + np.arange(3, dtype=np.float32)[None, :, None]).astype(np.float32)


class CounterPolicy(WindowMeanPolicy):
    """Every chunk is filled with the call number (1, 2, ...); the first call sleeps ``delay_s``."""

    def _predict(self, history, pad_mask, tasks):
        self.calls += 1
        if self.calls == 1 and self.delay_s:
            time.sleep(self.delay_s)
        return np.full((len(history["observation.state"]), 3, 2), self.calls, np.float32)


def _obs(*states, tasks=None):
    s = np.asarray(states, np.float32)
    return {"observation.state": s, "task": tasks or [f"task {i}" for i in range(len(s))]}


@pytest.fixture
def server():
    srv = PolicyServer(WindowMeanPolicy(), "tcp://127.0.0.1:0").start()
    yield srv
    srv.stop()


def test_hello_spec_and_batched_infer_with_server_side_history(server):
    remote = RemotePolicy(server.endpoint, timeout_s=5)
    assert remote.spec == SPEC
    assert remote.server_info["protocol"] == PROTOCOL_VERSION and remote.server_info["kind"] == "policy"
    remote.update_observation(_obs([0, 0], [10, 20], tasks=["open", "close"]))
    remote.update_observation(_obs([2, 4], [10, 22], tasks=["open", "close"]))  # both ride the next infer
    chunk = remote.predict_action_chunk()
    assert chunk.dtype == np.float32 and chunk.shape == (2, 3, 2)
    np.testing.assert_array_equal(chunk[:, 0], [[1, 2], [10, 21]])  # window means
    np.testing.assert_array_equal(chunk[1, :, 0], [10, 11, 12])
    assert server.policy.tasks_seen == [["open", "close"]]
    remote.close()


def test_partial_reset_clears_only_that_episode(server):
    remote = RemotePolicy(server.endpoint, timeout_s=5)
    remote.update_observation(_obs([0, 0], [10, 10]))
    remote.update_observation(_obs([2, 2], [20, 20]))
    remote.reset([1])
    remote.update_observation(_obs([4, 4], [30, 30]))
    chunk = remote.predict_action_chunk()
    np.testing.assert_array_equal(chunk[:, 0], [[3, 3], [30, 30]])  # env 0: mean(2, 4); env 1: fresh window
    remote.close()


def test_off_spec_observation_gets_invalid_field_and_server_keeps_serving(server):
    remote = RemotePolicy(server.endpoint, timeout_s=5, validate=False)
    remote.update_observation({"observation.state": np.zeros((1, 3), np.float32), "task": ["a"]})
    with pytest.raises(RemoteError) as err:
        remote.predict_action_chunk()
    assert err.value.code == "invalid_field" and err.value.field == "body.updates[0].observation.state"
    assert "expected shape (B, 2), received (1, 3)" in str(err.value)
    remote.update_observation({"observation.state": np.ones((1, 2), np.float64), "task": ["a"]})
    with pytest.raises(RemoteError, match="expected dtype float32, received float64"):
        remote.predict_action_chunk()
    remote.update_observation({"observation.state": np.ones((2, 2), np.float32), "task": ["only one"]})
    with pytest.raises(
        RemoteError,
        match=r"batch size: expected the same leading dim for every feature.*'observation.state': 2, "
        r"'task': 1",
    ):
        remote.predict_action_chunk()
    remote.update_observation({"observation.state": np.ones((1, 2), np.float32), "task": np.array(["numpy str"])})
    np.testing.assert_array_equal(remote.predict_action_chunk()[0, 0], [1, 1])  # (B,) str arrays are fine too
    remote.update_observation(_obs([1, 1]))
    np.testing.assert_array_equal(remote.predict_action_chunk()[0, 0], [1, 1])
    with pytest.raises(ObservationError, match="observation.state"):  # local check before sending
        RemotePolicy(server.endpoint, timeout_s=5, validate=True).update_observation({"task": ["a"]})
    remote.close()


def test_policy_exception_becomes_infer_failed(server):
    remote = RemotePolicy(server.endpoint, timeout_s=5)
    with pytest.raises(RemoteError) as err:
        remote.predict_action_chunk()  # no observation yet: HistoryPolicy raises RuntimeError
    assert err.value.code == "infer_failed" and "RuntimeError" in err.value.message
    assert server.stats.snapshot()["infer"]["errors"] == 1


def test_version_mismatch_is_a_clear_error_at_hello(server):
    chan = Channel(server.endpoint, {"hello": {}}, timeout_s=5)
    with pytest.raises(VersionMismatchError) as err:
        chan.request("hello", {"protocol": PROTOCOL_VERSION + 1})
    assert err.value.code == "version_mismatch"
    assert f"expected {PROTOCOL_VERSION} (this server), received {PROTOCOL_VERSION + 1}" in str(err.value)
    chan.close()


def _raw_dealer(endpoint):
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.linger = 0
    sock.connect(endpoint)
    return sock


def _error_reply(sock, frames):
    sock.send_multipart(frames)
    assert sock.poll(5000), "no reply"
    reply = msgpack.unpackb(sock.recv_multipart()[0])
    assert reply["type"] == "error", reply
    return reply


def test_malformed_unknown_and_oversize_messages_get_structured_errors():
    srv = PolicyServer(WindowMeanPolicy(), "tcp://127.0.0.1:0", max_message_bytes=10_000).start()
    sock = _raw_dealer(srv.endpoint)
    try:
        r = _error_reply(sock, [b"\xc1garbage"])
        assert r["body"]["code"] == "invalid_frame" and r["id"] is None
        r = _error_reply(sock, [msgpack.packb({"id": 7, "type": "explode", "body": {}})])
        assert (r["id"], r["body"]["code"], r["body"]["field"]) == (7, "unknown_message_type", "type")
        r = _error_reply(sock, [msgpack.packb({"id": 8, "type": "infer", "body": {"updates": [], "x": 1}})])
        assert (r["id"], r["body"]["code"], r["body"]["field"]) == (8, "invalid_field", "body.x")
        r = _error_reply(sock, [msgpack.packb({"id": 9, "type": "reset", "body": {"updates": "no"}})])
        assert (r["body"]["code"], r["body"]["field"]) == ("invalid_field", "body.updates")
        r = _error_reply(sock, [msgpack.packb({"id": 10, "type": "ping"})])
        assert r["body"]["code"] == "invalid_frame" and "expected keys" in r["body"]["message"]
        big = encode_message(11, "infer", {"updates": [_obs(*np.zeros((2000, 2)))]})  # 16 kB > 10 kB cap
        r = _error_reply(sock, [memoryview(f).tobytes() for f in big])
        assert (r["id"], r["body"]["code"]) == (11, "too_large")
        assert "expected at most 10000 bytes" in r["body"]["message"]
        remote = RemotePolicy(srv.endpoint, timeout_s=5)  # still serving
        assert remote.ping() < 5
        assert srv.stats.snapshot()["(invalid)"]["errors"] == 6
        remote.close()
    finally:
        sock.close(0)
        srv.stop()


@settings(max_examples=200, deadline=None)
@given(
    st.recursive(
        st.none()
        | st.booleans()
        | st.integers(-(2**63), 2**63 - 1)
        | st.floats()
        | st.text(max_size=8)
        | st.binary(max_size=8),
        lambda children: (
            st.lists(children, max_size=4)
            | st.dictionaries(
                st.sampled_from(["id", "type", "body", "updates", "env_ids", "protocol", "observation.state", "x"]),
                children,
                max_size=4,
            )
        ),
        max_leaves=12,
    ),
    st.lists(st.binary(max_size=16), max_size=2),
)
def test_fuzzed_requests_only_ever_raise_protocol_errors(tree, extra_frames):
    frames = [msgpack.packb(tree), *extra_frames]
    try:
        msg = parse_message(frames, POLICY_REQUESTS)
    except ProtocolError as e:
        assert isinstance(e.code, ErrorCode)
        return
    assert msg.type in POLICY_REQUESTS


def test_live_server_survives_random_frames():
    srv = PolicyServer(WindowMeanPolicy(), "tcp://127.0.0.1:0").start()
    sock = _raw_dealer(srv.endpoint)
    rng = np.random.default_rng(0)
    try:
        for i in range(40):
            frames = [rng.bytes(int(rng.integers(0, 40))) for _ in range(int(rng.integers(1, 4)))]
            if i % 2:  # a valid-looking envelope with a random body
                frames[0] = msgpack.packb({"id": i, "type": "infer", "body": {"updates": [{"k": frames[0]}]}})
            sock.send_multipart(frames)
            assert sock.poll(5000)
            assert msgpack.unpackb(sock.recv_multipart()[0])["type"] == "error"
        remote = RemotePolicy(srv.endpoint, timeout_s=5)
        remote.update_observation(_obs([5, 7]))
        np.testing.assert_array_equal(remote.predict_action_chunk()[0, 0], [5, 7])
        remote.close()
    finally:
        sock.close(0)
        srv.stop()


def test_hello_and_ping_answered_while_a_slow_infer_runs():
    srv = PolicyServer(WindowMeanPolicy(delay_s=1.5), "tcp://127.0.0.1:0").start()
    try:
        slow = RemotePolicy(srv.endpoint, timeout_s=10)
        slow.update_observation(_obs([1, 1]))
        result = {}
        t = threading.Thread(target=lambda: result.setdefault("chunk", slow.predict_action_chunk()))
        t.start()
        time.sleep(0.3)  # the infer is now running
        t0 = time.perf_counter()
        other = RemotePolicy(srv.endpoint, timeout_s=1.0)  # hello
        other.ping()
        elapsed = time.perf_counter() - t0
        assert t.is_alive(), "the slow infer should still be running"
        assert elapsed < 0.6, f"hello + ping took {elapsed:.3f} s during a 1.5 s infer"
        t.join(10)
        np.testing.assert_array_equal(result["chunk"][0, 0], [1, 1])
        slow.close()
        other.close()
    finally:
        srv.stop()


def test_timed_out_request_never_returns_its_late_reply():
    srv = PolicyServer(CounterPolicy(delay_s=0.8), "tcp://127.0.0.1:0").start()
    try:
        remote = RemotePolicy(srv.endpoint, timeout_s=0.25)
        remote.update_observation(_obs([0, 0]))
        t0 = time.perf_counter()
        with pytest.raises(TimeoutError) as err:
            remote.predict_action_chunk()
        assert time.perf_counter() - t0 < 1.0
        assert srv.endpoint in str(err.value) and "'infer'" in str(err.value)
        remote._channel.timeout_s = 5.0
        chunk = remote.predict_action_chunk()  # queued behind call 1 on the server; must get call 2's reply
        assert np.all(chunk == 2)
        remote.close()
    finally:
        srv.stop()


def test_channel_discards_replies_with_another_request_id():
    router = zmq.Context.instance().socket(zmq.ROUTER)
    router.linger = 0
    port = router.bind_to_random_port("tcp://127.0.0.1")
    chan = Channel(f"tcp://127.0.0.1:{port}", {"ping": {"time": ((float,), False)}}, timeout_s=5)

    def fake_server():
        identity, header = router.recv_multipart()
        rid = msgpack.unpackb(header)["id"]
        for stale_id, t in ((rid - 1, 111.0), (rid + 5, 222.0), (rid, 333.0)):
            router.send_multipart([identity, msgpack.packb({"id": stale_id, "type": "ping", "body": {"time": t}})])

    t = threading.Thread(target=fake_server)
    t.start()
    assert chan.request("ping", {}) == {"time": 333.0}
    t.join(5)
    chan.close()
    router.close(0)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


SERVER_SCRIPT = textwrap.dedent("""
    import sys, numpy as np
    from policylink.adapters.policy import HistoryPolicy
    from policylink.adapters.schema import ActionSpec, FeatureSpec, PolicySpec
    from policylink.adapters.transport import PolicyServer
    spec = PolicySpec({"observation.state": FeatureSpec("float32", (2,))},
                      ActionSpec(("x", "y"), "ee_delta", ("m", "m"), (-100, -100), (100, 100)), chunk_size=3)
    class Plus(HistoryPolicy):
        def _predict(self, history, pad_mask, tasks):
            s = history["observation.state"][:, -1] + float(sys.argv[2])
            return np.repeat(s[:, None], 3, axis=1).astype(np.float32)
    srv = PolicyServer(Plus(spec), f"tcp://127.0.0.1:{sys.argv[1]}").start()
    print("READY", flush=True)
    srv.serve_forever()
""")


def _spawn(port, offset):
    p = subprocess.Popen(
        [sys.executable, "-c", SERVER_SCRIPT, str(port), str(offset)], stdout=subprocess.PIPE, text=True
    )
    assert p.stdout.readline().strip() == "READY"
    return p


def test_killed_server_times_out_then_works_after_restart_without_stale_replies():
    port = _free_port()
    first = _spawn(port, 100)
    second = None
    try:
        remote = RemotePolicy(f"tcp://127.0.0.1:{port}", timeout_s=1.0)
        remote.update_observation({"observation.state": np.array([[1, 2]], np.float32)})
        np.testing.assert_array_equal(remote.predict_action_chunk()[0, 0], [101, 102])
        first.kill()
        first.wait(10)
        remote.update_observation({"observation.state": np.array([[3, 4]], np.float32)})
        t0 = time.perf_counter()
        with pytest.raises(TimeoutError, match=f"tcp://127.0.0.1:{port}.*'infer'"):
            remote.predict_action_chunk()
        assert time.perf_counter() - t0 < 2.0
        second = _spawn(port, 1000)  # a different offset: any stale reply from the first server would show
        remote._channel.timeout_s = 10.0
        remote.update_observation({"observation.state": np.array([[5, 6]], np.float32)})
        np.testing.assert_array_equal(remote.predict_action_chunk()[0, 0], [1005, 1006])
        assert remote.ping() < 10
        remote.close()
    finally:
        for p in (first, second):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait(10)


def test_metrics_count_latency_and_errors(server):
    remote = RemotePolicy(server.endpoint, timeout_s=5, validate=False)
    for _ in range(5):
        remote.update_observation(_obs([1, 2]))
        remote.predict_action_chunk()
    remote.ping()
    remote.update_observation({"observation.state": np.zeros((1, 5), np.float32), "task": ["x"]})
    with pytest.raises(RemoteError):
        remote.predict_action_chunk()
    snap = server.stats.snapshot()
    assert snap["infer"]["count"] == 6 and snap["infer"]["errors"] == 1
    assert snap["hello"]["count"] == 1 and snap["ping"]["count"] == 1
    assert 0 < snap["infer"]["p50_ms"] <= snap["infer"]["p99_ms"] < 5000
    table = server.stats.format()
    assert table.splitlines()[0].split() == ["verb", "count", "errors", "p50", "ms", "p99", "ms"]
    assert any(line.split()[:3] == ["infer", "6", "1"] for line in table.splitlines())
    remote.close()


def test_client_side_imports_no_torch():
    code = (
        "import policylink.adapters.transport, policylink.adapters.codec, policylink.adapters.openpi; "
        "import sys; assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_an_observation_with_a_non_str_key_is_refused_when_queued(server):
    remote = RemotePolicy(server.endpoint, timeout_s=5)
    obs = _obs([1, 2])
    with pytest.raises(CodecError, match=r"observation\[3\]: map keys must be str, received int"):
        remote.update_observation({**obs, 3: np.zeros((1, 2), np.float32)})
    with pytest.raises(CodecError, match=r"observation.extra\[0\]\[1\]: map keys must be str"):
        remote.update_observation({**obs, "extra": [{1: 2}]})
    remote.update_observation(obs)  # nothing of the refused batches was queued
    assert remote.predict_action_chunk().shape == (1, 3, 2)
    remote.close()


def test_close_ends_the_channels_context_and_a_later_call_opens_a_new_one(server):
    remote = RemotePolicy(server.endpoint, timeout_s=5)
    conn = remote._channel._conn
    first = conn.ctx
    remote.close()
    assert conn.sock is None and conn.ctx is None and first.closed
    remote.update_observation(_obs([1, 2]))
    np.testing.assert_array_equal(remote.predict_action_chunk()[0, 0], [1.0, 2.0])
    assert conn.ctx is not None and conn.ctx is not first
    remote.close()


def test_a_remote_dropped_unclosed_in_a_reference_cycle_is_collected_without_hanging(server):
    remote = RemotePolicy(server.endpoint, timeout_s=5)
    remote.update_observation(_obs([1, 2]))
    remote.predict_action_chunk()
    conn = remote._channel._conn  # its own ZeroMQ context and socket
    remote.itself = remote  # garbage only the cycle collector finds
    del remote
    collector = threading.Thread(target=gc.collect, daemon=True)
    collector.start()
    collector.join(10)
    assert not collector.is_alive()  # ending the context before its socket would wait forever
    assert conn.sock is None and conn.ctx is None


class ThreadRecordingPolicy(WindowMeanPolicy):
    """Records the serving thread of every call (``-serve`` = inline on the loop, ``-worker`` = handed off)."""

    def __init__(self):
        super().__init__()
        self.threads = []

    def _predict(self, history, pad_mask, tasks):
        self.threads.append(threading.current_thread().name.rsplit("-", 1)[-1])
        return super()._predict(history, pad_mask, tasks)


def test_fast_calls_run_inline_on_the_serving_loop_and_a_slow_one_sends_the_next_to_the_worker():
    policy = ThreadRecordingPolicy()
    srv = PolicyServer(policy, "tcp://127.0.0.1:0", inline_below_s=0.25).start()
    try:
        remote = RemotePolicy(srv.endpoint, timeout_s=5)
        remote.update_observation(_obs([1, 1]))
        for _ in range(10):
            remote.predict_action_chunk()
        assert policy.threads == ["worker"] * 8 + ["serve"] * 2  # 8 fast calls seen: no more hand-offs
        policy.delay_s = 0.3
        remote.predict_action_chunk()  # predicted fast: inline, but slow
        policy.delay_s = 0.0
        remote.predict_action_chunk()
        assert policy.threads[10:] == ["serve", "worker"]  # the slow call sent the next one to the worker
        remote.close()
    finally:
        srv.stop()
