"""The corrective executor with a clock policy and a toy monitor whose answers are known: a persistent latent
shift triggers exactly one truncation at a known step, a dropped action is never executed, nothing crosses an
episode reset, calls are counted per episode, and the executor config is validated before any episode runs."""

import numpy as np
import pytest
import torch

from policylink.adapters.policy import HistoryPolicy
from policylink.adapters.schema import ActionSpec, FeatureSpec, PolicySpec
from policylink.policies.corrector.calibration import ConformalThresholds, DetectorConfig
from policylink.policies.corrector.config import CorrectiveConfig
from policylink.runtime.executors import CorrectiveExecutor, ExecutorConfig, ExecutorConfigError, make_executor
from policylink.runtime.executors.base import executor_problems

STATE = "observation.state"
H, K = 8, 2


class EmbedClock(HistoryPolicy):
    """state = (episode tag, time T, shift); chunk[b, i] = (tag * 1000 + T, T + i); latent = (T, shift)."""

    def __init__(self, latent_dim=2):
        super().__init__(
            PolicySpec(
                {STATE: FeatureSpec("float32", (3,))},
                ActionSpec(("src", "t"), "ee_delta", ("1", "1"), (-1e6, -1e6), (1e6, 1e6)),
                n_obs_steps=1,
                chunk_size=H,
                n_action_steps=H,
                control_frequency=10.0,
            )
        )
        self.latent_dim = latent_dim
        self.calls = []

    def embed(self, obs=None, env_ids=None):
        s = self.history[STATE][:, -1]
        return s[:, 1:].astype(np.float32)

    def _predict(self, history, pad_mask, tasks):
        obs = history[STATE][:, -1]
        self.calls.append(obs[:, 1].tolist())
        src = obs[:, 0] * 1000 + obs[:, 1]
        return np.stack([np.repeat(src[:, None], H, 1), obs[:, 1:2] + np.arange(H)[None]], -1).astype(np.float32)


class ClockMonitor(torch.nn.Module):
    """Predicts the latent change (k, 0) over k steps: time advances, no shift."""

    horizon, latent_dim, action_dim = K, 2, 2

    def forward(self, z, actions):
        return torch.tensor([float(K), 0.0]).repeat(len(z), 1)


def _executor(policy=None, **detector):
    det = DetectorConfig(ewma=1.0, persistence_m=2, window=2, cooldown=0, **detector)
    cfg = ExecutorConfig(kind="corrective", corrective=CorrectiveConfig(detector=det, guidance_scale=0.0))
    thr = ConformalThresholds(np.full(H, 0.5), 0.05, np.full(H, 100), 1.0)
    return CorrectiveExecutor(policy or EmbedClock(), cfg, monitor=ClockMonitor(), thresholds=thr)


def _obs(tags, t, shift):
    return {STATE: np.array([[g, t_, s] for g, t_, s in zip(tags, t, shift, strict=True)], np.float32)}


def test_persistent_shift_truncates_once_and_never_executes_a_dropped_action():
    ex = _executor()
    executed = []
    for t in range(14):
        shift = 0.0 if t < 5 else 40.0  # the object is displaced at step 5 and stays there
        executed.append(ex.act(_obs([0], [t], [shift]))[0].tolist())
    # scores: steps 5 and 6 see the shift inside z_t - z_{t-2} (1 - cos > 0.5), step 7 does not: fire at step 6
    assert ex.triggers.tolist() == [1]
    assert ex.truncation_offsets == [[6]]  # the chunk planned at step 0 was cut at its index 6
    assert ex.policy.calls == [[0], [6]]  # planned at 0, re-planned at 6 (that chunk covers steps 6-13)
    for t, (src, at) in enumerate(executed):
        assert at == t  # every executed action is the one planned for this step
        assert src == (0 if t < 6 else 6)  # from step 6 on only the new chunk: index 6, 7 of the old one dropped
    fired = [(step, f) for step, _, _, f in ex.trace[0] if f]
    assert fired == [(6, True)]
    assert ex.inferences.tolist() == [2]
    assert 0 < ex.monitor_cost_ratio() < float("inf")


