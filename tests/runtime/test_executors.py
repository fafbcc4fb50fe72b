"""Executors against closed-form expectations: receding horizon, temporal ensembling (ACT), asynchronous
execution with simulated and measured delays, RTC weights/guidance, and per-episode resets."""

import threading
import time

import numpy as np
import pytest
import torch

from policylink.adapters.capabilities import ChunkPrefix, Guidance, GuidedSampler, PrefixConditioned
from policylink.adapters.policy import HistoryPolicy
from policylink.adapters.schema import ActionSpec, FeatureSpec, PolicySpec
from policylink.policies.common.rtc import rtc_guidance
from policylink.runtime.executors import (
    AsyncExecutor,
    ChunkQueue,
    ExecutorConfig,
    ExecutorConfigError,
    LatencyConfig,
    PolicyStoppedAnswering,
    RecedingHorizonExecutor,
    TemporalEnsembleExecutor,
    make_executor,
    rtc_weights,
)
from policylink.runtime.executors.rtc import guidance_scale

STATE = "observation.state"


def _spec(chunk_size: int, n_action_steps: int) -> PolicySpec:
    # state = (episode tag, time step); action = (obs time the chunk was planned from, planned time of the action)
    return PolicySpec(
        {STATE: FeatureSpec("float32", (2,))},
        ActionSpec(("src", "t"), "ee_delta", ("1", "1"), (-1e6, -1e6), (1e6, 1e6)),
        n_obs_steps=1,
        chunk_size=chunk_size,
        n_action_steps=n_action_steps,
        control_frequency=10.0,
    )


class ClockPolicy(HistoryPolicy):
    """chunk[b, i] = (tag*1000 + T, T + i) for the newest observation (tag, T): a correctly aligned executor
    always executes action[1] == the current step, and action[0] says which observation planned it."""

    def __init__(self, chunk_size=8, n_action_steps=4, delay_s=0.0):
        super().__init__(_spec(chunk_size, n_action_steps))
        self.calls = 0
        self.delay_s = delay_s

    def _predict(self, history, pad_mask, tasks):
        self.calls += 1
        if self.delay_s:
            time.sleep(self.delay_s)
        obs = history[STATE][:, -1]  # (B, 2)
        h = self.spec.chunk_size
        src = obs[:, 0] * 1000 + obs[:, 1]
        return np.stack([np.repeat(src[:, None], h, 1), obs[:, 1:2] + np.arange(h)[None]], -1).astype(np.float32)


class RecordingPolicy(ClockPolicy):
    """ClockPolicy that records the rows of every chunk request (None = all), the threads of every policy call,
    and how many calls overlapped another one."""

    def __init__(self, chunk_size=8, n_action_steps=4, delay_s=0.0):
        super().__init__(chunk_size, n_action_steps, delay_s)
        self.requests, self.threads, self.overlaps, self._busy = [], set(), 0, False

    def _call(self, fn, *args):
        self.threads.add(threading.current_thread().name)
        self.overlaps += self._busy
        self._busy = True
        try:
            return fn(*args)
        finally:
            self._busy = False

    def reset(self, env_ids=None):
        return self._call(super().reset, env_ids)

    def update_observation(self, obs_batch):
        return self._call(super().update_observation, obs_batch)

    def predict_action_chunk(self, env_ids=None):
        self.requests.append(None if env_ids is None else list(env_ids))
        return self._call(super().predict_action_chunk, env_ids)


class GuidedClockPolicy(RecordingPolicy):
    """A GuidedSampler whose guidance hook sees the planned chunk as ``out`` (and ``x_t``)."""

    sampler = None

    def sample(self, obs=None, *, guidance=None, num_steps=None, noise=None, return_trajectory=False, env_ids=None):
        if obs is None:
            obs = self.rows(env_ids)[0]
        self.requests.append(("sample", obs[STATE].shape[0]))
        chunk = self._predict(obs, None, None)
        return chunk if guidance is None else guidance(chunk, None, chunk, None, self)

    def normalize_actions(self, actions):
        return actions

    def unnormalize_actions(self, actions):
        return np.asarray(actions, np.float32)


