"""Corrective execution parts against known values: split conformal thresholds (exact ranks, nominal false-alarm
rate on fresh samples), the persistence rule (step change vs isolated spike, cool-down, hysteresis), the robust
MAD rule, the latent monitor (fit, save/load) and guided replanning lowering its cost on toys with known answers."""

import numpy as np
import pytest
import torch

from policylink.policies.common.samplers import DDIMSampler, FlowEulerSampler
from policylink.policies.corrector.calibration import (
    ConformalThresholds,
    DetectorConfig,
    PersistenceDetector,
    alarm_rate,
    conformal_quantile,
    cosine_deviation,
    ewma,
)
from policylink.policies.corrector.config import CorrectiveConfig
from policylink.policies.corrector.guidance import affine_inverse, corrective_cost, cost_guidance
from policylink.policies.corrector.monitor import (
    LatentMonitor,
    MonitorConfig,
    load_monitor,
    monitor_deviation,
    monitor_pairs,
    save_monitor,
)
from policylink.train.monitor import train_monitor


def test_conformal_quantile_exact_rank():
    scores = np.arange(1.0, 20.0)  # n = 19
    assert conformal_quantile(scores, 0.1) == 18.0  # ceil(20 * 0.9) = 18th smallest
    assert conformal_quantile(scores, 0.05) == 19.0  # ceil(20 * 0.95) = 19
    assert conformal_quantile(scores[:5], 0.05) == float("inf")  # rank 6 > n = 5
    with pytest.raises(ValueError, match="alpha"):
        conformal_quantile(scores, 1.5)


@pytest.mark.parametrize("alpha", [0.05, 0.1])
def test_conformal_thresholds_hit_nominal_false_alarm_rate_on_fresh_samples(alpha):
    rng = np.random.default_rng(0)
    h = 4

    def episodes(n):  # offset-dependent score scales: the per-offset thresholds must adapt
        out = []
        for _ in range(n):
            off = np.arange(40) % h
            out.append((rng.exponential(1.0 + off), off))
        return out

    thr = ConformalThresholds.fit(episodes(200), chunk_size=h, alpha=alpha, ewma_weight=1.0)
    assert thr.counts.tolist() == [2000] * h
    assert thr.thresholds[3] > 3 * thr.thresholds[0]  # scale 4 vs 1
    rate = alarm_rate(episodes(2000), thr)  # 80000 fresh steps
    assert alpha - 0.01 <= rate <= alpha + 0.005, rate
    assert ConformalThresholds.from_dict(thr.to_dict()).thresholds.tolist() == thr.thresholds.tolist()


def test_ewma_and_cosine_known_values():
    assert ewma(np.array([1.0, 0.0, 0.0]), 0.5).tolist() == [1.0, 0.5, 0.25]
    pred = np.array([[1.0, 0.0], [1.0, 0.0], [1.0, 1.0]])
    dev = cosine_deviation(pred, np.array([[2.0, 0.0], [-1.0, 0.0], [0.0, 3.0]]))
    np.testing.assert_allclose(dev, [0.0, 2.0, 1.0 - 1.0 / np.sqrt(2.0)])


def _detector(m=3, w=4, cooldown=2, hysteresis=0.5, jump=None):
    cfg = DetectorConfig(ewma=1.0, persistence_m=m, window=w, cooldown=cooldown, hysteresis=hysteresis, jump=jump)
    thr = ConformalThresholds(np.full(4, 1.0), 0.05, np.full(4, 100), 1.0)
    return PersistenceDetector(cfg, 1, thr)


def _run(det, scores):
    return [bool(det.update(np.array([s]), np.array([0]), np.array([True]))[0][0]) for s in scores]


def test_persistence_fires_on_step_change_not_on_isolated_spike():
    step = [0.1] * 5 + [2.0] * 10
    fired = _run(_detector(), step)
    assert [i for i, f in enumerate(fired) if f] == [7]  # 3rd exceedance; then disarmed (hysteresis) while high
    spike = [0.1] * 5 + [50.0] + [0.1] * 10
    assert not any(_run(_detector(), spike))
    two_spikes = [0.1, 5.0, 0.1, 0.1, 0.1, 5.0, 0.1]  # 2 of any 4 steps: below m = 3
    assert not any(_run(_detector(), two_spikes))
    assert [i for i, f in enumerate(_run(_detector(jump=10.0), spike)) if f] == [5]  # the sharp-jump option


