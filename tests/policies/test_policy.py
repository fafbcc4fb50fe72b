"""The chunk policy adapter: samplers through the policy (shapes, action units, guidance calls, determinism), the
capabilities (GuidedSampler, Embedder with the latent cache, Conditionable, PrefixConditioned) and row subsets."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from policylink.data.normalize import Normalizer
from policylink.policies.policy import ChunkPolicy, make_chunk_policy
from policylink.policies.registry import build_model

STATE, IMAGE = "observation.state", "observation.images.front"

# Known stats: action x in [2, 6], y in [-1, 1] -> normalised 0 is (4, 0), normalised 1 is (6, 1).
STATS = {
    STATE: {"min": np.zeros(3), "max": np.ones(3)},
    "action": {"min": np.array([2.0, -1.0]), "max": np.array([6.0, 1.0])},
}


def known_normalizer() -> Normalizer:
    return Normalizer(STATS, {STATE: "min_max", "action": "min_max", IMAGE: "identity"})


def window(b: int, t: int = 2, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        STATE: rng.uniform(0, 1, (b, t, 3)).astype(np.float32),
        IMAGE: rng.integers(0, 256, (b, t, 24, 24, 3), dtype=np.uint8),
    }


@pytest.mark.parametrize("kind", ["diffusion", "flow"])
def test_sampler_returns_chunks_in_action_units(kind, kit):
    FEATURES, tiny_config, make_spec = kit.FEATURES, kit.tiny_config, kit.make_spec
    cfg = tiny_config(kind)
    policy = make_chunk_policy(
        kind, spec=make_spec(cfg, FEATURES), normalizer=known_normalizer(), config=cfg, device="cpu"
    )
    obs = window(3)
    chunk = policy.sample(obs)
    assert chunk.shape == (3, 8, 2) and chunk.dtype == np.float32
    # A zero prediction keeps the chunk where it starts: from noise 0 the result is normalised 0 = (4, 0) in
    # action units, from noise 1 it is normalised 1 = (6, 1) (diffusion clips its clean estimate at 1).
    zero = lambda x, t, out, cond, sampler: torch.zeros_like(out)  # noqa: E731
    mid = policy.sample(obs, guidance=zero, noise=torch.zeros(3, 8, 2))
    np.testing.assert_allclose(mid, np.broadcast_to([4.0, 0.0], (3, 8, 2)), atol=1e-5)
    if kind == "flow":
        top = policy.sample(obs, guidance=zero, noise=torch.ones(3, 8, 2))
        np.testing.assert_allclose(top, np.broadcast_to([6.0, 1.0], (3, 8, 2)), atol=1e-5)


@pytest.mark.parametrize("kind,steps", [("diffusion", 10), ("flow", 10), ("flow", 4)])
def test_guidance_sees_every_step_in_increasing_time(kind, steps, kit):
    FEATURES, tiny_config = kit.FEATURES, kit.tiny_config
    cfg = tiny_config(kind)
    model = build_model(cfg, FEATURES, 2).eval()
    seen = []

    def guidance(x, t, out, cond, sampler):
        seen.append(t.clone())
        assert x.shape == out.shape == (2, 8, 2) and t.shape == (2,)
        return out

    model.generate(torch.zeros(2, model.encoder.out_dim), torch.randn(2, 8, 2), num_steps=steps, guidance=guidance)
    times = torch.stack(seen)[:, 0]
    assert len(seen) == steps
    assert torch.all(times[1:] > times[:-1]) and 0.0 <= float(times[0]) and float(times[-1]) <= 1.0
    if kind == "flow":
        torch.testing.assert_close(times, torch.arange(steps) / steps)
    else:  # DDIM timesteps 90, 80, ..., 0 of 100 -> t = 1 - k / 100
        torch.testing.assert_close(times, 1.0 - torch.arange(90, -1, -10).float() / 100)


@pytest.mark.parametrize("kind", ["diffusion", "flow"])
def test_policy_adapter_batched_and_seeded(kind, kit):
    FEATURES, tiny_config, make_spec = kit.FEATURES, kit.tiny_config, kit.make_spec
    cfg = tiny_config(kind, keys=(STATE, IMAGE))
    spec = make_spec(cfg, FEATURES)
    a = make_chunk_policy(kind, spec=spec, normalizer=known_normalizer(), config=cfg, device="cpu", seed=3)
    obs = window(4)
    a.update_observation({k: v[:, 0] for k, v in obs.items()})
    a.update_observation({k: v[:, 1] for k, v in obs.items()})
    c1 = a.predict_action_chunk()
    assert c1.shape == (4, 8, 2)
    np.testing.assert_array_equal(a.history[STATE], obs[STATE])  # the window the sampler saw
    a.reseed(3)
    np.testing.assert_array_equal(a.predict_action_chunk(), c1)
    assert not np.array_equal(a.predict_action_chunk(), c1)  # the noise stream moves on
    emb = a.embed(obs)
    assert emb.shape == (4, a.model.encoder.out_dim) and emb.dtype == np.float32
    # conditioning matters: different observations -> different latents
    assert not np.allclose(emb[0], emb[1])


def test_spec_mismatch_names_the_field(kit):
    FEATURES, tiny_config, make_spec = kit.FEATURES, kit.tiny_config, kit.make_spec
    cfg = tiny_config("flow")
    spec = make_spec(tiny_config("flow", chunk_size=16), FEATURES)
    with pytest.raises(ValueError, match="chunk_size: expected 8 .* received 16"):
        ChunkPolicy(build_model(cfg, FEATURES, 2), known_normalizer(), spec)


def test_noise_shape_is_checked(kit):
    FEATURES, tiny_config, make_spec = kit.FEATURES, kit.tiny_config, kit.make_spec
    cfg = tiny_config("flow")
    policy = make_chunk_policy(
        "flow", spec=make_spec(cfg, FEATURES), normalizer=known_normalizer(), config=cfg, device="cpu"
    )
    with pytest.raises(ValueError, match=r"noise: expected shape \(2, 8, 2\), received \(2, 4, 2\)"):
        policy.sample(window(2), noise=torch.zeros(2, 4, 2))


def test_flow_beta_time_sampling_range_and_mean(kit):
    FEATURES, tiny_config = kit.FEATURES, kit.tiny_config
    model = build_model(tiny_config("flow"), FEATURES, 2)
    model.cfg.flow.time_sampling = "beta"
    t = model.draw_noise(20000, torch.Generator().manual_seed(0))["t"]
    # t = 1 - s with s ~ Beta(1.5, 1): E[s] = 1.5 / 2.5 = 0.6 -> E[t] = 0.4
    assert 0.0 <= float(t.min()) and float(t.max()) <= 1.0
    assert abs(float(t.mean()) - 0.4) < 0.01
