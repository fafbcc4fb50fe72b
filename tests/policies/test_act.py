"""ACT (the third registered policy folder): overfits two episodes, checkpoint round trip, config checks, training
through ``policylink train`` with the committed configs, and a round trip over the wire."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from policylink.adapters.capabilities import GuidedSampler, capabilities_of
from policylink.data.buffer import EpisodeStore
from policylink.data.processors import Processors
from policylink.data.sampler import SequenceDataset
from policylink.policies import load_policy
from policylink.policies.act import ACTConfig, make_act_policy
from policylink.policies.act.policy import ACTPolicy
from policylink.policies.common.encoder_config import EncoderConfig
from policylink.policies.config import PolicyConfig
from policylink.policies.model import GenerativeChunkModel
from policylink.policies.processing import chunk_from_window, window_horizon
from policylink.policies.registry import build_model, make_config, make_policy

STATE, IMAGE = "observation.state", "observation.images.front"
ROOT = Path(__file__).resolve().parents[2]
TINY = ACTConfig(dim_model=32, n_heads=4, dim_feedforward=64, n_encoder_layers=1, latent_dim=8, dropout=0.0)


def _config(kit, keys=(STATE,), **kw) -> PolicyConfig:
    """A tiny ACT (width 32, 1 layer each, latent 8), chunk 8, the small conv for images, min_max normalisation (the
    fixture normaliser's)."""
    fields = dict(observation_keys=list(keys), chunk_size=8, n_action_steps=4, act=TINY,
                  encoder=EncoderConfig(vision_backbone="small_conv", num_keypoints=8),
                  state_norm_mode="min_max", action_norm_mode="min_max")  # fmt: skip
    return make_config("act", **{**fields, **kw})


def _policy(kit, normalizer, keys=(STATE,), **kw) -> ACTPolicy:
    cfg = _config(kit, keys, **kw)
    return make_act_policy(
        spec=kit.make_spec(cfg, kit.FEATURES), processors=kit.chain(cfg, normalizer), config=cfg, device="cpu"
    )


def test_act_overfits_two_episodes(kit, store_path, normalizer):
    torch.manual_seed(0)
    cfg = _config(kit)
    assert cfg.n_obs_steps == 1 and cfg.act.kl_weight == 10.0  # ACT's observation horizon and beta
    ds = SequenceDataset(store_path, n_obs_steps=1, horizon=window_horizon(1, cfg.chunk_size), obs_keys=[STATE],
                         processors=Processors.for_keys([STATE], normalizer))  # fmt: skip
    items = [ds[i] for i in range(len(ds))]
    obs = {STATE: torch.stack([it[STATE] for it in items])}
    actions = chunk_from_window(torch.stack([it["action"] for it in items]), 1)
    valid = ~torch.stack([it["action_is_pad"] for it in items])
    assert actions.shape == (56, 8, 2) and not valid.all()  # 30 + 26 windows; the last ones run past the end
    model = build_model(cfg, kit.FEATURES, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(0)
    losses, l1 = [], []
    for _ in range(150):
        cond = model.embed(obs)
        parts = model.loss_parts(cond, actions, model.draw_noise(len(actions), g), valid)
        loss = parts["l1"] + cfg.act.kl_weight * parts["kl"]
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
        l1.append(float(parts["l1"].detach()))
    first, last = np.mean(losses[:5]), np.mean(losses[-20:])
    print(f"act: loss {first:.4f} -> {last:.4f}, L1 {np.mean(l1[:5]):.4f} -> {np.mean(l1[-20:]):.4f}")
    assert first > 1.0 and last < 0.1 * first, (first, last)
    assert np.mean(l1[-20:]) < 0.1, l1[-20:]  # min_max units: the demo actions span [-1, 1]
    # z = 0 at inference: the chunk reproduces the demonstrated one (action x spans [2, 6], y [-1, 1])
    policy = make_act_policy(
        spec=kit.make_spec(cfg, kit.FEATURES), processors=kit.chain(cfg, normalizer), config=cfg, device="cpu"
    )
    policy.model.load_state_dict(model.state_dict())
    with EpisodeStore(store_path) as store:
        ep = store.get_episode(1)
    policy.update_observation({STATE: ep[STATE][[4, 12]]})  # two rows: newest steps 4 and 12
    chunk = policy.predict_action_chunk()
    err = np.abs(chunk - np.stack([ep["action"][4:12], ep["action"][12:20]])).mean()
    print(f"act: mean abs chunk error {err:.4f}")
    assert chunk.shape == (2, 8, 2) and err < 0.15, err


def test_act_loss_is_l1_plus_weighted_kl_with_padded_steps_masked(kit):
    cfg = _config(kit, act=ACTConfig(**{**TINY.__dict__, "kl_weight": 2.5}))
    model = build_model(cfg, kit.FEATURES, 2).eval()
    torch.manual_seed(1)
    obs, actions = {STATE: torch.randn(4, 1, 3)}, torch.randn(4, 8, 2)
    valid = torch.ones(4, 8, dtype=torch.bool)
    valid[0, 5:] = False
    noise = model.draw_noise(4, torch.Generator().manual_seed(0))
    assert noise["noise"].shape == (4, 8)  # one reparameterisation draw of z per sample
    cond = model.embed(obs)
    parts = model.loss_parts(cond, actions, noise, valid)
    mu, log_var = model.posterior(cond, actions, valid)
    pred = model.decode(cond, mu + (0.5 * log_var).exp() * noise["noise"])
    l1 = ((pred - actions).abs() * valid[..., None]).sum() / (4 * 8 * 2)  # padded steps zeroed, same denominator
    kl = 0.5 * (mu.square() + log_var.exp() - 1.0 - log_var).sum(-1).mean()
    torch.testing.assert_close(parts["l1"], l1)
    torch.testing.assert_close(parts["kl"], kl)
    torch.testing.assert_close(model(obs, actions, noise, valid), l1 + 2.5 * kl)
    # padded actions do not reach the posterior: changing them leaves mu unchanged
    changed = actions.clone()
    changed[0, 5:] += 100.0
    torch.testing.assert_close(model.posterior(cond, changed, valid)[0], mu)
    # inference decodes with z = 0, the prior's mean
    torch.testing.assert_close(model.predict(cond), model.decode(cond, torch.zeros(4, 8)))
    assert not isinstance(model, GenerativeChunkModel) and not hasattr(model, "generate")  # no sampler to guide


def test_act_checkpoint_round_trip_and_capabilities(kit, tmp_path, normalizer):
    policy = _policy(kit, normalizer, keys=(STATE, IMAGE))  # the camera through the shared image encoder
    assert isinstance(policy, ACTPolicy) and capabilities_of(policy) == ["embedder"]
    assert not isinstance(policy, GuidedSampler)
    with torch.no_grad():  # move off the init so that a silently skipped load would show
        for p in policy.model.parameters():
            p.add_(0.01 * torch.randn_like(p))
    path = policy.save(tmp_path / "ckpt")
    loaded = load_policy(path, device="cpu")
    assert isinstance(loaded, ACTPolicy) and loaded.config == policy.config
    rng = np.random.default_rng(1)
    obs = {STATE: rng.normal(size=(3, 3)).astype(np.float32), IMAGE: rng.integers(0, 256, (3, 24, 24, 3), np.uint8)}
    for p in (policy, loaded):
        p.update_observation(obs)
    expected = policy.predict_action_chunk()
    assert expected.shape == (3, 8, 2) and np.abs(expected).max() > 0
    np.testing.assert_array_equal(loaded.predict_action_chunk(), expected)
    # rows 2, 0 alone: a batch of 2, not 3, so other GEMM/conv blockings; float32 rounding may differ by a few
    # ulp (4.8e-7 with MKL's and oneDNN's AVX2 kernels); actions span [2, 6] x [-1, 1], and another row differs
    # by far more than the tolerance (checked next)
    np.testing.assert_allclose(loaded.predict_action_chunk([2, 0]), expected[[2, 0]], rtol=1e-5, atol=1e-5)
    assert np.abs(expected[2] - expected[0]).max() > 1e-2
    assert loaded.embed().shape == (3, loaded.latent_dim) == (3, 3 + 16)  # state (3) + 8 keypoints x 2
    np.testing.assert_array_equal(policy.embed(None, [1]), loaded.embed(None, [1]))
    with pytest.raises(ValueError, match="expected policy type 'flow', received 'act'"):
        make_policy("flow", path)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"kl_weight": -1.0}, "policy.act.kl_weight: expected >= 0, received -1.0"),
        ({"dim_model": 30}, "policy.act.dim_model: expected an even multiple of n_heads=4, received 30"),
        ({"dropout": 1.0}, r"policy.act.dropout: expected a value in \[0, 1\), received 1.0"),
        ({"n_vae_encoder_layers": 0}, "policy.act.n_vae_encoder_layers: expected >= 1, received 0"),
    ],
)
def test_bad_act_fields_are_named(override, message):
    with pytest.raises(ValueError, match=message):
        make_config("act", act=ACTConfig(**override)).validate()


