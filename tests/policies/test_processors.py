"""One processor chain per policy: the training sampler and inference turn the same raw observation into the same
arrays, the chain round-trips through a checkpoint (``processors.json``; derived from the config when absent), and
it is the one thing a policy is built with (``normalizer=`` is a deprecated alias for one release)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from policylink.adapters.schema import TASK_KEY
from policylink.data.buffer import EpisodeStore
from policylink.data.normalize import Normalizer
from policylink.data.processors import PROCESSORS_FILE, ProcessorError, Processors
from policylink.data.sampler import SequenceDataset
from policylink.data.stats import compute_stats
from policylink.policies.checkpoint import CheckpointError, save_checkpoint
from policylink.policies.processing import normalizer_modes, observation_tensors, processors_for, window_horizon
from policylink.policies.registry import build_model, load_checkpoint


def _normalizer(store_path, kit):
    """Non-trivial statistics for every key: mean/std for the camera and the state, min/max for the action."""
    with EpisodeStore(store_path, "r") as store:
        stats = compute_stats(store)
    return Normalizer(stats, normalizer_modes(kit.FEATURES, "mean_std", "min_max", image_mode="mean_std"))


def _policy(kit, normalizer, **kw):
    cfg = kit.tiny_config("flow", keys=(kit.STATE, kit.IMAGE), n_obs_steps=3, **kw)
    torch.manual_seed(0)
    model = build_model(cfg, kit.FEATURES, 2)
    return cfg, model, kit.make_spec(cfg, kit.FEATURES)


def test_the_chain_names_its_steps_with_their_parameters(kit, store_path):
    normalizer = _normalizer(store_path, kit)
    cfg, model, _ = _policy(kit, normalizer)
    chain = processors_for(cfg, kit.FEATURES, normalizer)
    assert [s["step"] for s in chain.steps] == ["frame_stack", "layout", "normalize", "crop"]
    assert chain.step("frame_stack") == {"step": "frame_stack", "n_obs_steps": 3, "chain_windows": 1, "chain_stride": 1}
    assert chain.step("layout") == {"step": "layout", "images": [kit.IMAGE], "pointmaps": [], "vectors": [kit.STATE]}
    assert chain.step("normalize")["modes"] == {kit.STATE: "mean_std", kit.IMAGE: "mean_std", "action": "min_max"}
    assert chain.step("crop") == {"step": "crop", "keys": [kit.IMAGE], "ratio": 0.9, "train": "random",
                                  "eval": "center", "runs_in": "model"}  # fmt: skip
    assert chain.window_args() == {"n_obs_steps": 3}
    vla = kit.tiny_config("flow", keys=(kit.STATE,), encoder=cfg.encoder)
    assert "crop" not in [s["step"] for s in processors_for(vla, kit.FEATURES, normalizer).steps]  # no camera
    with pytest.raises(ProcessorError, match="normalize.modes"):
        Processors(chain.steps, Normalizer(compute_stats(EpisodeStore(store_path, "r")), {"action": "min_max"}))


def test_sampler_and_inference_give_identical_arrays_for_the_same_raw_observation(kit, store_path):
    normalizer = _normalizer(store_path, kit)
    cfg, model, spec = _policy(kit, normalizer)
    from policylink.policies.policy import policy_for_model

    chain = processors_for(cfg, kit.FEATURES, normalizer)
    policy = policy_for_model(model, chain, spec)
    assert policy.processors is chain
    ds = SequenceDataset(store_path, horizon=window_horizon(3, cfg.chunk_size), obs_keys=[kit.STATE, kit.IMAGE],
                         processors=chain, **chain.window_args())  # fmt: skip
    with EpisodeStore(store_path, "r") as store:
        raw = store.load([kit.STATE, kit.IMAGE])
    features = spec.observation_features
    policy.reset()
    for t in range(5):  # the first windows repeat the first frame (edge padding) on both sides
        policy.update_observation({k: raw[k][t][None] for k in features})
        history, _, _ = policy.rows()
        served = observation_tensors(history, features, chain)
        trained = ds.get_batch([t])  # episode 0, window anchored at step t
        for key in features:
            assert served[key].dtype == trained[key].dtype == torch.float32
            assert torch.equal(served[key], trained[key]), (key, t)
    image = trained[kit.IMAGE][0, -1]  # (3, H, W): raw / 255, then (x - mean) / std of the store's frames
    stats = compute_stats(EpisodeStore(store_path, "r"))[kit.IMAGE]
    expected = (raw[kit.IMAGE][4].transpose(2, 0, 1) / np.float32(255.0) - stats["mean"]) / stats["std"]
    np.testing.assert_allclose(image.numpy(), expected, rtol=1e-5, atol=1e-5)


def test_the_chain_round_trips_through_a_checkpoint(kit, store_path, tmp_path):
    normalizer = _normalizer(store_path, kit)
    cfg, model, spec = _policy(kit, normalizer)
    chain = processors_for(cfg, kit.FEATURES, normalizer)
    path = save_checkpoint(tmp_path / "ckpt", model=model, spec=spec, processors=chain)
    saved = json.loads((path / PROCESSORS_FILE).read_text())
    assert saved == chain.to_dict() and saved["format"] == "policylink.processors/1"
    loaded = load_checkpoint(path, device="cpu").processors
    assert loaded == chain and loaded.steps == chain.steps
    assert loaded.normalizer.state_dict().keys() == normalizer.state_dict().keys()
    for k, v in normalizer.state_dict().items():
        np.testing.assert_array_equal(loaded.normalizer.state_dict()[k], v)
    (path / PROCESSORS_FILE).unlink()  # a checkpoint written before the chain was saved: derived from its config
    assert load_checkpoint(path, device="cpu").processors == chain
    saved["steps"][-1]["ratio"] = 0.5  # a chain that does not fit the model's config is refused by name
    (path / PROCESSORS_FILE).write_text(json.dumps(saved))
    with pytest.raises(CheckpointError, match="step 'crop'"):
        load_checkpoint(path, device="cpu")


def test_a_language_policy_records_its_tokenizer(kit, store_path):
    from policylink.policies.registry import make_config

    cfg = make_config("vla", observation_keys=[kit.STATE])
    steps = processors_for(cfg, kit.FEATURES, _normalizer(store_path, kit)).steps
    tokenize = [s for s in steps if s["step"] == "tokenize"]
    assert tokenize == [{"step": "tokenize", "key": TASK_KEY, "encoder": cfg.language.encoder,
                         "max_tokens": cfg.language.max_tokens, "runs_in": "model"}]  # fmt: skip


def test_the_deprecated_normalizer_alias_warns_and_gives_the_same_policy_and_checkpoint(kit, store_path, tmp_path):
    from policylink.policies.policy import ChunkPolicy, policy_for_model
    from policylink.policies.registry import make_policy

    normalizer = _normalizer(store_path, kit)
    cfg, model, spec = _policy(kit, normalizer)
    chain = processors_for(cfg, kit.FEATURES, normalizer)
    new = policy_for_model(model, chain, spec, seed=2)
    with pytest.warns(DeprecationWarning, match=r"policy_for_model\(normalizer=...\) is deprecated"):
        old = policy_for_model(model, normalizer, spec, seed=2)  # the old positional argument
    with pytest.warns(DeprecationWarning, match=r"ChunkPolicy\(normalizer=...\) is deprecated"):
        keyword = ChunkPolicy(model, None, spec, normalizer=normalizer, seed=2)
    with pytest.warns(DeprecationWarning, match=r"make_policy\(normalizer=...\) is deprecated"):
        made = make_policy("flow", spec=spec, normalizer=normalizer, config=cfg, device="cpu")
    assert old.processors == keyword.processors == made.processors == chain
    obs = {kit.STATE: np.random.default_rng(1).normal(size=(2, 3, 3)).astype(np.float32),
           kit.IMAGE: np.random.default_rng(2).integers(0, 256, (2, 3, 24, 24, 3), dtype=np.uint8)}  # fmt: skip
    np.testing.assert_array_equal(old.sample(obs), new.sample(obs))
    np.testing.assert_array_equal(keyword.sample(obs), policy_for_model(model, chain, spec, seed=2).sample(obs))
    a = save_checkpoint(tmp_path / "a", model=model, spec=spec, processors=chain)
    with pytest.warns(DeprecationWarning, match=r"save_checkpoint\(normalizer=...\) is deprecated"):
        b = save_checkpoint(tmp_path / "b", model=model, spec=spec, normalizer=normalizer)
    for name in ("processors.json", "normalizer.safetensors", "model.safetensors", "policy_spec.json"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    with pytest.raises(ValueError, match="received both, give processors"):
        policy_for_model(model, chain, spec, normalizer=normalizer)
    with pytest.raises(TypeError, match="save_checkpoint: processors: expected a Processors chain.*received NoneType"):
        save_checkpoint(tmp_path / "c", model=model, spec=spec)
    with pytest.raises(ValueError, match="expected a checkpoint, or both spec and processors"):
        make_policy("flow", spec=spec, config=cfg)


def test_actions_go_back_to_units_through_the_chains_normalize_step(kit, store_path):
    from policylink.policies.processing import actions_to_normalized, actions_to_units

    normalizer = _normalizer(store_path, kit)
    cfg, _, _ = _policy(kit, normalizer)
    chain = processors_for(cfg, kit.FEATURES, normalizer)
    stats = compute_stats(EpisodeStore(store_path, "r"))["action"]
    low, high = np.asarray(stats["min"], np.float32), np.asarray(stats["max"], np.float32)
    ends = torch.tensor([[[-1.0, -1.0], [1.0, 1.0]]])  # min_max: -1 -> min, 1 -> max
    np.testing.assert_allclose(actions_to_units(ends, chain)[0], np.stack([low, high]), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(actions_to_normalized(np.stack([low, high]), chain), ends[0])
    bare = processors_for(cfg, kit.FEATURES, None)  # no normalize step: actions pass through as they are
    np.testing.assert_array_equal(actions_to_units(ends, bare), ends.numpy())
