"""Real-time chunking by replacement inpainting (``executor.rtc_method: inpaint``): the prefix mask, the exact
inpainted prefix of the flow sampler, the async executor's start index and prefix at a known delay, and the method
carried over the wire."""

import numpy as np
import pytest
import torch

from policylink.adapters.capabilities import ChunkPrefix
from policylink.adapters.transport import PolicyServer, RemotePolicy
from policylink.policies.common.rtc import inpaint_guidance, inpaint_weights
from policylink.policies.common.samplers import FlowEulerSampler
from policylink.runtime.executors import ExecutorConfig, ExecutorConfigError, LatencyConfig, make_executor
from tests.runtime.test_executors import STATE, PrefixClockPolicy, _run, _tiny_flow_policy


class InpaintingClockPolicy(PrefixClockPolicy):
    """ClockPolicy chunks with the prefix applied as the inpainting policy does: ``w * prefix + (1 - w) * chunk``."""

    def predict_action_chunk_with_prefix(self, prefix, env_ids=None):
        chunk = super().predict_action_chunk_with_prefix(prefix, env_ids)
        w = prefix.weights[:, :, None]
        return (w * prefix.actions + (1 - w) * chunk).astype(np.float32)


def test_inpaint_weights_mask_exactly_the_delayed_steps():
    np.testing.assert_array_equal(inpaint_weights(8, 3), [1, 1, 1, 0, 0, 0, 0, 0])
    np.testing.assert_array_equal(inpaint_weights(4, 0), [0, 0, 0, 0])
    with pytest.raises(ValueError, match="delay=9, chunk_size=8"):
        inpaint_weights(8, 9)


def test_inpainted_flow_sample_reproduces_the_committed_prefix_exactly():
    # a position-wise velocity field (v = 2 - x): without coupling the free steps are the unguided sample's
    sampler = FlowEulerSampler(lambda x, t, cond: 2.0 - x, num_steps=3)
    noise = torch.randn(2, 6, 2, generator=torch.Generator().manual_seed(0))
    target = torch.arange(24, dtype=torch.float32).reshape(2, 6, 2) / 10
    weights = torch.tensor(inpaint_weights(6, 2), dtype=torch.float32)
    guide = inpaint_guidance(target, weights)
    assert not guide.autograd  # no vector-Jacobian product: the cost of a plain sample
    out = sampler.sample(None, noise, guidance=guide)
    free = sampler.sample(None, noise)
    torch.testing.assert_close(out[:, :2], target[:, :2], atol=1e-6, rtol=0)
    torch.testing.assert_close(out[:, 2:], free[:, 2:], atol=1e-6, rtol=0)
    # free path: x0 = eps, v = 2 - x, three Euler steps of 1/3: x3 = 2 + (eps - 2) (2/3)^3
    torch.testing.assert_close(free, 2 + (noise - 2) * (2 / 3) ** 3, atol=1e-6, rtol=0)


def test_inpainted_flow_policy_chunk_starts_with_the_committed_actions():
    policy = _tiny_flow_policy()  # untrained U-Net: its free chunks are nowhere near the committed actions
    policy.update_observation({STATE: np.random.default_rng(0).uniform(0, 1, (3, 3)).astype(np.float32)})
    committed = np.random.default_rng(1).uniform(-0.8, 0.8, (3, 8, 2)).astype(np.float32)
    weights = np.tile(inpaint_weights(8, 2), (3, 1)).astype(np.float32)
    weights[2] = 0.0  # a row with nothing committed is sampled freely
    policy.reseed(5)
    got = policy.predict_action_chunk_with_prefix(ChunkPrefix(committed, weights, method="inpaint"))
    policy.reseed(5)
    free = policy.sample(policy.history)
    np.testing.assert_allclose(got[:2, :2], committed[:2, :2], atol=1e-5)
    assert np.abs(free[:2, :2] - committed[:2, :2]).mean() > 0.1
    np.testing.assert_allclose(got[2], free[2], atol=1e-5)