def test_isolated_latent_spike_does_not_truncate():
    ex = _executor()
    for t in range(14):
        ex.act(_obs([0], [t], [40.0 if t == 5 else 0.0]))  # one glitched observation
    # the spike enters z_t - z_{t-2} at steps 5 (+40) and 7 (-40) but not at 6: never 2 of 2 steps
    assert ex.triggers.tolist() == [0]
    assert ex.policy.calls == [[0], [8]]  # only the chunk boundaries


def test_truncation_never_crosses_an_episode_reset():
    ex = _executor()
    for t in range(5):
        ex.act(_obs([0, 0], [t, t], [0.0, 0.0]))
    ex.reset([0])  # row 0: new episode (tag 1) whose time restarts at 0 (a jump a shared history would flag)
    acts = [ex.act(_obs([1, 0], [t, 5 + t], [0.0, 0.0])) for t in range(6)]
    assert ex.triggers.tolist() == [0, 0]
    assert acts[0][0].tolist() == [1000.0, 0.0]  # the new episode's own plan, not the old chunk's index 5
    assert [a[1].tolist() for a in acts[:3]] == [[0.0, 5.0], [0.0, 6.0], [0.0, 7.0]]  # row 1 untouched
    assert [s for s, *_ in ex.trace[0]] == [2, 3, 4, 5]  # scored only once k = 2 steps of the new episode exist
    assert ex.inferences.tolist() == [1, 2]  # row 1 (11 steps) crossed its chunk boundary at step 8
    assert (ex.policy_calls, ex.policy_rows) == (3, 4)  # both rows at step 0, then each row alone


def test_monitor_only_scores_but_never_truncates():
    det = DetectorConfig(ewma=1.0, persistence_m=2, window=2, cooldown=0)
    cfg = ExecutorConfig(kind="corrective", corrective=CorrectiveConfig(detector=det, monitor_only=True))
    thr = ConformalThresholds(np.full(H, 0.5), 0.05, np.full(H, 100), 1.0)
    ex = CorrectiveExecutor(EmbedClock(), cfg, monitor=ClockMonitor(), thresholds=thr)
    for t in range(10):
        ex.act(_obs([0], [t], [0.0 if t < 5 else 40.0]))
    assert ex.triggers.tolist() == [0] and ex.inferences.tolist() == [2]  # only the chunk boundary at 8
    assert sum(s > th for _, s, th, _ in ex.trace[0]) == 2  # steps 5 and 6 exceeded


def test_config_is_validated_before_any_episode():
    with pytest.raises(ExecutorConfigError, match="corrective.monitor"):
        make_executor(EmbedClock(), ExecutorConfig(kind="corrective"))
    with pytest.raises(ExecutorConfigError, match="monitor folder"):
        make_executor(EmbedClock(), ExecutorConfig(kind="corrective", corrective=CorrectiveConfig(monitor="/nope")))
    thr = ConformalThresholds(np.full(H, 0.5), 0.05, np.full(H, 100), 0.35)
    other = r"^executor.corrective.monitor: expected latent_dim 5 \(the policy's\), received 2 \(a monitor of another"
    with pytest.raises(ExecutorConfigError, match=other + r" policy\?\)$"):
        CorrectiveExecutor(EmbedClock(latent_dim=5), ExecutorConfig(kind="corrective"), ClockMonitor(), thr)
    wide = type("WideMonitor", (ClockMonitor,), {"action_dim": 3})()
    with pytest.raises(ExecutorConfigError, match=r"^executor.corrective.monitor: expected action_dim 2 \(the "
                                                  r"policy's\), received 3 "):  # fmt: skip
        CorrectiveExecutor(EmbedClock(), ExecutorConfig(kind="corrective"), wide, thr)
    short = ConformalThresholds(np.full(3, 0.5), 0.05, np.full(3, 100), 0.35)
    with pytest.raises(ExecutorConfigError, match="per-offset thresholds"):
        CorrectiveExecutor(EmbedClock(), ExecutorConfig(kind="corrective"), ClockMonitor(), short)
    with pytest.raises(ExecutorConfigError, match="calibrated"):
        CorrectiveExecutor(EmbedClock(), ExecutorConfig(kind="corrective"), ClockMonitor(), None)
    with pytest.raises(ValueError, match="guidance_scale"):
        CorrectiveConfig(guidance_scale=-1.0)
    with pytest.raises(ExecutorConfigError, match="n_action_steps"):
        CorrectiveExecutor(EmbedClock(), ExecutorConfig(kind="corrective", n_action_steps=H + 1), ClockMonitor(), thr)
    # spec-only problems are found by executor_problems (eval checks every cell with it before any env starts)
    too_short = ExecutorConfig(kind="corrective", corrective=CorrectiveConfig(short_horizon=H + 1))
    assert executor_problems(EmbedClock().spec, too_short) == [
        f"executor.corrective.short_horizon: expected <= the policy's chunk_size ({H}), received {H + 1}"
    ]
    # corrective options with another kind would be silently ignored: an error naming them
    with pytest.raises(ExecutorConfigError, match=r"kind 'async', received corrective.short_horizon$"):
        ExecutorConfig(kind="async", corrective=CorrectiveConfig(short_horizon=2))


