"""Q-VGM: keep-best normalised Q-gradient ascent on a known quadratic, and one Q-VGM update moving the sampled
chunks toward the critic's maximiser."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from policylink.policies.finetune.qvgm import QVGMConfig, QVGMLoss, keep_best_ascent
from policylink.policies.registry import build_model


def test_keep_best_lands_at_the_maximiser_inside_the_trust_region():
    q = lambda a: -((a[:, 0] - 0.3) ** 2)  # noqa: E731
    res = keep_best_ascent(q, torch.zeros(1, 1), steps=10, step_size=0.1, trust_radius=0.5)
    assert float(res.a_star) == pytest.approx(0.3, abs=1e-6)
    assert float(res.q_best) == pytest.approx(0.0, abs=1e-9) and float(res.q_start) == pytest.approx(-0.09)
    assert not bool(res.start_won)


def test_keep_best_stops_at_the_trust_region_when_the_maximiser_is_outside():
    q = lambda a: -((a[:, 0] - 1.0) ** 2)  # noqa: E731
    res = keep_best_ascent(q, torch.zeros(1, 1), steps=10, step_size=0.1, trust_radius=0.5)
    assert float(res.a_star) == pytest.approx(0.5, abs=1e-6)


def test_keep_best_is_never_below_the_start():
    # a rugged 1-D Q where every gradient step from the start goes down hill after the first overshoot
    q = lambda a: torch.cos(40.0 * a[:, 0])  # noqa: E731
    start = torch.tensor([[0.0], [0.05], [0.3]])
    res = keep_best_ascent(q, start, steps=5, step_size=0.2, trust_radius=1.0)
    assert (res.q_best >= res.q_start).all()
    # the start (a maximum of cos) wins for row 0 and is returned unchanged
    assert bool(res.start_won[0]) and float(res.a_star[0]) == 0.0
    # zero steps: the start itself
    res0 = keep_best_ascent(q, start, steps=0, step_size=0.2, trust_radius=1.0)
    assert torch.equal(res0.a_star, start) and res0.start_won.all()


def test_trust_region_is_an_rms_radius_per_entry():
    target = torch.full((1, 4, 2), 10.0)
    q = lambda a: -((a - target) ** 2).flatten(1).sum(1)  # noqa: E731
    res = keep_best_ascent(q, torch.zeros(1, 4, 2), steps=20, step_size=0.1, trust_radius=0.25)
    rms = float((res.a_star**2).mean().sqrt())
    assert rms == pytest.approx(0.25, rel=1e-5)
    torch.testing.assert_close(res.a_star, torch.full((1, 4, 2), 0.25))


class _QuadraticCritic(torch.nn.Module):
    """Q(s, a) = -||a[:, :H] - target||^2: maximiser known."""

    def __init__(self, target: torch.Tensor, horizon: int):
        super().__init__()
        self.target, self.horizon = target, horizon

    def actor_q(self, s, a, pessimism=0.0):
        return -((a[:, : self.horizon] - self.target) ** 2).flatten(1).sum(1)


@pytest.mark.parametrize("target_kind", ["residual", "flow_matching"])
def test_a_qvgm_step_moves_the_sampled_chunk_mean_toward_the_maximiser(kit, target_kind):
    torch.manual_seed(0)
    cfg = kit.tiny_config("flow", keys=(kit.STATE,), n_obs_steps=1, chunk_size=4, n_action_steps=2)
    model = build_model(cfg, kit.FEATURES, 2)
    reference = copy.deepcopy(model)
    target = torch.tensor([0.5, -0.5]).expand(2, 2)
    loss_fn = QVGMLoss(
        QVGMConfig(last_steps=5, ascent_steps=10, step_size=0.1, trust_radius=0.5, bc_weight=0.0, target=target_kind),
        _QuadraticCritic(target, horizon=2),
        reference,
    )
    obs = {kit.STATE: torch.tensor(np.random.default_rng(0).uniform(-1, 1, (32, 1, 3)), dtype=torch.float32)}
    noise = torch.randn(32, 4, 2, generator=torch.Generator().manual_seed(3))

    def dist() -> float:
        with torch.no_grad():
            chunk = model.generate(model.condition(model.embed(obs)), noise)
        return float((chunk[:, :2].mean(0) - target).norm())

    before = dist()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    metrics = {}
    for step in range(15):
        batch = {"obs": obs, "action": torch.zeros(32, 4, 2), "valid": None}
        batch["noise"] = loss_fn.draw(model, 32, torch.Generator().manual_seed(step))
        loss, metrics = loss_fn(model, batch, step)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert dist() < 0.7 * before
    assert metrics["keep_best_margin"] > 0 and metrics["q_best"] >= metrics["q_start"]
    assert all(p.grad is None for p in reference.parameters())
    assert set(metrics) == set(QVGMLoss.metrics)


def test_the_flow_target_is_flow_matching_onto_the_kept_chunk(kit):
    torch.manual_seed(0)
    cfg = kit.tiny_config("flow", keys=(kit.STATE,), n_obs_steps=1, chunk_size=4, n_action_steps=2)
    model = build_model(cfg, kit.FEATURES, 2)
    qc = QVGMConfig(ascent_steps=3, step_size=0.1, trust_radius=0.2, bc_weight=0.0, target="flow_matching")
    loss_fn = QVGMLoss(qc, _QuadraticCritic(torch.ones(2, 2), 2), copy.deepcopy(model))
    obs = {kit.STATE: torch.tensor(np.random.default_rng(2).uniform(-1, 1, (8, 1, 3)), dtype=torch.float32)}
    noise = loss_fn.draw(model, 8, torch.Generator().manual_seed(0))
    assert noise["target_noise"].shape == (8, 4, 2) and noise["target_t"].shape == (8,)
    with torch.no_grad():
        cond = model.condition(model.embed(obs))
        _, _, _, res = loss_fn.targets(model, obs, cond, noise)
        expected = model.loss(cond, res.a_star, {"noise": noise["target_noise"], "t": noise["target_t"]})
        _, metrics = loss_fn(model, {"obs": obs, "action": torch.zeros(8, 4, 2), "noise": noise}, 0)
    assert metrics["vgm_loss"] == pytest.approx(float(expected), rel=1e-5)
    assert metrics["start_won"] == 0.0  # the ascent toward 1 always improves on the start here
    with pytest.raises(ValueError, match="qvgm.target: expected one of .*received 'fm'"):
        QVGMConfig(target="fm").validate()


def test_qvgm_config_names_the_bad_field(kit):
    with pytest.raises(ValueError, match=r"qvgm.last_steps: expected in \[1, 10\], received 11"):
        QVGMConfig(last_steps=11).validate(10)
    with pytest.raises(ValueError, match="qvgm.trust_radius: expected > 0, received 0"):
        QVGMConfig(trust_radius=0).validate()
    with pytest.raises(ValueError, match="qvgm.pessimism: expected >= 0, received -1"):
        QVGMConfig(pessimism=-1).validate()


def test_the_bc_term_uses_the_bc_batch_when_one_is_given(kit):
    torch.manual_seed(0)
    cfg = kit.tiny_config("flow", keys=(kit.STATE,), n_obs_steps=1, chunk_size=4, n_action_steps=2)
    model = build_model(cfg, kit.FEATURES, 2)
    loss_fn = QVGMLoss(QVGMConfig(ascent_steps=0), _QuadraticCritic(torch.zeros(2, 2), 2), copy.deepcopy(model))
    gen = np.random.default_rng(1)
    obs = {kit.STATE: torch.tensor(gen.uniform(-1, 1, (8, 1, 3)), dtype=torch.float32)}
    bc_obs = {kit.STATE: torch.tensor(gen.uniform(-1, 1, (8, 1, 3)), dtype=torch.float32)}
    action, bc_action = torch.zeros(8, 4, 2), torch.ones(8, 4, 2)
    noise = loss_fn.draw(model, 8, torch.Generator().manual_seed(0))
    with torch.no_grad():
        own = model.loss(model.condition(model.embed(obs)), action, noise, None)
        other = model.loss(model.condition(model.embed(bc_obs)), bc_action, noise, None)
        _, plain = loss_fn(model, {"obs": obs, "action": action, "noise": noise}, 0)
        bc = {"obs": bc_obs, "action": bc_action, "valid": None}
        _, split = loss_fn(model, {"obs": obs, "action": action, "noise": noise, "bc": bc}, 0)
    assert plain["bc_loss"] == pytest.approx(float(own)) and split["bc_loss"] == pytest.approx(float(other))
    assert abs(float(own) - float(other)) > 0.1  # the two batches are told apart
    assert split["vgm_loss"] == pytest.approx(plain["vgm_loss"])  # velocity matching still on the main batch


def test_a_better_policy_sample_replaces_the_ascent_result():
    q = lambda a: -((a[:, 0] - 1.0) ** 2)  # noqa: E731
    res = keep_best_ascent(q, torch.zeros(2, 1), steps=3, step_size=0.1, trust_radius=0.2)  # lands at 0.2
    chunks = torch.tensor([[[0.9], [-1.0]], [[0.1], [-0.5]]])  # (B=2, N=2, 1)
    out = res.with_candidates(chunks, torch.stack([q(chunks[0]), q(chunks[1])]))
    # row 0: the sample 0.9 (Q = -0.01) beats the iterate 0.2 (Q = -0.64); row 1: no sample does
    torch.testing.assert_close(out.a_star, torch.tensor([[0.9], [0.2]]))
    torch.testing.assert_close(out.q_best, torch.tensor([-0.01, -0.64]))
    assert out.candidate_won.tolist() == [True, False] and not out.start_won.any()
    assert res.candidate_won is None


def test_qvgm_with_candidates_reports_how_often_a_sample_won(kit):
    torch.manual_seed(0)
    cfg = kit.tiny_config("flow", keys=(kit.STATE,), n_obs_steps=1, chunk_size=4, n_action_steps=2)
    model = build_model(cfg, kit.FEATURES, 2)
    loss_fn = QVGMLoss(QVGMConfig(ascent_steps=0, candidates=8), _QuadraticCritic(torch.zeros(2, 2), 2), model)
    obs = {kit.STATE: torch.tensor(np.random.default_rng(0).uniform(-1, 1, (16, 1, 3)), dtype=torch.float32)}
    noise = loss_fn.draw(model, 16, torch.Generator().manual_seed(0))
    assert noise["candidates"].shape == (16 * 8, 4, 2)
    _, metrics = loss_fn(model, {"obs": obs, "action": torch.zeros(16, 4, 2), "noise": noise}, 0)
    # with no ascent the start wins unless a sample is better: 8 fresh samples beat one clean estimate usually
    assert 0.5 < metrics["candidate_won"] <= 1.0 and metrics["start_won"] == pytest.approx(1 - metrics["candidate_won"])
    with pytest.raises(ValueError, match="qvgm.candidates: expected an integer >= 0, received -1"):
        QVGMConfig(candidates=-1).validate()


class _TableCritic(torch.nn.Module):
    """Q = the chunk's first action entry, V = 0: the advantage is known."""

    def actor_q(self, s, a, pessimism=0.0):
        return a[:, 0, 0]

    def value(self, s):
        return torch.zeros(s.shape[0])