def test_cooldown_and_hysteresis_rearm():
    # fire at 2, drop below 0.5 * threshold at 3 (re-armed), high again from 4: cool-down 2 ends, 3 hits at 6
    scores = [2.0, 2.0, 2.0, 0.1, 2.0, 2.0, 2.0, 2.0]
    fired = _run(_detector(m=3, w=3, cooldown=2), scores)
    assert [i for i, f in enumerate(fired) if f] == [2, 6]
    # without dropping below hysteresis * threshold (0.8 > 0.5) it never re-arms
    fired = _run(_detector(m=3, w=3, cooldown=0), [2.0, 2.0, 2.0, 0.8, 2.0, 2.0, 2.0, 2.0])
    assert [i for i, f in enumerate(fired) if f] == [2]


def test_inactive_rows_and_reset_are_per_row():
    cfg = DetectorConfig(ewma=1.0, persistence_m=1, window=1, cooldown=0)
    det = PersistenceDetector(cfg, 2, ConformalThresholds(np.ones(2), 0.05, np.ones(2), 1.0))
    fired, thr = det.update(np.array([5.0, 5.0]), np.array([0, 7]), np.array([True, False]))
    assert fired.tolist() == [True, False] and thr.tolist() == [1.0, 1.0]  # offset 7 clipped to the table
    det.reset([0])
    assert det.update(np.array([5.0, 5.0]), np.array([0, 0]), np.array([True, True]))[0].tolist() == [True, True]


def test_mad_rule_known_threshold():
    cfg = DetectorConfig(rule="mad", ewma=1.0, persistence_m=1, window=1, mad_k=3.0, mad_floor=0.0, mad_window=5)
    det = PersistenceDetector(cfg, 1)
    for s in [1.0, 2.0, 3.0, 4.0, 5.0]:  # median 3, MAD 1 -> threshold 6
        det.update(np.array([s]), np.array([0]), np.array([True]))
    assert det.threshold(np.array([0])).tolist() == [6.0]
    assert det.update(np.array([6.5]), np.array([0]), np.array([True]))[0].tolist() == [True]


def test_detector_config_errors_name_the_field():
    with pytest.raises(ValueError, match="persistence_m"):
        DetectorConfig(persistence_m=5, window=3)
    with pytest.raises(ValueError, match="rule"):
        DetectorConfig(rule="bogus")
    with pytest.raises(ValueError, match="conformal"):
        PersistenceDetector(DetectorConfig(), 1, None)


def test_monitor_learns_a_linear_latent_dynamics_and_round_trips(tmp_path):
    rng = np.random.default_rng(0)
    k, d, a = 3, 4, 2
    w = rng.normal(size=(a, d))
    lat, acts = [], []
    for _ in range(20):  # z_{t+1} = z_t + a_t W: the change over k steps is (sum of k actions) W
        act = rng.normal(size=(30, a)).astype(np.float32)
        lat.append(np.cumsum(np.vstack([np.zeros((1, a)), act[:-1]]) @ w, 0).astype(np.float32))
        acts.append(act)
    z, ac, dz = monitor_pairs(lat, acts, k)
    assert z.shape == (20 * 27, d) and ac.shape == (20 * 27, k, a)
    np.testing.assert_allclose(dz[0], ac[0].sum(0) @ w, atol=1e-5)
    mon, losses = train_monitor(z, ac, dz, MonitorConfig(horizon=k, hidden_dim=64), steps=600, lr=3e-3)
    assert losses[-1] < 0.05 < losses[0]
    thr = ConformalThresholds(np.arange(4.0), 0.05, np.ones(4, np.int64), 0.35)
    back, back_thr = load_monitor(save_monitor(tmp_path / "m", mon, thr))
    x = (torch.as_tensor(z[:5]), torch.as_tensor(ac[:5]))
    torch.testing.assert_close(back(*x), mon(*x))
    assert back_thr.thresholds.tolist() == [0.0, 1.0, 2.0, 3.0]
    with pytest.raises(FileNotFoundError, match="monitor"):
        load_monitor(tmp_path / "nothing")


