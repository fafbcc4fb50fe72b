"""Protocol 2 over the wire: per-row ``infer``, an RTC prefix giving the same chunk as in-process, the ``embed``
verb, server timing, capabilities advertised in ``hello`` (and nothing more on the client), strict schemas for the
new fields, and protocol-1 clients and servers still working."""

import time

import msgpack
import numpy as np
import pytest

from policylink.adapters.capabilities import ChunkPrefix, Embedder, PrefixConditioned, capabilities_of
from policylink.adapters.policy import HistoryPolicy
from policylink.adapters.protocol import (
    POLICY_REPLIES,
    POLICY_REPLIES_BY_PROTOCOL,
    POLICY_REPLIES_V1,
    PROTOCOL_VERSION,
    ErrorCode,
    ProtocolError,
    RemoteError,
    encode_message,
)
from policylink.adapters.rpc import Channel
from policylink.adapters.schema import ActionSpec, FeatureSpec, PolicySpec
from policylink.adapters.transport import WIRE_CAPABILITIES, PolicyServer, RemotePolicy

SPEC = PolicySpec(
    {"observation.state": FeatureSpec("float32", (2,))},
    ActionSpec(("x", "y"), "ee_delta", ("m", "m"), (-100.0, -100.0), (100.0, 100.0)),
    n_obs_steps=2,
    chunk_size=3,
    n_action_steps=2,
)


class MeanPolicy(HistoryPolicy):
    """chunk[b, h] = mean of row b's state window + h; records the rows of every call; optional delay (s)."""

    def __init__(self, delay_s: float = 0.0):
        super().__init__(SPEC)
        self.delay_s, self.rows_seen = delay_s, []

    def _predict(self, history, pad_mask, tasks):
        self.rows_seen.append(len(pad_mask))
        if self.delay_s:
            time.sleep(self.delay_s)
        mean = history["observation.state"].mean(axis=1)
        return (mean[:, None, :] + np.arange(3, dtype=np.float32)[None, :, None]).astype(np.float32)


class SeededRTCPolicy(MeanPolicy):
    """PrefixConditioned + Embedder, deterministic from ``seed``: a prefixed chunk blends seeded noise around the
    window mean with the prefix, ``w * prefix + (1 - w) * (mean + noise)``; the latent is ``[mean, mean.sum()]``."""

    latent_dim = 3

    def __init__(self, seed: int = 0):
        super().__init__()
        self.rng = np.random.default_rng(seed)

    def predict_action_chunk_with_prefix(self, prefix, env_ids=None):
        history, _, _ = self.rows(env_ids)
        mean = history["observation.state"].mean(axis=1)[:, None, :]  # (B', 1, 2)
        noise = self.rng.standard_normal((len(mean), 3, 2)).astype(np.float32)
        w = prefix.weights[:, :, None]
        return (w * prefix.actions + (1 - w) * (mean + noise)).astype(np.float32)

    def embed(self, obs=None, env_ids=None):
        mean = self.rows(env_ids)[0]["observation.state"].mean(axis=1)
        return np.concatenate([mean, mean.sum(1, keepdims=True)], axis=1).astype(np.float32)


def _obs(*states):
    return {"observation.state": np.asarray(states, np.float32)}


def _prefix(rows: int) -> ChunkPrefix:
    actions = np.arange(rows * 6, dtype=np.float32).reshape(rows, 3, 2)
    weights = np.tile(np.array([1.0, 0.5, 0.0], np.float32), (rows, 1))
    return ChunkPrefix(actions, weights, max_guidance=5.0)


@pytest.fixture
def rtc_server():
    srv = PolicyServer(SeededRTCPolicy(seed=7), "tcp://127.0.0.1:0").start()
    yield srv
    srv.stop()


