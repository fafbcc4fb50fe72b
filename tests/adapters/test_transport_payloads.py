"""Transport payloads: chunks checked on the server (shape, dtype, finiteness), received arrays writable in place,
frames on both sides of the sockets' copy threshold delivered exactly."""

import numpy as np
import pytest

from policylink.adapters.protocol import RemoteError
from policylink.adapters.rpc import COPY_THRESHOLD
from policylink.adapters.schema import ActionSpec, FeatureSpec, PolicySpec
from policylink.adapters.transport import PolicyServer, RemotePolicy

SPEC = PolicySpec(
    {"observation.state": FeatureSpec("float32", (2,)), "task": FeatureSpec("string", ())},
    ActionSpec(("x", "y"), "ee_delta", ("m", "m"), (-100.0, -100.0), (100.0, 100.0)),
    n_obs_steps=1,
    chunk_size=3,
    n_action_steps=2,
)


def _obs(*states):
    s = np.asarray(states, np.float32)
    return {"observation.state": s, "task": [f"task {i}" for i in range(len(s))]}


class RawChunkPolicy:
    """A bare PolicyAdapter returning whatever chunk it is given (no HistoryPolicy checks)."""

    spec = SPEC

    def __init__(self, chunk):
        self.chunk = chunk

    def reset(self, env_ids=None):
        pass

    def update_observation(self, obs):
        pass

    def predict_action_chunk(self):
        return self.chunk


@pytest.mark.parametrize(
    ("chunk", "reason"),
    [
        (np.full((1, 3, 2), np.nan, np.float32), "expected finite values, received NaN or inf"),
        (np.zeros((1, 3, 2), np.float64), "expected dtype float32, received float64"),
        (np.zeros((1, 5, 2), np.float32), r"expected \(B, 3, 2\), received \(1, 5, 2\)"),
    ],
)
def test_off_spec_chunks_from_the_policy_are_infer_failed(chunk, reason):
    srv = PolicyServer(RawChunkPolicy(chunk), "tcp://127.0.0.1:0").start()
    try:
        remote = RemotePolicy(srv.endpoint, timeout_s=5)
        remote.update_observation(_obs([1, 1]))
        with pytest.raises(RemoteError, match=reason) as err:
            remote.predict_action_chunk()
        assert err.value.code == "infer_failed" and err.value.field == "actions"
        remote.close()
    finally:
        srv.stop()


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_one_non_finite_value_among_finite_ones_is_infer_failed(bad):
    chunk = np.zeros((2, 3, 2), np.float32)
    chunk[1, 2, 0] = bad
    srv = PolicyServer(RawChunkPolicy(chunk), "tcp://127.0.0.1:0").start()
    try:
        remote = RemotePolicy(srv.endpoint, timeout_s=5)
        remote.update_observation(_obs([1, 1], [2, 2]))
        with pytest.raises(RemoteError, match="expected finite values, received NaN or inf") as err:
            remote.predict_action_chunk()
        assert err.value.code == "infer_failed"
        remote.close()
    finally:
        srv.stop()


def test_finite_chunks_of_huge_values_pass_unchanged():
    # squares of these overflow float32: the server's fast finiteness test then falls back to the exact one
    chunk = np.array([[[3.4e38, -3.4e38], [1e20, -1e20], [1.0, 0.0]]], np.float32)
    srv = PolicyServer(RawChunkPolicy(chunk), "tcp://127.0.0.1:0").start()
    try:
        remote = RemotePolicy(srv.endpoint, timeout_s=5)
        remote.update_observation(_obs([1, 1]))
        np.testing.assert_array_equal(remote.predict_action_chunk(), chunk)
        remote.close()
    finally:
        srv.stop()


class InPlaceNormalisingPolicy(RawChunkPolicy):
    """Normalises the received batch in place (as a processor would) and returns it as the chunk."""

    def update_observation(self, obs):
        state = obs["observation.state"]
        state -= 1.0
        state *= 2.0
        self.chunk = np.repeat(state[:, None], 3, axis=1)


def test_policy_can_normalise_received_arrays_in_place():
    srv = PolicyServer(InPlaceNormalisingPolicy(None), "tcp://127.0.0.1:0").start()
    try:
        remote = RemotePolicy(srv.endpoint, timeout_s=5)
        sent = np.array([[1.5, 3.0]], np.float32)
        remote.update_observation({"observation.state": sent, "task": ["t"]})
        np.testing.assert_array_equal(remote.predict_action_chunk()[0], [[1.0, 4.0]] * 3)
        np.testing.assert_array_equal(sent, [[1.5, 3.0]])  # the client's array is untouched
        remote.close()
    finally:
        srv.stop()


class ImageEchoPolicy(RawChunkPolicy):
    """Keeps a copy of each received (16, width, 3) image; its chunks are zeros."""

    def __init__(self, width):
        super().__init__(np.zeros((1, 3, 2), np.float32))
        self.spec = PolicySpec({"observation.images.cam": FeatureSpec("uint8", (16, width, 3))}, SPEC.action, 1, 3, 2)
        self.received = []

    def update_observation(self, obs):
        self.received.append(obs["observation.images.cam"].copy())


@pytest.mark.parametrize("width", [5461, 5462])  # 16 x width x 3 bytes: just under / just over COPY_THRESHOLD
def test_frames_just_under_and_over_the_copy_threshold_arrive_exactly(width):
    assert (16 * width * 3 < COPY_THRESHOLD) == (width == 5461)
    policy = ImageEchoPolicy(width)
    srv = PolicyServer(policy, "tcp://127.0.0.1:0").start()
    try:
        remote = RemotePolicy(srv.endpoint, timeout_s=5)
        images = [np.random.default_rng(i).integers(0, 256, (1, 16, width, 3), np.uint8) for i in range(3)]
        for img in images:  # copied when sent below the threshold, zero-copy above it
            remote.update_observation({"observation.images.cam": img})
            remote.predict_action_chunk()
        assert len(policy.received) == 3
        for sent, got in zip(images, policy.received, strict=True):
            np.testing.assert_array_equal(got, sent)
        remote.close()
    finally:
        srv.stop()