def _toy_cost_and_target(h=4, a=2):
    target = torch.tensor([[0.5, -0.3]]).repeat(h, 1)[None]  # the known answer: argmin of the cost

    def cost(a_hat):
        return ((a_hat - target) ** 2).sum((1, 2))

    return cost, target


@pytest.mark.parametrize("kind", ["flow", "ddim_epsilon", "ddim_sample"])
def test_guided_sampling_lowers_the_cost_toward_the_known_answer(kind):
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(2, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))

    def network(x, k, cond):  # a fixed random network: the unguided sample is somewhere, not at the target
        return net(x)

    if kind == "flow":
        sampler = FlowEulerSampler(network, num_steps=10)
    else:
        sampler = DDIMSampler(network, prediction_type=kind.split("_")[1], num_steps=10, clip_sample=False)
    cost, target = _toy_cost_and_target()
    noise = torch.randn(3, 4, 2, generator=torch.Generator().manual_seed(1))
    plain = sampler.sample(None, noise)
    guided = sampler.sample(None, noise, guidance=cost_guidance(cost, 0.3))
    c_plain, c_guided = cost(plain), cost(guided)
    assert (c_guided < 0.5 * c_plain).all(), (c_plain, c_guided)
    assert (guided - target).abs().max() < (plain - target).abs().max()


class _SumMonitor(torch.nn.Module):
    """Toy monitor: predicted latent change = the sum of the first k actions (D = A)."""

    horizon = 2

    def forward(self, z, actions):
        return actions.sum(1)


def test_corrective_cost_is_lowered_by_guidance_and_pins_committed_actions():
    sampler = FlowEulerSampler(lambda x, k, c: torch.zeros_like(x), num_steps=10)  # unguided = the noise
    noise = torch.randn(4, 6, 2, generator=torch.Generator().manual_seed(0))
    to_units = affine_inverse(lambda x: 2.0 * torch.as_tensor(x) + 1.0, 2)  # units = (n - 1) / 2
    np.testing.assert_allclose(to_units(torch.tensor([[3.0, -1.0]])).numpy(), [[1.0, -1.0]])
    z = torch.zeros(4, 2)
    target = torch.tensor([[1.0, 0.0]]).repeat(4, 1)  # known answer: first 2 actions summing along +x
    committed = torch.full((4, 6, 2), 0.25)
    weights = torch.zeros(4, 6)
    weights[:, 0] = 1.0
    cost = corrective_cost(_SumMonitor(), z, target, to_units, committed, weights)
    plain = sampler.sample(None, noise)
    guided = sampler.sample(None, noise, guidance=cost_guidance(cost, 1.0))
    assert (cost(guided) < cost(plain)).all()
    assert cost(guided).mean() < 0.5 * cost(plain).mean(), (cost(plain), cost(guided))
    # the committed action (units 0.25 -> normalised 1.5) is pulled in
    assert (to_units(guided)[:, 0] - 0.25).abs().max() < (to_units(plain)[:, 0] - 0.25).abs().max()
    with pytest.raises(ValueError, match="affine"):
        affine_inverse(lambda x: torch.as_tensor(x) ** 2, 2)