def test_capabilities_are_advertised_and_offered_exactly(rtc_server):
    plain = PolicyServer(MeanPolicy(), "tcp://127.0.0.1:0").start()
    try:
        remote, bare = RemotePolicy(rtc_server.endpoint, timeout_s=5), RemotePolicy(plain.endpoint, timeout_s=5)
        assert capabilities_of(rtc_server.policy) == ["embedder", "prefix"] == list(WIRE_CAPABILITIES)
        assert rtc_server.capabilities == ["embedder", "prefix"]
        assert remote.server_info["capabilities"] == ["embedder", "prefix"] and remote.server_info["latent_dim"] == 3
        assert remote.server_info["protocol"] == PROTOCOL_VERSION == 2
        assert isinstance(remote, PrefixConditioned) and isinstance(remote, Embedder) and remote.latent_dim == 3
        assert isinstance(remote, RemotePolicy) and remote.capabilities == {"embedder", "prefix"}
        assert bare.server_info["capabilities"] == [] and "latent_dim" not in bare.server_info
        assert not isinstance(bare, PrefixConditioned) and not isinstance(bare, Embedder)
        assert type(bare) is RemotePolicy and bare.capabilities == frozenset()
        remote.close()
        bare.close()
    finally:
        plain.stop()


def test_rtc_prefix_over_the_wire_gives_the_in_process_chunk(rtc_server):
    local = SeededRTCPolicy(seed=7)
    remote = RemotePolicy(rtc_server.endpoint, timeout_s=5)
    for step in ([0, 0], [10, 20], [4, 4]), ([2, 4], [12, 22], [6, 6]):
        local.update_observation(_obs(*step))
        remote.update_observation(_obs(*step))
    for env_ids in (None, [2, 0]):
        prefix = _prefix(3 if env_ids is None else 2)
        expected = local.predict_action_chunk_with_prefix(prefix, env_ids)
        got = remote.predict_action_chunk_with_prefix(prefix, env_ids)
        np.testing.assert_array_equal(got, expected)
        np.testing.assert_array_equal(got[:, 0], prefix.actions[:, 0])  # weight 1: the committed action itself
    mean_row2 = np.array([5.0, 5.0], np.float32)  # row 2's window mean: (4 + 6) / 2
    assert not np.allclose(got[0, 2], mean_row2)  # weight 0: seeded noise around the mean, not the prefix
    remote.close()


def test_env_ids_predict_only_those_rows(rtc_server):
    srv = PolicyServer(MeanPolicy(), "tcp://127.0.0.1:0").start()
    try:
        remote = RemotePolicy(srv.endpoint, timeout_s=5)
        remote.update_observation(_obs([0, 0], [10, 10], [20, 20]))
        chunk = remote.predict_action_chunk([2, 0])
        np.testing.assert_array_equal(chunk[:, :, 0], [[20, 21, 22], [0, 1, 2]])
        assert srv.policy.rows_seen == [2]  # the server policy computed two rows, not three
        np.testing.assert_array_equal(remote.predict_action_chunk()[:, 0, 0], [0, 10, 20])
        assert srv.policy.rows_seen == [2, 3]
        remote.close()
    finally:
        srv.stop()


def test_embed_verb_matches_the_in_process_latent(rtc_server):
    local, remote = SeededRTCPolicy(), RemotePolicy(rtc_server.endpoint, timeout_s=5)
    for pol in (local, remote):
        pol.update_observation(_obs([1, 3], [10, 20]))
    latent = remote.embed(None, [1])
    np.testing.assert_array_equal(latent, [[10, 20, 30]])
    np.testing.assert_array_equal(remote.embed(), local.embed())
    with pytest.raises(ValueError, match="obs: expected None"):
        remote.embed({"observation.state": np.zeros((1, 2), np.float32)})
    assert set(remote.last_timing) == {"round_trip_s", "receive_to_reply_s", "queue_s", "inference_s"}
    remote.close()