def test_non_embedder_policy_is_rejected():
    class Plain(HistoryPolicy):
        def _predict(self, history, pad_mask, tasks):
            raise AssertionError("never called")

    pol = Plain(EmbedClock().spec)
    thr = ConformalThresholds(np.full(H, 0.5), 0.05, np.full(H, 100), 0.35)
    with pytest.raises(ExecutorConfigError, match="embedder"):
        CorrectiveExecutor(pol, ExecutorConfig(kind="corrective"), ClockMonitor(), thr)


def test_report_calls_column_and_monitor_plot(tmp_path):
    from policylink.evaluate import report

    eps = [dict(sum_reward=0.0, max_reward=0.0, success=True, n_steps=10, stall_steps=0, inferences=n) for n in (2, 4)]
    assert report.aggregate_episodes(eps)["avg_calls"] == 3.0
    assert "avg_calls" in report.TABLE_FIELDS
    ex = _executor()
    for t in range(10):
        ex.act(_obs([0], [t], [0.0 if t < 5 else 40.0]))
    path = report.plot_monitor_trace(tmp_path / "trace.png", ex.trace[0])
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _short_executor(dwell, **kw):
    det = DetectorConfig(ewma=1.0, persistence_m=2, window=2, cooldown=0)
    corr = CorrectiveConfig(detector=det, guidance_scale=0.0, short_horizon=1, short_dwell=dwell, **kw)
    thr = ConformalThresholds(np.full(H, 0.5), 0.05, np.full(H, 100), 1.0)
    return CorrectiveExecutor(EmbedClock(), ExecutorConfig(kind="corrective", corrective=corr), ClockMonitor(), thr)


def test_short_horizon_after_a_trigger_then_back_to_whole_chunks():
    ex = _short_executor(dwell=3)
    executed = [ex.act(_obs([0], [t], [0.0 if t < 5 else 40.0]))[0].tolist() for t in range(20)]
    # fires at step 6 (as above); steps 6-9 are the short phase (1 action per chunk), step 10 plans a whole chunk
    assert ex.triggers.tolist() == [1]
    assert ex.policy.calls == [[0], [6], [7], [8], [9], [10], [18]]
    assert [a[1] for a in executed] == list(range(20))  # every executed action is the one planned for its step
    assert ex.short_steps.tolist() == [3]  # steps 7, 8, 9 started inside the phase
    ex.reset([0])
    assert ex.short_steps.tolist() == [0] and ex.short_left.tolist() == [0]