def test_critic_awr_weights_are_capped_exponentials_of_standardised_advantages(kit):
    from policylink.policies.finetune.critic_awr import CriticAWRLoss

    cfg = kit.tiny_config("flow", keys=(kit.STATE,), n_obs_steps=1, chunk_size=4, n_action_steps=2)
    model = build_model(cfg, kit.FEATURES, 2)
    loss_fn = CriticAWRLoss(_TableCritic(), copy.deepcopy(model), beta=0.5, max_weight=3.0)
    action = torch.zeros(4, 4, 2)
    action[:, 0, 0] = torch.tensor([-1.0, 0.0, 1.0, 2.0])  # A; std (unbiased) = 1.2910
    obs = {kit.STATE: torch.zeros(4, 1, 3)}
    a = torch.tensor([-1.0, 0.0, 1.0, 2.0]) / 1.2909944
    torch.testing.assert_close(loss_fn.weights(obs, action), torch.exp(a / 0.5).clamp(max=3.0))
    assert float(loss_fn.weights(obs, action)[3]) == pytest.approx(3.0)  # exp(3.10) capped
    batch = {"obs": obs, "action": action, "valid": None, "noise": loss_fn.draw(model, 4, torch.Generator())}
    loss, metrics = loss_fn(model, batch, 0)
    assert metrics["max_weight"] == pytest.approx(3.0) and loss.requires_grad
    with pytest.raises(ValueError, match="awr beta / max_weight: expected > 0"):
        CriticAWRLoss(_TableCritic(), model, beta=0.0)