class PrefixClockPolicy(RecordingPolicy):
    """PrefixConditioned: records each prefix, then plans as ClockPolicy."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.prefixes = []

    def predict_action_chunk_with_prefix(self, prefix, env_ids=None):
        self.prefixes.append((prefix, env_ids))
        return self.predict_action_chunk(env_ids)


class CountingPolicy(HistoryPolicy):
    """Constant chunks: the k-th call (k = 0, 1, ...) returns value k everywhere (the closed-form case)."""

    def __init__(self, chunk_size=4):
        super().__init__(_spec(chunk_size, 1))
        self.calls = 0

    def _predict(self, history, pad_mask, tasks):
        b = history[STATE].shape[0]
        out = np.full((b, self.spec.chunk_size, 2), float(self.calls), np.float32)
        self.calls += 1
        return out


def _obs(tags, t):
    tags = np.asarray(tags, np.float32)
    return {STATE: np.stack([tags, np.full_like(tags, t)], -1)}


def _run(executor, steps, batch=1, tags=None):
    tags = np.zeros(batch) if tags is None else tags
    return np.stack([executor.act(_obs(tags, t)) for t in range(steps)])  # (T, B, A)


def test_receding_horizon_executes_n_steps_then_replans():
    policy = ClockPolicy(chunk_size=8, n_action_steps=3)
    ex = make_executor(policy, ExecutorConfig(kind="receding_horizon"))
    assert isinstance(ex, RecedingHorizonExecutor)
    acts = _run(ex, 9)
    np.testing.assert_array_equal(acts[:, 0, 1], np.arange(9))  # aligned: action planned for step t
    np.testing.assert_array_equal(acts[:, 0, 0], [0, 0, 0, 3, 3, 3, 6, 6, 6])  # re-plan every 3 steps
    assert policy.calls == 3 and ex.inferences.tolist() == [3]


def test_receding_horizon_rejects_n_action_steps_beyond_chunk():
    with pytest.raises(
        ExecutorConfigError,
        match=r"n_action_steps: expected <= the policy's chunk_size \(8\), "
        r"received 9",
    ):
        make_executor(ClockPolicy(chunk_size=8), ExecutorConfig(n_action_steps=9))
    with pytest.raises(ExecutorConfigError, match="executor.kind"):
        ExecutorConfig(kind="chunky")


@pytest.mark.parametrize("m", [0.0, 0.5, -0.3])
def test_temporal_ensemble_matches_closed_form(m):
    h, steps = 4, 10
    ex = make_executor(CountingPolicy(chunk_size=h), ExecutorConfig(kind="temporal_ensemble", ensemble_m=m))
    assert isinstance(ex, TemporalEnsembleExecutor)
    acts = _run(ex, steps)[:, 0, 0]
    for t in range(steps):
        n = min(t + 1, h)
        values = np.arange(t - n + 1, t + 1, dtype=np.float64)  # c_s = s, oldest first
        w = np.exp(-m * np.arange(n))
        assert acts[t] == pytest.approx(np.dot(w, values) / w.sum(), rel=1e-6), t
    if m == 0.0:  # plain mean of the last 4 predictions: step 9 averages 6, 7, 8, 9
        assert acts[9] == pytest.approx(7.5)


def test_temporal_ensemble_with_a_query_period_blends_the_predictions_in_reach():
    # h = 4, a query every 2 steps (t = 0, 2, 4, ...), m = 0: step t averages the chunks of queries q <= t < q + 4
    cfg = ExecutorConfig(kind="temporal_ensemble", ensemble_m=0.0, n_action_steps=2)
    ex = make_executor(CountingPolicy(chunk_size=4), cfg)
    acts = _run(ex, 8)[:, 0, 0]
    np.testing.assert_allclose(acts, [0, 0, 1, 1, 3, 3, 5, 5])  # {0}, {0}, {0, 2}, {0, 2}, {2, 4}, ...
    assert ex.inferences.tolist() == [4]


def test_async_with_simulated_delay_drops_passed_actions():
    policy = ClockPolicy(chunk_size=8, n_action_steps=4)
    cfg = ExecutorConfig(kind="async", n_action_steps=4, latency=LatencyConfig(mode="fixed", steps=2))
    ex = make_executor(policy, cfg)
    assert isinstance(ex, AsyncExecutor) and not ex.uses_rtc
    acts = _run(ex, 14)[:, 0]
    ex.close()
    t = np.arange(14)
    np.testing.assert_array_equal(acts[:, 1], t)  # never late: the action for step t is executed at step t
    src = np.where(t < 6, 0, 4 * ((t - 2) // 4))  # triggers at 4, 8, 12; each used from 2 steps later
    np.testing.assert_array_equal(acts[:, 0], src)


def test_async_without_delay_equals_receding_horizon():
    a = _run(make_executor(ClockPolicy(8, 4), ExecutorConfig(kind="async", latency=LatencyConfig("fixed", 0))), 12)
    b = _run(make_executor(ClockPolicy(8, 4), ExecutorConfig(kind="receding_horizon")), 12)
    np.testing.assert_array_equal(a, b)


def test_async_rejects_delays_the_chunk_cannot_cover():
    with pytest.raises(
        ExecutorConfigError,
        match=r"n_action_steps \+ latency: expected <= chunk_size \(8\), "
        r"received 6 \+ 3",
    ):
        make_executor(ClockPolicy(8, 6), ExecutorConfig(kind="async", latency=LatencyConfig("uniform", low=1, high=3)))
    with pytest.raises(ExecutorConfigError, match=r"delay <= n_action_steps \(2\)"):
        make_executor(ClockPolicy(8, 2), ExecutorConfig(kind="async", latency=LatencyConfig("fixed", 3)))


def test_async_thread_aligns_by_measured_delay():
    # inference takes ~30 ms, a control step ~10 ms: chunks arrive ~3 steps after their trigger
    policy = ClockPolicy(chunk_size=16, n_action_steps=6, delay_s=0.03)
    ex = make_executor(policy, ExecutorConfig(kind="async"))
    acts = []
    for t in range(30):
        acts.append(ex.act(_obs([0], t))[0])
        time.sleep(0.01)
    ex.close()
    acts = np.array(acts)
    np.testing.assert_array_equal(acts[:, 1], np.arange(30))
    lag = acts[:, 1] - acts[:, 0]  # steps between the planning observation and execution
    switched = np.nonzero(np.diff(acts[:, 0]))[0] + 1
    assert len(switched) >= 2 and np.all(lag[switched] >= 1)  # the first actions of each new chunk were dropped


def test_async_stops_at_a_request_unanswered_past_the_reply_timeout_and_closes_without_waiting_for_it():
    class Hangs(ClockPolicy):  # answers the first request only, then waits for `hang`
        def _predict(self, history, pad_mask, tasks):
            if self.calls:
                hang.wait(10.0)
            return super()._predict(history, pad_mask, tasks)

    hang, now = threading.Event(), [0.0]
    ex = make_executor(Hangs(chunk_size=16, n_action_steps=2), ExecutorConfig(kind="async"))
    with pytest.raises(ValueError, match=r"timeout_s: expected a finite number of seconds > 0, received 0"):
        ex.watch_replies(0.0)
    ex.watch_replies(0.5, clock=lambda: now[0])
    acts = []
    with pytest.raises(PolicyStoppedAnswering, match=r"for 625 ms \(limit 500 ms\); its last reply came 875 ms ago"):
        for t in range(16):  # steps of 0.125 s; the request sent at 0.25 s is overdue at 0.875 s
            acts.append(ex.act(_obs([0], t))[0, 1])
            now[0] += 0.125
    started = time.monotonic()
    ex.close()
    hang.set()
    assert acts == list(range(7)) and time.monotonic() - started < 5.0


@pytest.mark.parametrize("kind", ["receding_horizon", "temporal_ensemble", "async"])
def test_reset_clears_only_that_episode(kind):
    policy = RecordingPolicy(chunk_size=8, n_action_steps=4)
    lat = LatencyConfig("fixed", 2) if kind == "async" else LatencyConfig()
    ex = make_executor(policy, ExecutorConfig(kind=kind, latency=lat))
    tags = np.array([0.0, 0.0])
    actions = []
    for t in range(12):
        if t == 5:  # row 1 starts episode 1 mid-chunk (and, for async, with a chunk in flight)
            ex.reset([1])
            tags = np.array([0.0, 1.0])
        actions.append(ex.act(_obs(tags, t)))
    ex.close()
    actions = np.array(actions)
    episode = actions[:, :, 0] // 1000
    np.testing.assert_array_equal(episode[5:, 1], 1)  # never an action planned in episode 0
    np.testing.assert_array_equal(episode[:, 0], 0)
    np.testing.assert_array_equal(actions[:, 0, 1], np.arange(12))
    np.testing.assert_array_equal(actions[:, 1, 1], np.arange(12))
    if kind != "temporal_ensemble":
        np.testing.assert_array_equal(actions[5, 1, 0], 1000 + 5)  # planned from the new episode's first obs
        # row 0 is untouched: receding keeps its chunk planned at step 4; async switches to it at 4 + d = 6
        expected = [4, 4, 4] if kind == "receding_horizon" else [0, 4, 4]
        np.testing.assert_array_equal(actions[5:8, 0, 0], expected)
    assert ex.inferences[1] >= 1 and ex.stall_steps.shape == (2,)
    # only the rows that need a plan are inferred: the reset row alone at step 5, then each row on its own phase
    expected = {"receding_horizon": [None, None, [1], [0], [1]], "async": [None, None, [1], [0], [1]]}
    assert policy.requests == expected.get(kind, [None] * 12)
    with pytest.raises(IndexError, match=r"env_ids: expected indices in \[0, 2\), received \[2\]"):
        ex.reset([2])


def test_rtc_weights_known_values():
    w = rtc_weights(chunk_size=8, delay=2, execution_horizon=3)
    c = np.array([3, 2, 1]) / 4.0  # c_i = (H - s - i) / (H - s - d + 1) for i = 2, 3, 4
    expected = np.concatenate([[1, 1], c * (np.exp(c) - 1) / (np.e - 1), [0, 0, 0]])
    np.testing.assert_allclose(w, expected, rtol=1e-12)
    assert w[2] == pytest.approx(0.75 * (np.exp(0.75) - 1) / (np.e - 1))
    with pytest.raises(ValueError, match="delay=4, execution_horizon=5, chunk_size=8"):
        rtc_weights(8, 4, 5)


def test_rtc_guidance_known_values():
    assert guidance_scale(0.0, 5.0) == 5.0
    # t = 0.5: r^2 = 0.25 / 0.5 = 0.5, (1 - t) / (t r^2) = 0.5 / 0.25 = 2
    assert guidance_scale(0.5, 5.0) == pytest.approx(2.0)
    target = torch.ones(1, 3, 1)
    from policylink.policies.common.samplers import FlowEulerSampler

    g = rtc_guidance(target, torch.tensor([1.0, 0.5, 0.0]), max_guidance=5.0)
    x, v = torch.zeros(1, 3, 1, requires_grad=True), torch.zeros(1, 3, 1)  # v independent of x: identity Jacobian
    out = g(x, torch.tensor([0.5]), v, None, FlowEulerSampler(None))  # a_hat = 0, so v' = 2 * W * (1 - 0)
    np.testing.assert_allclose(out[0, :, 0].numpy(), [2.0, 1.0, 0.0])


def _tiny_flow_policy():
    from policylink.data.normalize import Normalizer
    from policylink.policies.common.unet1d import UNetConfig
    from policylink.policies.processing import processors_for
    from policylink.policies.registry import make_config, make_policy

    cfg = make_config(
        "flow",
        observation_keys=[STATE],
        chunk_size=8,
        n_action_steps=3,
        n_obs_steps=1,
        unet=UNetConfig(down_dims=[16, 32], time_embed_dim=16),
    )
    spec = PolicySpec(
        {STATE: FeatureSpec("float32", (3,))},
        ActionSpec(("x", "y"), "ee_delta", ("m", "m"), (-10, -10), (10, 10)),
        n_obs_steps=1,
        chunk_size=8,
        n_action_steps=3,
        control_frequency=10.0,
    )
    stats = {STATE: {"min": np.zeros(3), "max": np.ones(3)}, "action": {"min": -np.ones(2), "max": np.ones(2)}}
    norm = Normalizer(stats, {STATE: "min_max", "action": "min_max"})
    torch.manual_seed(0)
    chain = processors_for(cfg, spec.observation_features, norm)
    return make_policy("flow", spec=spec, processors=chain, config=cfg, device="cpu", seed=0)


@pytest.mark.slow
def test_rtc_with_a_flow_policy_pins_the_committed_prefix():
    policy = _tiny_flow_policy()  # untrained: its chunks are noise-driven, far from any given target
    policy.update_observation({STATE: np.random.default_rng(0).uniform(0, 1, (4, 3)).astype(np.float32)})
    committed = np.random.default_rng(1).uniform(-1, 1, (4, 8, 2)).astype(np.float32)
    weights = np.broadcast_to(rtc_weights(8, 2, 3), (4, 8))
    policy.reseed(5)
    guided = policy.predict_action_chunk_with_prefix(ChunkPrefix(committed, weights.astype(np.float32), 5.0))
    policy.reseed(5)
    free = policy.sample(policy.history)
    err_guided = np.abs(guided[:, :2] - committed[:, :2]).mean()  # frozen prefix: W = 1
    err_free = np.abs(free[:, :2] - committed[:, :2]).mean()
    assert err_guided < 0.1 and err_guided < 0.1 * err_free
    mid_guided = np.abs(guided[:, 2:5] - committed[:, 2:5]).mean()  # decaying weights: pulled part-way
    assert mid_guided < np.abs(free[:, 2:5] - committed[:, 2:5]).mean()


@pytest.mark.slow
def test_async_uses_rtc_with_a_flow_policy():
    ex = make_executor(_tiny_flow_policy(), ExecutorConfig(kind="async", latency=LatencyConfig("fixed", 2)))
    assert ex.uses_rtc
    rng = np.random.default_rng(2)
    acts = np.array([ex.act({STATE: rng.uniform(0, 1, (2, 3)).astype(np.float32)}) for _ in range(9)])
    ex.close()
    assert acts.shape == (9, 2, 2) and ex.inferences.tolist() == [3, 3]  # t = 0 (blocking), triggers at 3, 6


def test_chunk_queue_keeps_full_chunks_and_never_pops_a_dropped_action():
    q = ChunkQueue(batch_size=2, chunk_size=4, action_dim=1)
    assert q.needs_plan().tolist() == [True, True]
    q.install([0, 1], np.arange(8, dtype=np.float32).reshape(2, 4, 1), offset=0, limit=2)
    assert q.pop()[:, 0].tolist() == [0, 4] and q.pop()[:, 0].tolist() == [1, 5]
    assert q.needs_plan().tolist() == [True, True]  # limit 2 reached; the tail is still there
    actions, valid = q.remaining([1])
    np.testing.assert_array_equal(actions[0, :, 0], [6, 7, 0, 0])
    np.testing.assert_array_equal(valid[0], [True, True, False, False])
    epochs = q.epoch.copy()
    q.truncate([1])
    assert q.epoch.tolist() == [epochs[0], epochs[1] + 1] and not q.remaining([1])[1].any()
    with pytest.raises(RuntimeError, match=r"rows \[1\] have none"):
        q.pop()
    q.reset([0])
    assert q.episode.tolist() == [1, 0] and q.offset.tolist() == [0, 2]
    with pytest.raises(ValueError, match=r"expected chunks of shape \(1, 4, 1\), received \(1, 3, 1\)"):
        q.install([0], np.zeros((1, 3, 1)), offset=0, limit=1)
    with pytest.raises(IndexError, match=r"env_ids: expected indices in \[0, 2\), received \[3\]"):
        q.truncate([3])


def test_receding_truncate_never_executes_a_dropped_action():
    policy = RecordingPolicy(chunk_size=8, n_action_steps=4)
    ex = make_executor(policy, ExecutorConfig(kind="receding_horizon"))
    acts = []
    for t in range(10):
        acts.append(ex.act(_obs([0, 0], t)))
        if t == 1:
            ex.truncate([0])  # row 0 drops (0, 2) and (0, 3) of its chunk planned at step 0
    acts = np.array(acts)
    np.testing.assert_array_equal(acts[:, 0, 0], [0, 0, 2, 2, 2, 2, 6, 6, 6, 6])
    np.testing.assert_array_equal(acts[:, 1, 0], [0, 0, 0, 0, 4, 4, 4, 4, 8, 8])
    np.testing.assert_array_equal(acts[:, :, 1], np.repeat(np.arange(10)[:, None], 2, 1))
    assert policy.requests == [None, [0], [1], [0], [1]]  # only the rows that need a plan
    assert ex.inferences.tolist() == [3, 3]  # row 0: steps 0, 2, 6; row 1: 0, 4, 8


def test_temporal_ensemble_truncate_restarts_the_blend():
    ex = make_executor(CountingPolicy(chunk_size=4), ExecutorConfig(kind="temporal_ensemble", ensemble_m=0.0))
    acts = [ex.act(_obs([0], t))[0, 0] for t in range(3)]  # means of 0; 0, 1; 0, 1, 2
    ex.truncate()
    acts += [ex.act(_obs([0], t))[0, 0] for t in range(3, 5)]  # 3 alone; then 3, 4
    np.testing.assert_allclose(acts, [0.0, 0.5, 1.0, 3.0, 3.5])


def test_replan_with_guidance_samples_only_those_rows():
    policy = GuidedClockPolicy(chunk_size=8, n_action_steps=3)
    assert isinstance(policy, GuidedSampler)
    ex = make_executor(policy, ExecutorConfig(kind="receding_horizon"))
    acts = [ex.act(_obs([0, 0], 0)), ex.act(_obs([0, 0], 1))]
    shift = Guidance(lambda x_t, t, out, cond, model: out + 100.0)
    assert ex.replan([1], guidance=shift) is True
    acts += [ex.act(_obs([0, 0], t)) for t in range(2, 5)]
    acts = np.array(acts)
    # row 1: planned from step 1 with +100, read from index 1 (step 1's action was already executed)
    np.testing.assert_array_equal(acts[2:, 1], [[101, 102], [101, 103], [4, 4]])
    np.testing.assert_array_equal(acts[:, 0], [[0, 0], [0, 1], [0, 2], [3, 3], [3, 4]])
    assert policy.requests == [None, ("sample", 1), [0], [1]]
    assert ex.inferences.tolist() == [2, 3]

    plain = RecordingPolicy(chunk_size=8, n_action_steps=3)
    ex = make_executor(plain, ExecutorConfig(kind="receding_horizon"))
    ex.act(_obs([0, 0], 0))
    assert ex.replan([1], guidance=shift) is False  # not a GuidedSampler: a plain plan of row 1
    assert plain.requests == [None, [1]] and ex.act(_obs([0, 0], 1))[1].tolist() == [0, 1]
    with pytest.raises(RuntimeError, match="replan: no observation yet"):
        make_executor(plain, ExecutorConfig()).replan([0])


def _async_with_midflight_edits(delay_s):
    policy = RecordingPolicy(chunk_size=8, n_action_steps=4, delay_s=delay_s)
    ex = make_executor(policy, ExecutorConfig(kind="async", latency=LatencyConfig("fixed", 2)))
    acts = []
    for t in range(14):
        acts.append(ex.act(_obs([0, 0], t)))
        if t == 5:  # the request triggered at step 4 is in flight until step 6
            ex.truncate([0])
            assert ex.replan([1]) is False
    ex.close()
    return np.array(acts), policy, ex


def test_async_truncate_and_replan_during_inflight_inference_are_serialised_and_deterministic():
    acts, policy, ex = _async_with_midflight_edits(delay_s=0.02)
    # row 0: truncated -> blocking plan at 6 -> trigger at 10 (ready 12); the step-4 chunk is never executed
    np.testing.assert_array_equal(acts[:, 0, 0], [0] * 6 + [6] * 6 + [10] * 2)
    # row 1: replanned from step 5 (read from index 1) -> trigger at 9 (ready 11)
    np.testing.assert_array_equal(acts[:, 1, 0], [0] * 6 + [5] * 5 + [9] * 3)
    np.testing.assert_array_equal(acts[:, :, 1], np.repeat(np.arange(14)[:, None], 2, 1))
    assert policy.requests == [None, None, [1], [0], [1], [0], [1]]
    assert ex.inferences.tolist() == [3, 3] and ex.stall_steps.tolist() == [4, 4]
    # every policy call ran on the one inference worker, never two at once
    assert policy.overlaps == 0 and len(policy.threads) == 1
    assert next(iter(policy.threads)).startswith("policylink-infer")
    fast, fast_policy, _ = _async_with_midflight_edits(delay_s=0.0)
    np.testing.assert_array_equal(fast, acts)
    assert fast_policy.requests == policy.requests


def test_async_rtc_sends_the_committed_prefix():
    policy = PrefixClockPolicy(chunk_size=8, n_action_steps=4)
    assert isinstance(policy, PrefixConditioned)
    ex = make_executor(policy, ExecutorConfig(kind="async", latency=LatencyConfig("fixed", 2), rtc_max_guidance=3.0))
    assert ex.uses_rtc
    acts = _run(ex, 7)[:, 0]
    ex.close()
    np.testing.assert_array_equal(acts[:, 0], [0, 0, 0, 0, 0, 0, 4])  # same timing as without RTC
    [(prefix, env_ids)] = policy.prefixes  # the trigger at step 4 (the first chunk has no prefix)
    assert env_ids is None and prefix.max_guidance == 3.0
    np.testing.assert_array_equal(prefix.actions[0], [[0, 4], [0, 5], [0, 6], [0, 7]] + [[0, 0]] * 4)
    c = np.array([2.0, 1.0]) / 3.0  # rtc_weights(H=8, d=2, s=4): 1, 1, c (e^c - 1) / (e - 1), 0...
    expected = np.concatenate([[1.0, 1.0], c * np.expm1(c) / (np.e - 1), np.zeros(4)])
    np.testing.assert_allclose(prefix.weights[0], expected, rtol=1e-6)
    no_rtc = make_executor(policy, ExecutorConfig(kind="async", rtc=False))
    assert not no_rtc.uses_rtc
    no_rtc.close()


@pytest.mark.slow
def test_replan_with_guidance_on_a_flow_policy_samples_only_that_row():
    policy = _tiny_flow_policy()
    assert isinstance(policy, GuidedSampler)
    ex = make_executor(policy, ExecutorConfig(kind="receding_horizon"))
    rng = np.random.default_rng(3)
    ex.act({STATE: rng.uniform(0, 1, (2, 3)).astype(np.float32)})
    shapes = []

    def hook(x_t, t, out, cond, model):
        shapes.append((tuple(x_t.shape), x_t.requires_grad))
        return out

    assert ex.replan([1], guidance=Guidance(hook, autograd=True)) is True
    assert shapes and set(shapes) == {((1, 8, 2), True)}  # row 1 only, with autograd
    assert ex.inferences.tolist() == [1, 2] and ex.queue.offset.tolist() == [1, 1]