def test_infer_reply_carries_server_timing():
    srv = PolicyServer(MeanPolicy(delay_s=0.05), "tcp://127.0.0.1:0").start()
    try:
        chan = Channel(srv.endpoint, POLICY_REPLIES, timeout_s=5, replies_by_protocol=POLICY_REPLIES_BY_PROTOCOL)
        assert chan.hello("policy")["protocol"] == 2 and chan.protocol == 2
        reply = chan.request("infer", {"updates": [_obs([1, 1])]})
        t = reply["timing"]
        assert set(t) == {"receive_to_reply_s", "queue_s", "inference_s"}
        assert t["inference_s"] >= 0.05  # the policy sleeps 50 ms
        assert t["receive_to_reply_s"] >= t["queue_s"] + t["inference_s"] and t["queue_s"] >= 0
        chan.close()
        remote = RemotePolicy(srv.endpoint, timeout_s=5)
        remote.update_observation(_obs([1, 1]))
        remote.predict_action_chunk()
        assert remote.last_timing["round_trip_s"] >= remote.last_timing["receive_to_reply_s"] >= 0.05
        remote.close()
    finally:
        srv.stop()


def _raw(endpoint, frames):
    import zmq

    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.linger = 0
    sock.connect(endpoint)
    try:
        sock.send_multipart(frames, copy=True)
        assert sock.poll(5000), "no reply"
        return sock.recv_multipart()
    finally:
        sock.close(0)


def test_protocol_1_client_is_answered_in_protocol_1(rtc_server):
    chan = Channel(rtc_server.endpoint, POLICY_REPLIES_V1, timeout_s=5)  # a strict protocol-1 reply schema
    chan.protocol = 1  # envelopes without "v", as policylink before protocol 2 sent them
    hello = chan.request("hello", {"protocol": 1, "client": "old policylink"})
    assert hello["protocol"] == 1 and set(hello) == {"protocol", "kind", "spec", "server"}
    chan.request("reset", {"env_ids": None, "updates": []})
    reply = chan.request("infer", {"updates": [_obs([2, 4], [6, 8])]})  # no env_ids, prefix or timing
    assert set(reply) == {"actions"}
    np.testing.assert_array_equal(reply["actions"][:, 0], [[2, 4], [6, 8]])
    chan.close()
    frames = [bytes(f) for f in encode_message(5, "infer", {"updates": [_obs([1, 1], [1, 1])]})]
    envelope = msgpack.unpackb(_raw(rtc_server.endpoint, frames)[0])
    assert set(envelope) == {"id", "type", "body"} and envelope["type"] == "infer"  # no "v" for protocol 1
    frames = [bytes(f) for f in encode_message(6, "infer", {"updates": [], "env_ids": [0]})]
    envelope = msgpack.unpackb(_raw(rtc_server.endpoint, frames)[0])  # env_ids is protocol 2
    assert (envelope["type"], envelope["body"]["code"], envelope["body"]["field"]) == (
        "error",
        "invalid_field",
        "body.env_ids",
    )
    frames = [bytes(f) for f in encode_message(7, "embed", {"updates": []})]
    assert msgpack.unpackb(_raw(rtc_server.endpoint, frames)[0])["body"]["code"] == "unknown_message_type"


class ProtocolOneServer(PolicyServer):
    """A server that speaks protocol 1 only (as policylink before protocol 2)."""

    def _hello(self, msg):
        if msg.body["protocol"] != 1:
            raise ProtocolError(ErrorCode.VERSION_MISMATCH, "protocol: expected 1", "body.protocol", msg.id)
        return super()._hello(msg)


def test_new_client_falls_back_to_a_protocol_1_server():
    srv = ProtocolOneServer(SeededRTCPolicy(), "tcp://127.0.0.1:0").start()
    try:
        remote = RemotePolicy(srv.endpoint, timeout_s=5)
        assert remote._channel.protocol == 1 and remote.server_info["protocol"] == 1
        assert not isinstance(remote, PrefixConditioned) and not isinstance(remote, Embedder)
        remote.update_observation(_obs([0, 0], [10, 10], [20, 20]))
        np.testing.assert_array_equal(remote.predict_action_chunk([2, 1])[:, 0, 0], [20, 10])  # sliced here
        assert srv.policy.rows_seen == [3] and set(remote.last_timing) == {"round_trip_s"}
        remote.close()
    finally:
        srv.stop()