def test_short_start_runs_the_first_steps_of_every_episode_at_the_short_horizon():
    ex = _short_executor(dwell=0, short_start=3)
    executed = [ex.act(_obs([0], [t], [0.0]))[0].tolist() for t in range(12)]
    # steps 0-2 one action per chunk (3 calls), step 3 plans a whole chunk (H = 8): the next call is at step 11
    assert ex.policy.calls == [[0], [1], [2], [3], [11]]
    assert [a[1] for a in executed] == list(range(12)) and ex.triggers.tolist() == [0]
    ex.reset([0])  # a new episode starts with the short phase again
    assert ex.short_left.tolist() == [3]
    ex.act(_obs([1], [0], [0.0]))
    ex.act(_obs([1], [1], [0.0]))
    assert ex.policy.calls[-2:] == [[0], [1]]
    long = _short_executor(dwell=2, short_start=30)  # alarms from step 5 on never cut the start phase short
    for t in range(12):
        long.act(_obs([0], [t], [0.0 if t < 5 else 40.0 * (t - 4)]))
    assert long.policy.calls == [[t] for t in range(12)] and long.short_left.tolist() == [30 - 12]
    with pytest.raises(ValueError, match="short_start: expected 0, or >= 1 with a short_horizon"):
        CorrectiveConfig(short_start=4)
    with pytest.raises(ValueError, match="short_start"):
        CorrectiveConfig(short_horizon=1, short_start=-1)


def test_alarms_inside_the_short_phase_keep_it_going():
    ex = _short_executor(dwell=2)
    for t in range(12):  # the latent keeps jumping from step 5 on: every scored step is an alarm
        ex.act(_obs([0], [t], [0.0 if t < 5 else 40.0 * (t - 4)]))
    assert ex.policy.calls == [[0], [6], [7], [8], [9], [10], [11]]
    assert ex.triggers.tolist() == [1]  # a row planned this step never fires: the phase, not triggers, replans


@pytest.mark.parametrize("target, expected", [("observed", [2.0, 40.0]), ("predicted", [2.0, 0.0])])
def test_guidance_target_is_the_observed_or_the_predicted_change(target, expected):
    ex = _short_executor(dwell=0, guidance_target=target)
    seen = []
    ex._guidance = lambda rows, z, dz: seen.append(dz[rows].tolist())  # noqa: SLF001 - spy on the target
    for t in range(8):
        ex.act(_obs([0], [t], [0.0 if t < 5 else 40.0]))
    assert seen == [[expected]]  # one trigger (step 6): z_6 - z_4 = (2, 40), the monitor expects (2, 0)