def test_finetune_monitor_then_guided_corrective_replan_on_a_flow_policy(tmp_path, kit, normalizer, store_path):
    """``policylink finetune monitor`` on a store of successful episodes writes a calibrated monitor beside the
    checkpoint; the corrective executor loads it and a forced replan of one row is guided (flow policy)."""
    from policylink.cli.finetune import main as finetune_main
    from policylink.data.buffer import EpisodeStore
    from policylink.data.episode_meta import EpisodeMeta
    from policylink.policies import load_policy
    from policylink.policies.policy import policy_for_model
    from policylink.policies.registry import build_model
    from policylink.runtime.executors import ExecutorConfig, make_executor

    cfg = kit.tiny_config("flow")
    spec = kit.make_spec(cfg, kit.FEATURES)
    ckpt = policy_for_model(build_model(cfg, kit.FEATURES, 2), kit.chain(cfg, normalizer), spec).save(tmp_path / "ckpt")
    rng = np.random.default_rng(0)
    with EpisodeStore(tmp_path / "rollouts.zarr", "w") as store:
        for i in range(12):
            ep = kit.episode(20, 0.3 * i, rng)
            store.add_episode({k: ep[k] for k in (kit.STATE, "action")}, EpisodeMeta(success=i != 3))
    argv = ["monitor", "--policy", str(ckpt), "--buffer", str(tmp_path / "rollouts.zarr"), "--horizon", "2",
            "--steps", "50", "--hidden_dim", "16"]  # fmt: skip
    assert finetune_main(argv) == 0
    folder = tmp_path / "ckpt.monitor"
    assert {"monitor.json", "monitor.safetensors", "calibration.json"} <= {p.name for p in folder.iterdir()}
    import json

    summary = json.loads((folder / "summary.json").read_text())
    assert sum(summary["episodes"].values()) == 11  # the failed episode is left out
    policy = load_policy(ckpt, device="cpu")
    corrective = ExecutorConfig(kind="corrective", corrective=CorrectiveConfig(monitor=str(folder)))
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # its own policy: no warning
        ex = make_executor(policy, corrective)
    assert ex.n_action_steps == spec.chunk_size
    # same architecture and widths, another normalisation (a policy trained on other data): only the probe
    # latent tells them apart
    from policylink.data.normalize import Normalizer
    from policylink.data.stats import compute_stats
    from policylink.policies.processing import normalizer_modes

    with EpisodeStore(store_path, "r") as store:
        other_norm = Normalizer(compute_stats(store), normalizer_modes(kit.FEATURES, "mean_std", "min_max"))
    other = policy_for_model(build_model(cfg, kit.FEATURES, 2), kit.chain(cfg, other_norm), spec).save(
        tmp_path / "other"
    )
    with pytest.warns(UserWarning, match=r"trained on another policy's latents \(a fixed probe observation's latent"):
        make_executor(load_policy(other, device="cpu"), corrective)
    ep = kit.episode(6, 0.0, rng)
    for t in range(4):
        ex.act({kit.STATE: np.repeat(ep[kit.STATE][t][None], 2, 0)})
    z = policy.embed()
    assert ex._guidance(np.array([1]), z, z) is not None
    assert ex.replan([1], guidance=ex._guidance(np.array([1]), z, z)) is True
    assert ex.inferences.tolist() == [1, 2]


def test_residual_score_known_values_and_it_sees_what_the_cosine_hides():
    mon = LatentMonitor(2, 1, MonitorConfig(horizon=1, score="residual"))
    mon.res_std.copy_(torch.tensor([1.0, 2.0]))
    assert monitor_deviation(mon, np.array([[1.0, 1.0]]), np.array([[2.0, 3.0]])).tolist() == [1.0]  # (1 + 1) / 2
    # a large robot motion (dim 0) and a small object shift (dim 1): the cosine barely moves, the residual does
    pred, obs = np.array([[10.0, 0.0]]), np.array([[10.0, 0.5]])
    assert cosine_deviation(pred, obs)[0] < 0.002
    mon.res_std.copy_(torch.tensor([1.0, 0.05]))
    assert monitor_deviation(mon, pred, obs).tolist() == pytest.approx([50.0])  # (0.5 / 0.05)^2 / 2
    with pytest.raises(ValueError, match="monitor.score"):
        MonitorConfig(score="l1")