@pytest.mark.parametrize(
    ("prefix", "env_ids", "code", "field", "message"),
    [
        (
            {"actions": np.zeros((1, 3, 2), np.float32), "weights": np.ones((1, 3), np.float32)},
            None,
            "invalid_field",
            "body.prefix.max_guidance",
            "missing required field 'max_guidance'",
        ),
        (
            {
                "actions": np.zeros((1, 3, 2), np.float32),
                "weights": np.ones((1, 3), np.float32),
                "max_guidance": 5.0,
                "d": 2,
            },
            None,
            "invalid_field",
            "body.prefix.d",
            "unknown field(s) ['d']",
        ),
        (
            {"actions": np.zeros((1, 3, 2), np.float64), "weights": np.ones((1, 3), np.float32), "max_guidance": 5.0},
            None,
            "invalid_field",
            "body.prefix.actions",
            "expected dtype float32, received float64",
        ),
        (
            {"actions": np.zeros((1, 3, 2), np.float32), "weights": np.ones((1, 4), np.float32), "max_guidance": 5.0},
            None,
            "invalid_field",
            "body.prefix.weights",
            "expected shape (1, 3), received (1, 4)",
        ),
        (
            {
                "actions": np.zeros((1, 3, 2), np.float32),
                "weights": np.full((1, 3), 2, np.float32),
                "max_guidance": 5.0,
            },
            None,
            "invalid_field",
            "body.prefix.weights",
            "expected values in [0, 1]",
        ),
        (
            {"actions": np.zeros((1, 3, 2), np.float32), "weights": np.ones((1, 3), np.float32), "max_guidance": 5.0},
            [0, 1],
            "invalid_field",
            "body.prefix.actions",
            "expected shape (2, 3, 2), received (1, 3, 2)",
        ),
        (None, [1, 1], "invalid_field", "body.env_ids", "expected distinct indices >= 0"),
        (None, [5], "invalid_field", "body.env_ids", "expected indices in [0, 2)"),
        ([1, 2], None, "invalid_field", "body.prefix", "prefix: expected a map, received list"),
    ],
)
def test_new_fields_are_strictly_checked(rtc_server, prefix, env_ids, code, field, message):
    remote = RemotePolicy(rtc_server.endpoint, timeout_s=5)
    remote.update_observation(_obs([0, 0], [1, 1]))
    remote.predict_action_chunk()
    with pytest.raises(RemoteError) as err:
        remote._channel.request("infer", {"updates": [], "env_ids": env_ids, "prefix": prefix})
    assert (err.value.code, err.value.field) == (code, field)
    assert message in err.value.message
    remote.close()


def test_prefix_and_embed_refused_by_a_policy_without_them():
    srv = PolicyServer(MeanPolicy(), "tcp://127.0.0.1:0").start()
    try:
        remote = RemotePolicy(srv.endpoint, timeout_s=5)
        remote.update_observation(_obs([0, 0]))
        p = _prefix(1)
        body = {"actions": p.actions, "weights": p.weights, "max_guidance": 5.0}
        with pytest.raises(RemoteError) as err:
            remote._channel.request("infer", {"updates": [], "prefix": body})
        assert (err.value.code, err.value.field) == ("unsupported", "body.prefix")
        assert "MeanPolicy is not PrefixConditioned" in err.value.message
        with pytest.raises(RemoteError) as err:
            remote._channel.request("embed", {"updates": []})
        assert err.value.code == "unsupported" and "MeanPolicy is not an Embedder" in err.value.message
        assert srv.policy.rows_seen == []  # refused before the policy ran
        remote.close()
    finally:
        srv.stop()
