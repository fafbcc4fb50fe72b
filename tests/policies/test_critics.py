"""The chunk IQL critic: expectile loss, the chunk TD target from a store (true terminations only), Polyak
targets, and no gradient to the frozen encoder or the target heads."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from policylink.data.buffer import EpisodeStore
from policylink.data.normalize import Normalizer
from policylink.data.stats import compute_stats
from policylink.policies.critics import (
    ChunkCritic,
    CriticConfig,
    IQLLoss,
    chunk_td_target,
    critic_state,
    expectile_loss,
    polyak_update,
)
from policylink.policies.finetune.transitions import BufferError, build_transitions, check_buffer
from policylink.policies.processing import normalizer_modes, processors_for
from policylink.policies.registry import build_model
from policylink.train.critic import iql_optimization


def test_expectile_loss_on_a_fixed_batch():
    diff = torch.tensor([-2.0, -1.0, 0.0, 1.0, 2.0])
    # weights 0.2 below zero, 0.8 at/above: (0.2*4 + 0.2*1 + 0 + 0.8*1 + 0.8*4) / 5 = 1.0
    assert float(expectile_loss(diff, 0.8)) == pytest.approx(1.0)
    # tau = 0.5 is half the plain MSE: 0.5 * (4 + 1 + 0 + 1 + 4) / 5 = 1.0
    assert float(expectile_loss(diff, 0.5)) == pytest.approx(1.0)
    assert float(expectile_loss(torch.tensor([-1.0]), 0.9)) == pytest.approx(0.1)


def test_chunk_td_target_known_value():
    ret = torch.tensor([2.71, 2.71])
    disc = torch.tensor([0.729, 0.729])
    # h = 3, r = 1, gamma = 0.9: R = 1 + 0.9 + 0.81 = 2.71; Q' = 0 -> 2.71; a termination never bootstraps
    y = chunk_td_target(ret, disc, torch.tensor([False, True]), torch.tensor([0.0, 5.0]))
    assert y.tolist() == pytest.approx([2.71, 2.71])
    y = chunk_td_target(ret, disc, torch.tensor([False, True]), torch.tensor([1.0, 1.0]))
    assert y.tolist() == pytest.approx([2.71 + 0.729, 2.71])


def _store(path, kit, terminated_last: bool, env: str = "toy") -> None:
    """Two 6-step episodes with reward 1 every step; episode 0 ends by time limit, episode 1 by termination
    (when ``terminated_last``)."""
    rng = np.random.default_rng(0)
    with EpisodeStore(path, "w") as s:
        for e in range(2):
            ep = kit.episode(6, 0.5 * e, rng)
            ep.pop(kit.IMAGE)
            ep["reward"] = np.ones(6, np.float32)
            ep["terminated"] = np.array([False] * 5 + [terminated_last and e == 1])
            s.add_episode(ep)
        s.update_info(env=env)


def _model(kit):
    torch.manual_seed(0)
    cfg = kit.tiny_config("flow", n_obs_steps=1, chunk_size=4, n_action_steps=3)
    return build_model(cfg, kit.FEATURES, 2)


def _processors(path, kit, model):
    with EpisodeStore(path, "r") as s:
        normalizer = Normalizer(compute_stats(s), normalizer_modes(kit.FEATURES, "min_max", "min_max"))
    return processors_for(model.cfg, kit.FEATURES, normalizer)


def test_transitions_from_a_store_bootstrap_time_limits_not_terminations(tmp_path, kit):
    path = tmp_path / "buf.zarr"
    _store(path, kit, terminated_last=True)
    model = _model(kit)
    cache = build_transitions(path, model, _processors(path, kit, model), horizon=3, gamma=0.9)
    assert len(cache) == 12  # every step of both episodes is an anchor
    first = (cache.episode == 0) & (cache.step == 0)
    assert float(cache.ret[first]) == pytest.approx(2.71)
    assert float(cache.discount[first]) == pytest.approx(0.729)
    last0 = (cache.episode == 0) & (cache.step == 3)  # steps 3, 4, 5: the time-limit end
    last1 = (cache.episode == 1) & (cache.step == 3)  # steps 3, 4, 5: terminated at 5
    assert not bool(cache.terminal[last0]) and bool(cache.terminal[last1])
    tail = (cache.episode == 0) & (cache.step == 5)  # one step left: R = 1, gamma^1
    assert float(cache.ret[tail]) == pytest.approx(1.0) and float(cache.discount[tail]) == pytest.approx(0.9)
    v_next = torch.zeros(len(cache))
    y = chunk_td_target(cache.ret, cache.discount, cache.terminal, v_next + 1.0)
    assert float(y[last0]) == pytest.approx(2.71 + 0.729) and float(y[last1]) == pytest.approx(2.71)
    # state = latent (D) + the newest normalised state (3)
    assert cache.state.shape == (12, model.latent_dim + 3) and cache.action.shape == (12, 3, 2)


def test_a_store_without_terminated_falls_back_to_done(tmp_path, kit):
    path = tmp_path / "old.zarr"
    rng = np.random.default_rng(0)
    with EpisodeStore(path, "w") as s:
        ep = kit.episode(6, 0.0, rng)
        ep.pop(kit.IMAGE)
        s.add_episode({**ep, "reward": np.ones(6, np.float32)})
    model = _model(kit)
    cache = build_transitions(path, model, _processors(path, kit, model), horizon=3, gamma=0.9)
    assert cache.terminal.tolist() == [False, False, False, True, True, True]


def test_buffer_checks_name_the_problem(tmp_path, kit):
    path = tmp_path / "buf.zarr"
    _store(path, kit, terminated_last=True, env="reach")
    with EpisodeStore(path, "r") as s:
        with pytest.raises(BufferError, match="expected episodes of env 'push'.*found env 'reach'"):
            check_buffer(s, "push", [kit.STATE])
        with pytest.raises(BufferError, match="missing \\['observation.images.front'\\]"):
            check_buffer(s, "reach", [kit.STATE, kit.IMAGE])
    zero = tmp_path / "zero.zarr"
    with EpisodeStore(zero, "w") as s:
        ep = kit.episode(6, 0.0, np.random.default_rng(0))
        s.add_episode(ep)  # reward back-filled with zeros
    with EpisodeStore(zero, "r") as s, pytest.raises(BufferError, match="found none non-zero in 6 steps"):
        check_buffer(s, None, [kit.STATE])


def _critic(**kw) -> ChunkCritic:
    torch.manual_seed(0)
    return ChunkCritic(CriticConfig(state_dim=4, action_dim=2, horizon=3, hidden_dim=16, n_layers=2, **kw))


def _batch(b=8):
    g = torch.Generator().manual_seed(1)
    return {
        "state": torch.randn(b, 4, generator=g),
        "action": torch.randn(b, 4, 2, generator=g),  # longer than H: the first 3 steps are scored
        "return": torch.rand(b, generator=g),
        "discount": torch.full((b,), 0.9**3),
        "terminal": torch.zeros(b, dtype=torch.bool),
        "next_state": torch.randn(b, 4, generator=g),
    }


def test_polyak_after_8_updates_moves_the_target_1_minus_0995_pow_8():
    critic = _critic(lr=0.0)  # Adam with lr 0: the online heads stay put, only the targets move
    with torch.no_grad():
        for p in critic.q_heads.parameters():
            p.fill_(1.0)
        for p in critic.q_targets.parameters():
            p.fill_(0.0)
    objective = IQLLoss(critic)
    run = iql_optimization(objective)
    for _ in range(8):
        run.step(objective(_batch())[0])
    expected = 1.0 - 0.995**8
    for p in critic.q_targets.parameters():
        torch.testing.assert_close(p, torch.full_like(p, expected))
    a, b = torch.zeros(3), torch.ones(3)
    t = torch.nn.Linear(3, 1)
    s = torch.nn.Linear(3, 1)
    with torch.no_grad():
        t.weight.copy_(a[None]), s.weight.copy_(b[None])
    polyak_update(t, s, 0.5)
    assert t.weight.tolist() == [[0.5, 0.5, 0.5]]


def test_no_gradient_reaches_the_frozen_encoder_or_the_target_heads(tmp_path, kit):
    path = tmp_path / "buf.zarr"
    _store(path, kit, terminated_last=True)
    model = _model(kit)
    cache = build_transitions(path, model, _processors(path, kit, model), horizon=3, gamma=0.9)
    critic = ChunkCritic(CriticConfig(state_dim=cache.state.shape[1], action_dim=2, horizon=3, hidden_dim=16))
    before = [p.clone() for p in critic.q_targets.parameters()]
    online = [p.clone() for p in critic.q_heads.parameters()]
    objective = IQLLoss(critic)
    iql_optimization(objective).step(objective(cache.batch(np.arange(8)))[0])
    assert all(p.grad is None for p in model.parameters())
    assert all(p.grad is None and not p.requires_grad for p in critic.q_targets.parameters())
    assert any(p.grad is not None for p in critic.q_heads.parameters())
    # the targets moved only by Polyak: t' = t + 0.005 (theta_new - t)
    for t0, t1, o1 in zip(before, critic.q_targets.parameters(), critic.q_heads.parameters(), strict=True):
        torch.testing.assert_close(t1, t0 + 0.005 * (o1.detach() - t0))
    assert any(not torch.equal(o0, o1) for o0, o1 in zip(online, critic.q_heads.parameters(), strict=True))


def test_action_enters_every_hidden_layer_and_heads_are_an_ensemble():
    critic = _critic(n_heads=3)
    assert [layer.in_features for layer in critic.q_heads[0].layers] == [4 + 6, 16 + 6]
    b = _batch(5)
    q = critic.q(b["state"], b["action"])
    assert q.shape == (3, 5)
    torch.testing.assert_close(critic.actor_q(b["state"], b["action"]), q.mean(0))
    # the pessimistic objective: mean - k std (population) over the heads
    torch.testing.assert_close(critic.actor_q(b["state"], b["action"], 0.5), q.mean(0) - 0.5 * q.std(0, False))
    two = _critic(n_heads=2)
    q2 = two.q(b["state"], b["action"])
    torch.testing.assert_close(two.actor_q(b["state"], b["action"], 1.0), q2.min(0).values)  # k = 1: the min
    with pytest.raises(ValueError, match=r"critic action: expected \(B, >= 3, 2\), received \(5, 2, 2\)"):
        critic.q(b["state"], b["action"][:, :2])
    with pytest.raises(ValueError, match="critic.expectile: expected a value in \\(0, 1\\), received 1.0"):
        _critic(expectile=1.0)


def test_critic_state_is_latent_then_newest_state_and_save_load(tmp_path):
    latent = torch.tensor([[1.0, 2.0]])
    obs = {"observation.state": torch.tensor([[[0.1, 0.2], [0.3, 0.4]]]), "img": torch.zeros(1, 2, 3, 4, 4)}
    assert critic_state(latent, obs).tolist() == [[1.0, 2.0, pytest.approx(0.3), pytest.approx(0.4)]]
    critic = _critic()
    back = ChunkCritic.load(critic.save(tmp_path / "c"))
    b = _batch()
    torch.testing.assert_close(back.q(b["state"], b["action"]), critic.q(b["state"], b["action"]))
    with pytest.raises(FileNotFoundError, match="critic.safetensors"):
        ChunkCritic.load(tmp_path / "missing")
