"""The chunk policy adapter: samplers through the policy (shapes, action units, guidance calls, determinism), the
capabilities (GuidedSampler, Embedder with the latent cache, Conditionable, PrefixConditioned) and row subsets."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from policylink.data.normalize import Normalizer
from policylink.data.processors import Processors
from policylink.policies.policy import ChunkPolicy
from policylink.policies.processing import processors_for
from policylink.policies.registry import build_model, make_policy

STATE, IMAGE = "observation.state", "observation.images.front"

# Known stats: action x in [2, 6], y in [-1, 1] -> normalised 0 is (4, 0), normalised 1 is (6, 1).
STATS = {
    STATE: {"min": np.zeros(3), "max": np.ones(3)},
    "action": {"min": np.array([2.0, -1.0]), "max": np.array([6.0, 1.0])},
}


# Chunks of the same rows sampled from latents encoded in another row order: float32 rounding only (see
# test_predict_honours_env_ids); 25x the measured 2-ulp amplification, 1e-4 of the action range.
ROW_ORDER_ATOL = 1e-4


def known_normalizer() -> Normalizer:
    return Normalizer(STATS, {STATE: "min_max", "action": "min_max", IMAGE: "identity"})


def known_chain(cfg, features) -> Processors:
    """The processor chain of ``cfg`` with the known statistics."""
    return processors_for(cfg, features, known_normalizer())


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
    policy = make_policy(
        kind, spec=make_spec(cfg, FEATURES), processors=known_chain(cfg, FEATURES), config=cfg, device="cpu"
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
    a = make_policy(kind, spec=spec, processors=known_chain(cfg, FEATURES), config=cfg, device="cpu", seed=3)
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
        ChunkPolicy(build_model(cfg, FEATURES, 2), known_chain(cfg, FEATURES), spec)


def test_noise_shape_is_checked(kit):
    FEATURES, tiny_config, make_spec = kit.FEATURES, kit.tiny_config, kit.make_spec
    cfg = tiny_config("flow")
    policy = make_policy(
        "flow", spec=make_spec(cfg, FEATURES), processors=known_chain(cfg, FEATURES), config=cfg, device="cpu"
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


def _policy(kit, kind, seed=0, **kw):
    cfg = kit.tiny_config(kind, **kw)
    chain = known_chain(cfg, kit.FEATURES)
    return make_policy(
        kind, spec=kit.make_spec(cfg, kit.FEATURES), processors=chain, config=cfg, device="cpu", seed=seed
    )


def _count_encoder_rows(policy):
    """Encoder calls as a list of batch sizes (a forward hook on the observation encoder)."""
    rows = []
    policy.model.encoder.register_forward_hook(lambda mod, args, out: rows.append(out.shape[0]))
    return rows


def test_capabilities_follow_the_sampler_not_the_type_name(kit):
    from policylink.adapters.capabilities import capabilities_of

    assert capabilities_of(_policy(kit, "flow")) == ["conditionable", "embedder", "guided_sampler", "prefix"]
    assert capabilities_of(_policy(kit, "diffusion")) == ["conditionable", "embedder", "guided_sampler"]
    assert _policy(kit, "flow").sampler.prediction == "velocity"


def test_embed_reuses_the_latent_of_the_last_chunk(kit):
    policy = _policy(kit, "flow")
    calls = _count_encoder_rows(policy)
    obs = window(3)
    policy.update_observation({k: v[:, 0] for k, v in obs.items()})
    policy.predict_action_chunk()
    assert calls == [3]
    latent = policy.embed()
    assert calls == [3] and latent.shape == (3, policy.latent_dim)  # no second encoder pass
    np.testing.assert_array_equal(latent, policy.embed(policy.history))  # the same numbers as a fresh encoding
    assert calls == [3, 3]
    policy.predict_action_chunk([0, 2])  # replan without a new observation: cached
    np.testing.assert_array_equal(policy.embed(env_ids=[2, 1]), latent[[2, 1]])
    assert calls == [3, 3]
    policy.update_observation({k: v[:, 1] for k, v in obs.items()})
    policy.predict_action_chunk([1])  # only row 1 is encoded
    policy.embed(env_ids=[1])
    assert calls == [3, 3, 1]
    policy.reset([1])
    policy.update_observation({k: v[:, 0] for k, v in obs.items()})
    policy.embed()
    assert calls == [3, 3, 1, 3]


@pytest.mark.parametrize("kind", ["diffusion", "flow"])
def test_predict_honours_env_ids(kind, kit):
    policy = _policy(kit, kind, seed=7)
    obs = window(4)
    policy.update_observation({k: v[:, 0] for k, v in obs.items()})
    policy.reseed(7)
    sub = policy.predict_action_chunk([3, 1])
    policy.reseed(7)
    direct = policy.sample({k: v[[3, 1]] for k, v in policy.history.items()})
    assert sub.shape == (2, 8, 2)
    # not bit for bit: predict encodes rows [1, 3] (sorted), sample rows [3, 1], and a GEMM may round a row
    # differently at another batch position (MKL's AVX2 kernels); 2-ulp latent jitter moves the chunk by
    # <= 4.3e-6, swapping the two rows by > 3 (actions span [2, 6] x [-1, 1])
    np.testing.assert_allclose(sub, direct, rtol=0, atol=ROW_ORDER_ATOL)
    with pytest.raises(IndexError, match=r"env_ids: expected indices in \[0, 4\), received \[4\]"):
        policy.predict_action_chunk([4])


def test_sample_returns_the_trajectory(kit):
    policy = _policy(kit, "flow")
    res = policy.sample(window(2), return_trajectory=True, num_steps=5)
    assert res.trajectory.shape == (6, 2, 8, 2) and res.outputs.shape == (5, 2, 8, 2) and res.cond.shape[0] == 2
    np.testing.assert_allclose(policy.unnormalize_actions(res.trajectory[-1]), res.actions)
    torch.testing.assert_close(res.times, torch.tensor([0.0, 0.2, 0.4, 0.6, 0.8, 1.0]))


def test_conditioning_slot_labels_reach_the_network(kit):
    from policylink.adapters.capabilities import ConditioningSpec

    policy = _policy(kit, "flow", seed=1, conditioning=ConditioningSpec(num_labels=2))
    with torch.no_grad():  # distinct label embeddings (they start at zero)
        policy.model.extra_conditioning.labels.weight.copy_(torch.arange(3.0)[:, None].expand(3, policy.latent_dim))
    offset = policy.model.conditioning_embedding(3, labels=torch.tensor([1, -1, 0]))
    torch.testing.assert_close(offset[:, 0], torch.tensor([1.0, 2.0, 0.0]))  # -1 is the null row (index 2)
    obs = window(3)
    policy.set_conditioning(labels=[1, -1, 0])  # before the first observation: kept for the first batch
    policy.update_observation({k: v[:, 0] for k, v in obs.items()})
    policy.reseed(1)
    conditioned = policy.predict_action_chunk()
    policy.reseed(1)
    np.testing.assert_array_equal(conditioned, policy.sample(policy.history, labels=[1, -1, 0]))
    policy.reseed(1)
    assert not np.allclose(conditioned, policy.sample(policy.history))  # the null label differs from 1 and 0
    policy.reset([0])  # back to null for row 0 only
    assert policy._labels.tolist() == [-1, -1, 0]
    # training: the loss accepts labels and the label changes it
    model = policy.model.train()
    x = {STATE: torch.rand(3, 2, 3)}
    acts, noise = torch.rand(3, 8, 2), model.draw_noise(3, torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert float(model(x, acts, noise, labels=torch.tensor([1, 1, 1]))) != float(model(x, acts, noise))
    with pytest.raises(ValueError, match="no label slot|conditioning slot"):
        _policy(kit, "flow").set_conditioning(labels=[1])


def test_sample_history_rows_keeps_their_conditioning(kit):
    """A guided replan of a subset of rows (executors' ``replan``) samples those rows with their own labels."""
    from policylink.adapters.capabilities import ConditioningSpec

    policy = _policy(kit, "flow", seed=2, conditioning=ConditioningSpec(num_labels=2))
    with torch.no_grad():
        policy.model.extra_conditioning.labels.weight.copy_(torch.arange(3.0)[:, None].expand(3, policy.latent_dim))
    policy.set_conditioning(labels=[1, 0, 1])
    policy.update_observation({k: v[:, 0] for k, v in window(3).items()})
    policy.reseed(2)
    rows = policy.sample(None, env_ids=[2, 1], guidance=lambda x_t, t, out, cond, sampler: out)
    policy.reseed(2)
    explicit = policy.sample({k: v[[2, 1]] for k, v in policy.history.items()}, labels=[1, 0])
    np.testing.assert_allclose(rows, explicit, rtol=0, atol=ROW_ORDER_ATOL)  # rows encoded as [1, 2] vs [2, 1]
    policy.reseed(2)
    assert not np.allclose(rows, policy.sample({k: v[[2, 1]] for k, v in policy.history.items()}))  # null labels
    with pytest.raises(ValueError, match="env_ids selects rows of the history"):
        policy.sample(window(2), env_ids=[0])


def test_rtc_prefix_pulls_the_frozen_steps_onto_the_committed_actions(kit):
    from policylink.adapters.capabilities import ChunkPrefix
    from policylink.policies.common.rtc import rtc_weights

    torch.manual_seed(0)
    policy = _policy(kit, "flow")  # untrained: its chunks are noise-driven, far from any given target
    policy.update_observation({STATE: np.random.default_rng(0).uniform(0, 1, (4, 3)).astype(np.float32)})
    committed = np.random.default_rng(1).uniform([2, -1], [6, 1], (4, 8, 2)).astype(np.float32)
    weights = np.broadcast_to(rtc_weights(8, 2, 3), (4, 8)).astype(np.float32)
    policy.reseed(5)
    guided = policy.predict_action_chunk_with_prefix(ChunkPrefix(committed, weights, 5.0))
    policy.reseed(5)
    free = policy.predict_action_chunk()
    err_guided = np.abs(guided[:, :2] - committed[:, :2]).mean()  # W = 1 steps
    err_free = np.abs(free[:, :2] - committed[:, :2]).mean()
    assert err_guided < err_free / 40, (err_guided, err_free)  # measured: 0.027 vs 2.29 (86x)
    sub = policy.predict_action_chunk_with_prefix(ChunkPrefix(committed[[2]], weights[[2]], 5.0), env_ids=[2])
    assert sub.shape == (1, 8, 2)
    with pytest.raises(ValueError, match=r"prefix.actions: expected shape \(1, 8, 2\), received \(4, 8, 2\)"):
        policy.predict_action_chunk_with_prefix(ChunkPrefix(committed, weights, 5.0), env_ids=[2])


def test_a_checkpoint_in_the_old_config_format_loads(kit, tmp_path):
    """config.yaml written before the registry (every head's section for every type, no conditioning field) and
    before config.json: the older layout's YAML is still read."""
    import yaml

    from policylink.policies import load_policy

    policy = _policy(kit, "flow", seed=2)
    path = policy.save(tmp_path / "ckpt")
    doc = json.loads((path / "config.json").read_text())
    (path / "config.json").unlink()
    old = {k: v for k, v in doc["policy"].items() if k != "conditioning"}
    old["diffusion"] = {"num_train_timesteps": 100, "beta_schedule": "squaredcos_cap_v2", "num_inference_steps": 10,
                        "prediction_type": "epsilon", "clip_sample": True, "clip_sample_range": 1.0}  # fmt: skip
    assert list(old)[0] == "type"
    (path / "config.yaml").write_text(yaml.safe_dump({"policy": old}, sort_keys=False))
    loaded = load_policy(path, device="cpu", seed=2)
    assert loaded.config == policy.config
    obs = {k: v[:, 0] for k, v in window(2).items()}
    for p in (policy, loaded):
        p.reseed(2)
        p.update_observation(obs)
    np.testing.assert_array_equal(policy.predict_action_chunk(), loaded.predict_action_chunk())