def test_async_inpaint_starts_the_new_chunk_at_the_delay_and_sends_the_hard_mask():
    policy = InpaintingClockPolicy(chunk_size=8, n_action_steps=4)
    cfg = ExecutorConfig(kind="async", latency=LatencyConfig("fixed", 2), rtc_method="inpaint")
    ex = make_executor(policy, cfg)
    assert ex.uses_rtc
    acts = _run(ex, 8)[:, 0]  # (T, A): action = (step that planned it, step it was planned for)
    ex.close()
    # trigger at step 4 (s = 4), ready d = 2 steps later: steps 4, 5 run the old chunk's indices 4, 5, then the
    # new chunk from its index 2 (planned for step 6): nothing executed late, nothing skipped
    np.testing.assert_array_equal(acts, [[0, t] for t in range(6)] + [[4, 6], [4, 7]])
    [(prefix, env_ids)] = policy.prefixes
    assert env_ids is None and prefix.method == "inpaint"
    np.testing.assert_array_equal(prefix.weights[0], [1, 1, 0, 0, 0, 0, 0, 0])
    np.testing.assert_array_equal(prefix.actions[0], [[0, 4], [0, 5], [0, 6], [0, 7]] + [[0, 0]] * 4)
    # the new chunk's first two actions (never executed) are the committed ones, the rest its own
    np.testing.assert_array_equal(ex.queue.chunks[0, :3], [[0, 4], [0, 5], [4, 6]])


def test_rtc_method_is_checked_by_name():
    with pytest.raises(ExecutorConfigError, match="executor.rtc_method.*'inpaint'"):
        ExecutorConfig(kind="async", rtc_method="inpaint_")
    with pytest.raises(ValueError, match="prefix.method"):
        ChunkPrefix(np.zeros((1, 2, 1), np.float32), np.zeros((1, 2), np.float32), method="hard").validate(1, 2, 1)


def test_prefix_method_travels_over_the_wire():
    from tests.adapters.test_transport_capabilities import SeededRTCPolicy, _obs, _prefix

    class MethodRecorder(SeededRTCPolicy):
        def predict_action_chunk_with_prefix(self, prefix, env_ids=None):
            self.methods = [*getattr(self, "methods", []), prefix.method]
            return super().predict_action_chunk_with_prefix(prefix, env_ids)

    srv = PolicyServer(MethodRecorder(seed=7), "tcp://127.0.0.1:0").start()
    try:
        remote = RemotePolicy(srv.endpoint, timeout_s=5)
        remote.update_observation(_obs([0, 0], [1, 1], [2, 2]))
        for method in ("inpaint", "guidance"):
            p = _prefix(3)
            remote.predict_action_chunk_with_prefix(ChunkPrefix(p.actions, p.weights, 5.0, method))
        assert srv.policy.methods == ["inpaint", "guidance"]
        remote.close()
    finally:
        srv.stop()


def test_measured_delays_give_a_prefix_as_long_as_the_largest_recent_one():
    # without simulated latency the prefix covers max(last DELAY_BUFFER measured delays): a prefix shorter than the
    # real delay would leave an executed action out of it
    from policylink.runtime.executors.asynchronous import DELAY_BUFFER

    policy = InpaintingClockPolicy(chunk_size=8, n_action_steps=2)
    ex = make_executor(policy, ExecutorConfig(kind="async", rtc_method="inpaint"))
    _run(ex, 1)  # the blocking first chunk
    assert ex._prefix(np.array([0]), delay=-1).weights[0].tolist() == [0] * 8  # nothing measured yet
    ex._delays.extend([1, 3, 2])
    np.testing.assert_array_equal(ex._prefix(np.array([0]), delay=-1).weights[0], [1, 1, 1, 0, 0, 0, 0, 0])
    ex._delays.extend([1] * DELAY_BUFFER)  # the 3 has left the buffer
    np.testing.assert_array_equal(ex._prefix(np.array([0]), delay=-1).weights[0], [1, 0, 0, 0, 0, 0, 0, 0])
    ex.close()