def test_act_config_parses_from_a_dict_and_refuses_a_label_slot():
    cfg = PolicyConfig.from_dict({"type": "act", "chunk_size": 10, "act": {"dim_model": 64}})
    assert (cfg.type, cfg.chunk_size, cfg.act.dim_model, cfg.act.latent_dim) == ("act", 10, 64, 32)
    assert (cfg.state_norm_mode, cfg.action_norm_mode) == ("mean_std", "mean_std")
    with pytest.raises(ValueError, match="policy.conditioning: expected none for act"):
        PolicyConfig.from_dict({"type": "act", "conditioning": {"num_labels": 2}}).validate()
    with pytest.raises(ValueError, match="policy.memory: expected 'none' for act .*, received 'sega'"):
        PolicyConfig.from_dict({"type": "act", "memory": "sega"}).validate()


@pytest.mark.parametrize("name", ["act_push_state", "act_pick_place_state"])
def test_committed_act_configs_train_through_the_trainer(name, tmp_path):
    """``policylink train --config configs/train/<name>.yaml`` (the imitation loss, unchanged) on a tiny store with
    the env's shapes; the checkpoint loads as an ACTPolicy."""
    from policylink.adapters.registry import make_env
    from policylink.cli.train import main

    env = "push" if "push" in name else "pick_place"
    spec = make_env(env, obs_mode="state").env_spec
    d, a = spec.observation_features[STATE].shape[0], spec.action.dim
    rng = np.random.default_rng(0)
    store = tmp_path / "demo.zarr"
    with EpisodeStore(store, "w") as s:
        for length in (20, 24):
            s.add_episode({STATE: rng.normal(size=(length, d)).astype(np.float32),
                           "action": rng.uniform(-1, 1, (length, a)).astype(np.float32)})  # fmt: skip
    out = tmp_path / "run"
    argv = ["--config", str(ROOT / "configs/train" / f"{name}.yaml"), "--dataset.path", str(store),
            "--dataset.val_fraction", "0", "--output_dir", str(out), "--steps", "2", "--batch_size", "4",
            "--val_every", "0", "--log_every", "1", "--progress", "false", "--device", "cpu"]  # fmt: skip
    assert main(argv) == 0
    policy = load_policy(out / "checkpoints/last", device="cpu")
    assert isinstance(policy, ACTPolicy) and policy.config.act.dim_model == 128
    assert (policy.spec.n_obs_steps, policy.spec.chunk_size, policy.spec.n_action_steps) == (1, 16, 1)
    lines = (out / "metrics.csv").read_text().splitlines()
    assert len(lines) == 3 and float(lines[-1].split(",")[1]) > 0  # header + 2 steps, a positive loss


def test_act_served_over_zmq_gives_the_in_process_chunks(kit, normalizer, served):
    from policylink.adapters.capabilities import Embedder

    torch.manual_seed(0)
    local = _policy(kit, normalizer)
    torch.manual_seed(0)
    remote = served(_policy(kit, normalizer))
    obs = {STATE: np.random.default_rng(0).normal(size=(3, 3)).astype(np.float32)}
    assert isinstance(remote, Embedder) and not isinstance(remote, GuidedSampler)
    local.update_observation(obs)
    remote.update_observation(obs)
    np.testing.assert_array_equal(remote.predict_action_chunk(), local.predict_action_chunk())
    np.testing.assert_array_equal(remote.predict_action_chunk([1]), local.predict_action_chunk([1]))
    np.testing.assert_array_equal(remote.embed(None, [2]), local.embed(None, [2]))
