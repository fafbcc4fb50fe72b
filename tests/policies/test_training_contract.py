"""Overfitting a 2-episode dataset and checkpoint round trips (the shared train/inference transform:
test_processors.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from policylink.data.buffer import EpisodeStore
from policylink.data.processors import Processors
from policylink.data.sampler import SequenceDataset
from policylink.policies import load_policy
from policylink.policies.checkpoint import CheckpointError, save_checkpoint
from policylink.policies.processing import chunk_from_window, window_horizon
from policylink.policies.registry import build_model, make_policy

STATE, IMAGE = "observation.state", "observation.images.front"


def _dataset(store_path, normalizer, keys, cfg):
    horizon = window_horizon(cfg.n_obs_steps, cfg.chunk_size)
    chain = Processors.for_keys(keys, normalizer, n_obs_steps=cfg.n_obs_steps)
    return SequenceDataset(store_path, horizon=horizon, obs_keys=keys, processors=chain, **chain.window_args())


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["diffusion", "flow"])
def test_tiny_policy_overfits_two_episodes(kind, kit, store_path, normalizer):
    torch.manual_seed(0)
    cfg = kit.tiny_config(kind)
    ds = _dataset(store_path, normalizer, [STATE], cfg)
    items = [ds[i] for i in range(len(ds))]
    obs = {STATE: torch.stack([it[STATE] for it in items])}
    actions = chunk_from_window(torch.stack([it["action"] for it in items]), cfg.n_obs_steps)
    assert actions.shape == (len(items), 8, 2)
    model = build_model(cfg, kit.FEATURES, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(0)
    losses = []
    for _ in range(250):
        loss = model(obs, actions, model.draw_noise(len(actions), g))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    first, last = np.mean(losses[:10]), np.mean(losses[-20:])
    print(f"{kind}: loss {first:.4f} -> {last:.4f}")
    assert first > 0.5 and last < 0.1 * first, (first, last)
    # The sampled chunks reproduce the demonstrated ones (normalised actions lie in [-1, 1]).
    policy = make_policy(
        kind, spec=kit.make_spec(cfg, kit.FEATURES), processors=kit.chain(cfg, normalizer), config=cfg, device="cpu"
    )
    policy.model.load_state_dict(model.state_dict())
    with EpisodeStore(store_path) as store:
        ep = store.get_episode(0)
    window = {STATE: ep[STATE][None, 9:11]}  # newest observation: step 10 -> chunk = actions 10 .. 17
    chunk = policy.sample(window)
    err = np.abs(chunk[0] - ep["action"][10:18]).mean()
    print(f"{kind}: mean abs chunk error {err:.4f}")
    assert err < 0.25, err  # action x spans [2, 6]: a 6 % mean error at most


@pytest.mark.parametrize("kind", ["diffusion", "flow"])
def test_checkpoint_round_trip_gives_identical_actions(kind, kit, tmp_path, normalizer):
    cfg = kit.tiny_config(kind, keys=(STATE, IMAGE))
    spec = kit.make_spec(cfg, kit.FEATURES)
    policy = make_policy(kind, spec=spec, processors=kit.chain(cfg, normalizer), config=cfg, device="cpu", seed=11)
    with torch.no_grad():  # move off the init so that a silently skipped load would show
        for p in policy.model.parameters():
            p.add_(0.01 * torch.randn_like(p))
    path = policy.save(tmp_path / "ckpt")
    assert sorted(f.name for f in path.iterdir()) == [
        "config.json",
        "model.safetensors",
        "normalizer.safetensors",
        "policy_spec.json",
        "processors.json",
    ]
    assert json.loads((path / "policy_spec.json").read_text())["chunk_size"] == 8
    loaded = load_policy(path, device="auto", seed=11)
    rng = np.random.default_rng(1)
    obs = {
        STATE: rng.normal(size=(3, 3)).astype(np.float32),
        IMAGE: rng.integers(0, 256, (3, 24, 24, 3), dtype=np.uint8),
    }
    for p in (policy, loaded):
        p.reseed(11)
        p.update_observation(obs)
    np.testing.assert_array_equal(policy.predict_action_chunk(), loaded.predict_action_chunk())
    np.testing.assert_array_equal(policy.embed(loaded.history), loaded.embed(loaded.history))


def test_checkpoint_missing_file_is_named(kit, tmp_path, normalizer):
    cfg = kit.tiny_config("flow")
    model = build_model(cfg, kit.FEATURES, 2)
    path = save_checkpoint(
        tmp_path / "c", model=model, spec=kit.make_spec(cfg, kit.FEATURES), processors=kit.chain(cfg, normalizer)
    )
    (path / "normalizer.safetensors").unlink()
    with pytest.raises(CheckpointError, match="missing normalizer.safetensors"):
        load_policy(path, device="cpu")


def test_padded_steps_are_left_out_of_the_loss(kit):
    model = build_model(kit.tiny_config("flow"), kit.FEATURES, 2)
    cond, actions = torch.randn(3, model.encoder.out_dim), torch.randn(3, 8, 2)
    noise = model.draw_noise(3, torch.Generator().manual_seed(0))
    pred, target = model.loss_terms(cond, actions, noise)
    valid = torch.ones(3, 8, dtype=torch.bool)
    valid[:, 5:] = False  # steps 5..7 are past the episode's end
    expected = (pred - target)[:, :5].square().sum() / (3 * 8 * 2)  # denominator: every entry
    torch.testing.assert_close(model.loss(cond, actions, noise, valid), expected)
    torch.testing.assert_close(model.loss(cond, actions, noise), (pred - target).square().mean())
    assert float(model.loss(cond, actions, noise, torch.zeros(3, 8, dtype=torch.bool)).detach()) == 0.0
    per = model.per_sample_loss(cond, actions, noise, valid)
    torch.testing.assert_close(per, (pred - target)[:, :5].square().sum(dim=(1, 2)) / (8 * 2))  # (B,)
    torch.testing.assert_close(per.mean(), model.loss(cond, actions, noise, valid))