def test_residual_monitor_predicts_magnitudes_and_sets_the_residual_spread(tmp_path):
    rng = np.random.default_rng(1)
    w = np.array([[1.0, 0.0, 0.5]])  # z_{t+1} = z_t + a_t w (one action dim, three latent dims)
    lat, acts = [], []
    for _ in range(10):
        act = rng.normal(size=(30, 1)).astype(np.float32)
        lat.append(np.cumsum(np.vstack([np.zeros((1, 1)), act[:-1]]) @ w, 0).astype(np.float32))
        acts.append(act)
    z, ac, dz = monitor_pairs(lat, acts, 2)
    cfg = MonitorConfig(horizon=2, hidden_dim=32, score="residual")
    mon, losses = train_monitor(z, ac, dz, cfg, steps=400, lr=3e-3)
    assert losses[-1] < 0.05 < losses[0]
    with torch.no_grad():
        pred = mon(torch.as_tensor(z[:50]), torch.as_tensor(ac[:50])).numpy()
    np.testing.assert_allclose(pred, dz[:50], atol=0.2)  # magnitudes, not only directions
    assert (mon.res_std.numpy() < 0.2).all()
    ok = monitor_deviation(mon, pred, dz[:50])
    shifted = dz[:50] + np.array([0.0, 0.0, 1.0], np.float32)  # the third dimension jumps by 1
    assert monitor_deviation(mon, pred, shifted).min() > 10 * ok.max()
    back, _ = load_monitor(save_monitor(tmp_path / "r", mon))
    assert back.config.score == "residual" and torch.equal(back.res_std, mon.res_std)


def _image_policy_pair(kit, normalizer):
    """Two image flow policies (small conv trunk) with the same weights: ``a`` is used as the corrective executor
    uses it (chunk, then ``embed``), ``b`` only encodes: the fresh reference."""
    from policylink.policies.registry import make_policy

    cfg = kit.tiny_config("flow", keys=(kit.STATE, kit.IMAGE))
    spec = kit.make_spec(cfg, kit.FEATURES)
    a, b = (
        make_policy("flow", spec=spec, processors=kit.chain(cfg, normalizer), config=cfg, device="cpu", seed=3)
        for _ in "ab"
    )
    b.model.load_state_dict(a.model.state_dict())
    return a, b


def _count_passes(policy) -> list[int]:
    """Spy on ``policy``'s encoder: the returned list gets the number of rows of every pass."""
    passes, encode = [], policy._encode

    def counted(obs, rows=None):
        latent = encode(obs, rows)
        passes.append(len(latent))
        return latent

    policy._encode = counted  # noqa: SLF001 - spy on the one encoder entry point
    return passes


def test_embed_reuses_the_chunks_latent_exactly_and_never_serves_a_stale_one(kit, normalizer):
    """The monitor's ``z_t = embed()`` after a chunk is that chunk's latent: no second encoder pass, and bit for
    bit what a fresh encode of the same windows gives (``b`` encodes the same rows in the same passes); a new
    observation or a restarted row is encoded again, never served the old latent."""
    a, b = _image_policy_pair(kit, normalizer)
    passes = _count_passes(a)
    rng = np.random.default_rng(0)
    prev = None
    for step in range(5):
        obs = {
            kit.STATE: rng.random((3, 3), dtype=np.float32),
            kit.IMAGE: rng.integers(0, 256, (3, 24, 24, 3), dtype=np.uint8),
        }
        if step == 3:
            for p in (a, b):
                p.reset([1])  # row 1 starts a new episode
        for p in (a, b):
            p.update_observation(obs)
        ids = [0, 2] if step == 2 else None  # step 2: only rows 0 and 2 plan a chunk
        a.predict_action_chunk(ids)
        assert passes[-1] == (2 if ids else 3)  # the chunk encoded its rows' new windows
        before = len(passes)
        za = a.embed()
        assert passes[before:] == ([1] if ids else [])  # only row 1 at step 2 had no latent yet
        if ids is not None:
            b.embed(env_ids=ids)
        zb = b.embed()
        assert za.dtype == np.float32 and za.shape == (3, a.latent_dim)
        assert np.array_equal(za, zb)
        explicit = {k: np.repeat(v[:, None], 2, axis=1) for k, v in obs.items()}  # windows of the newest frame
        a.embed(explicit)  # encoded (one pass) but never stored as a row's latent
        assert np.array_equal(a.embed(), za) and len(passes) == before + (1 if ids else 0) + 1
        if prev is not None:
            assert (np.abs(za - prev).max(axis=1) > 0).all()  # every row's latent is of its new window
        prev = za