def test_a_reference_anchored_trust_region_bounds_the_drift_from_the_anchor():
    q = lambda a: -((a[:, 0] - 1.0) ** 2)  # noqa: E731
    # centred on 0.5 (not the start 0): the ascent stops at 0.5 + 0.2
    res = keep_best_ascent(
        q, torch.zeros(1, 1), steps=10, step_size=0.1, trust_radius=0.2, center=torch.full((1, 1), 0.5)
    )
    assert float(res.a_star) == pytest.approx(0.7, abs=1e-6)
    # a start already outside the region, better than anything inside it, is kept (never below the start)
    far = lambda a: -((a[:, 0] - 3.0) ** 2)  # noqa: E731
    res = keep_best_ascent(
        far, torch.full((1, 1), 2.0), steps=5, step_size=0.1, trust_radius=0.5, center=torch.zeros(1, 1)
    )
    assert float(res.a_star) == 2.0 and bool(res.start_won[0])
    with pytest.raises(ValueError, match=r"qvgm.anchor: expected one of \('current', 'reference'\), received 'base'"):
        QVGMConfig(anchor="base").validate()


def test_the_reference_anchor_centres_the_region_on_the_reference_clean_estimate(kit):
    torch.manual_seed(0)
    cfg = kit.tiny_config("flow", keys=(kit.STATE,), n_obs_steps=1, chunk_size=4, n_action_steps=2)
    model, reference = build_model(cfg, kit.FEATURES, 2), build_model(cfg, kit.FEATURES, 2)  # different weights
    far = torch.full((4, 2), 5.0)  # the maximiser lies far outside any region: iterates end on its boundary
    qc = QVGMConfig(ascent_steps=40, step_size=0.05, trust_radius=0.1, anchor="reference")
    loss_fn = QVGMLoss(qc, _QuadraticCritic(far, 4), reference)
    obs = {kit.STATE: torch.tensor(np.random.default_rng(0).uniform(-1, 1, (8, 1, 3)), dtype=torch.float32)}
    noise = loss_fn.draw(model, 8, torch.Generator().manual_seed(0))
    with torch.no_grad():
        cond = model.condition(model.embed(obs))
    x_t, t, _, res = loss_fn.targets(model, obs, cond, noise)
    with torch.no_grad():
        s = reference.sampler
        a_ref = s.clean_estimate(x_t, t, s.denoise(x_t, t, reference.condition(reference.embed(obs))))
    rms = (res.a_star - a_ref).flatten(1).norm(dim=1) / 8**0.5  # 8 entries per chunk
    moved = ~res.start_won  # rows whose own clean estimate (outside the region) was not better
    assert moved.sum() >= 4
    torch.testing.assert_close(rms[moved], torch.full((int(moved.sum()),), 0.1), atol=1e-5, rtol=0)
    a_hat_rms = (res.a_star[~moved] - a_ref[~moved]).flatten(1).norm(dim=1) / 8**0.5
    assert (a_hat_rms > 0.1).all()  # a kept start lies outside the reference's region