def test_short_horizon_is_validated():
    thr = ConformalThresholds(np.full(H, 0.5), 0.05, np.full(H, 100), 0.35)
    cfg = ExecutorConfig(kind="corrective", corrective=CorrectiveConfig(short_horizon=H + 1))
    with pytest.raises(ExecutorConfigError, match="short_horizon"):
        CorrectiveExecutor(EmbedClock(), cfg, ClockMonitor(), thr)
    for bad in ({"short_horizon": 0}, {"short_dwell": -1}, {"guidance_target": "future"}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            CorrectiveConfig(**bad)


def _image_flow_policy(seed):
    """A tiny flow policy over a 24x24 camera and a 3-D state (small conv trunk), chunk H = 8."""
    from policylink.data.normalize import Normalizer
    from policylink.policies.common.encoders import EncoderConfig
    from policylink.policies.common.unet1d import UNetConfig
    from policylink.policies.processing import processors_for
    from policylink.policies.registry import make_config, make_policy

    image = "observation.images.front"
    cfg = make_config("flow", observation_keys=[STATE, image], chunk_size=H, n_action_steps=4,
                      unet=UNetConfig(down_dims=[32, 64], time_embed_dim=32),
                      encoder=EncoderConfig(vision_backbone="small_conv", num_keypoints=8))  # fmt: skip
    features = {STATE: FeatureSpec("float32", (3,)), image: FeatureSpec("uint8", (24, 24, 3), unit="rgb")}
    action = ActionSpec(("x", "y"), "ee_delta", ("m", "m"), (-1.0, -1.0), (1.0, 1.0))
    spec = PolicySpec(features, action, n_obs_steps=2, chunk_size=H, n_action_steps=4, control_frequency=10.0)
    stats = {STATE: {"min": np.zeros(3), "max": np.ones(3)}, "action": {"min": -np.ones(2), "max": np.ones(2)}}
    norm = Normalizer(stats, {STATE: "min_max", "action": "min_max", image: "identity"})
    chain = processors_for(cfg, features, norm)
    return make_policy("flow", spec=spec, processors=chain, config=cfg, device="cpu", seed=seed), image


def test_monitor_and_plans_share_one_encoder_pass_per_step_and_score_fresh_latents():
    """Corrective execution of a real image policy: each step's observation goes through the encoder once (a
    chunk planned in the step and the monitor's ``z_t`` share the pass; each frame through the trunk once, the
    previous frame's features reused), and the latents scored are bit for bit a fresh encode of the windows."""
    from policylink.policies.corrector.monitor import LatentMonitor, MonitorConfig

    policy, image = _image_flow_policy(seed=1)
    fresh, _ = _image_flow_policy(seed=1)
    fresh.model.load_state_dict(policy.model.state_dict())
    passes, encode = [], policy._encode
    policy._encode = lambda obs, rows=None: passes.append(len(obs[STATE])) or encode(obs, rows)  # noqa: SLF001
    monitor = LatentMonitor(policy.latent_dim, 2, MonitorConfig(horizon=K, hidden_dim=16))
    det = DetectorConfig(ewma=1.0, persistence_m=1, window=1, cooldown=0)
    cfg = ExecutorConfig(kind="corrective", n_action_steps=4, corrective=CorrectiveConfig(detector=det))
    thr = ConformalThresholds(np.full(H, 1e9), 0.05, np.full(H, 100), 1.0)  # never fires: plans at 0, 4, 8
    ex = CorrectiveExecutor(policy, cfg, monitor=monitor, thresholds=thr)
    rng = np.random.default_rng(0)
    for t in range(10):
        obs = {STATE: rng.random((2, 3), dtype=np.float32), image: rng.integers(0, 256, (2, 24, 24, 3), np.uint8)}
        ex.act(obs)
        fresh.update_observation(obs)
        assert np.array_equal(ex._z[:, -1], fresh.embed())  # noqa: SLF001 - the z_t the monitor scored
        assert passes == [2] * (t + 1)  # one pass over both rows per step, planning steps included
    assert ex.inferences.tolist() == [3, 3] and ex.triggers.tolist() == [0, 0]
    assert (ex.policy_calls, ex.policy_rows, ex.monitor_steps) == (3, 6, 10)  # both rows per call, 10 steps
    assert policy._frames.encoded_frames == 2 * 10  # noqa: SLF001 - each row's frame once per step
    assert len(ex.trace[0]) == 10 - K


def test_rows_planned_apart_are_encoded_once_per_step():
    """Rows out of step (row 1 restarts at step 3, so the two rows plan at different steps): a call that plans one
    row reuses that row's latent from the step's monitor pass, so every row's frame still goes through the trunk
    exactly once per step."""
    from policylink.policies.corrector.monitor import LatentMonitor, MonitorConfig

    policy, image = _image_flow_policy(seed=2)
    monitor = LatentMonitor(policy.latent_dim, 2, MonitorConfig(horizon=K, hidden_dim=16))
    det = DetectorConfig(ewma=1.0, persistence_m=1, window=1, cooldown=0)
    cfg = ExecutorConfig(kind="corrective", n_action_steps=4, corrective=CorrectiveConfig(detector=det))
    thr = ConformalThresholds(np.full(H, 1e9), 0.05, np.full(H, 100), 1.0)  # never fires
    ex = CorrectiveExecutor(policy, cfg, monitor=monitor, thresholds=thr)
    rng = np.random.default_rng(1)
    rows_planned = []
    for t in range(12):
        if t == 3:
            ex.reset([1])
        obs = {STATE: rng.random((2, 3), dtype=np.float32), image: rng.integers(0, 256, (2, 24, 24, 3), np.uint8)}
        before = ex.policy_rows
        ex.act(obs)
        rows_planned.append(ex.policy_rows - before)
    assert ex.inferences.tolist() == [3, 3]  # row 0 plans at 0, 4, 8; row 1 at 0, 3, 7 (11 is its next)
    assert rows_planned.count(1) >= 4  # calls that plan one row alone
    assert policy._frames.encoded_frames == 2 * 12  # noqa: SLF001 - each row's frame once per step
