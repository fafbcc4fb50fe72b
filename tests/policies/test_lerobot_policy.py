"""LeRobot policies behind our contract: tiny diffusion / ACT checkpoints built offline (no pretrained backbone),
saved with their processors, loaded by path through our adapter and compared with LeRobot's own ``select_action``
/ ``predict_action_chunk`` on the same input; the ``lerobot:PATH`` reference in ``policylink eval``."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from policylink.adapters.schema import ActionSpec

pytestmark = pytest.mark.lerobot

STATE, CAM, ACTION = "observation.state", "observation.images.front", "action"
ACTION_SPEC = ActionSpec(("dx", "dy", "dz"), "ee_delta", ("m", "m", "m"), (-0.02,) * 3, (0.02,) * 3)
IMG = 32


@pytest.fixture(scope="module")
def torch_mod():
    pytest.importorskip("lerobot")
    import torch

    from policylink.policies.lerobot.loading import import_lerobot_policies

    torch.set_num_threads(1)
    import_lerobot_policies()
    return torch


def _stats(torch, state_dim: int, action_dim: int) -> dict:
    vec = lambda lo, hi, n: {  # noqa: E731
        "mean": torch.full((n,), (lo + hi) / 2), "std": torch.full((n,), (hi - lo) / 4),
        "min": torch.full((n,), lo), "max": torch.full((n,), hi),
    }  # fmt: skip
    img = {s: torch.full((3, 1, 1), v) for s, v in (("mean", 0.4), ("std", 0.2), ("min", 0.0), ("max", 1.0))}
    return {STATE: vec(-1.0, 1.0, state_dim), CAM: img, ACTION: vec(-0.02, 0.02, action_dim)}


def save_lerobot_checkpoint(torch, kind: str, path: Path, *, rename: dict | None = None, post_steps=(), **fields):
    """Build a tiny untrained LeRobot ``kind`` policy (state (6,), camera ``front`` (3, 32, 32), action (3,)), save
    it and its processors like ``lerobot-train`` does, plus our ``policylink.json``. Returns the folder."""
    from lerobot.configs.types import FeatureType, PolicyFeature
    from lerobot.policies.factory import get_policy_class, make_policy_config, make_pre_post_processors

    from policylink.policies.lerobot import write_policylink_spec

    policy_cam = (rename or {}).get(CAM, CAM)
    inputs = {
        STATE: PolicyFeature(FeatureType.STATE, (6,)),
        policy_cam: PolicyFeature(FeatureType.VISUAL, (3, IMG, IMG)),
    }
    cfg = make_policy_config(
        kind, input_features=inputs, output_features={ACTION: PolicyFeature(FeatureType.ACTION, (3,))},
        pretrained_backbone_weights=None, device="cpu", **fields,
    )  # fmt: skip
    torch.manual_seed(0)
    policy = get_policy_class(kind)(cfg)
    stats = _stats(torch, 6, 3)
    stats[policy_cam] = stats.pop(CAM)
    pre, post = make_pre_post_processors(cfg, dataset_stats=stats)
    if rename:
        pre.steps[0].rename_map = dict(rename)
    post.steps[:0] = list(post_steps)
    policy.save_pretrained(path)
    pre.save_pretrained(path)
    post.save_pretrained(path)
    doc = json.loads((path / "config.json").read_text())  # draccus>=0.11 drops the choice type on save
    (path / "config.json").write_text(json.dumps({"type": kind, **doc}))
    write_policylink_spec(path, ACTION_SPEC, 10.0, "state+image", IMG)
    return path


DIFFUSION = dict(
    n_obs_steps=2, horizon=8, n_action_steps=4, down_dims=(16, 32), n_groups=4, diffusion_step_embed_dim=16,
    spatial_softmax_num_keypoints=4, crop_shape=None, num_inference_steps=3, drop_n_last_frames=3,
)  # fmt: skip
ACT = dict(chunk_size=4, n_action_steps=4, dim_model=32, n_heads=2, dim_feedforward=64, n_encoder_layers=1,
           n_vae_encoder_layers=1, latent_dim=8)  # fmt: skip


@dataclass
class Saved:
    path: Path
    reference: tuple  # LeRobot's own (policy, preprocessor, postprocessor) loaded from the folder


def _lerobot_load(path: Path):
    from lerobot.configs.policies import PreTrainedConfig
    from lerobot.policies.factory import get_policy_class, make_pre_post_processors

    cfg = PreTrainedConfig.from_pretrained(str(path))
    policy = get_policy_class(cfg.type).from_pretrained(str(path), config=cfg).eval()
    return (policy, *make_pre_post_processors(cfg, pretrained_path=str(path)))


@pytest.fixture(scope="module")
def diffusion(torch_mod, tmp_path_factory) -> Saved:
    # trained on a camera named "top": the saved rename step maps our "front" to it
    path = save_lerobot_checkpoint(
        torch_mod, "diffusion", tmp_path_factory.mktemp("dp") / "pretrained_model",
        rename={CAM: "observation.images.top"}, **DIFFUSION,
    )  # fmt: skip
    return Saved(path, _lerobot_load(path))


def _obs(seed: int, b: int = 2) -> dict:
    rng = np.random.default_rng(seed)
    return {
        STATE: rng.uniform(-1, 1, (b, 6)).astype(np.float32),
        CAM: rng.integers(0, 256, (b, IMG, IMG, 3), dtype=np.uint8),
        "task": ["reach"] * b,
    }


def _as_lerobot(torch, obs: dict) -> dict:
    """What a LeRobot user feeds the preprocessor: CHW float cameras in [0, 1]."""
    return {STATE: torch.from_numpy(obs[STATE]), CAM: torch.from_numpy(obs[CAM]).permute(0, 3, 1, 2).float() / 255}


def _select_chunk(torch, ref, obs: dict, n: int, seed: int | None = None) -> np.ndarray:
    """LeRobot's own loop: ``n`` calls of ``select_action`` (the first generates the chunk, under torch seed
    ``seed``), each action through the postprocessor, stacked to ``(B, n, A)``."""
    policy, pre, post = ref
    if seed is not None:
        torch.manual_seed(seed)
    out = [post(policy.select_action(pre(_as_lerobot(torch, obs)))).numpy() for _ in range(n)]
    return np.stack(out, axis=1)


def test_diffusion_matches_lerobot_select_action_with_warm_up(torch_mod, diffusion):
    from policylink.policies.lerobot import make_lerobot_policy

    torch = torch_mod
    ours = make_lerobot_policy(diffusion.path, device="cpu", seed=3)
    spec = ours.spec
    assert (spec.n_obs_steps, spec.chunk_size, spec.n_action_steps) == (2, 4, 4)
    assert spec.observation_features[CAM].shape == (IMG, IMG, 3) and spec.observation_features[CAM].dtype == "uint8"
    assert spec.action == ACTION_SPEC and spec.control_frequency == 10.0
    gen = torch.Generator().manual_seed(3)  # the adapter's stream of per-chunk torch seeds
    seeds = [int(torch.randint(0, 2**62, (1,), generator=gen)) for _ in range(2)]
    policy = diffusion.reference[0]
    policy.reset()
    o1, o2 = _obs(1), _obs(2)
    ours.update_observation(o1)  # one frame, n_obs_steps = 2: padded like LeRobot's warm-up
    got1 = ours.predict_action_chunk()
    want1 = _select_chunk(torch, diffusion.reference, o1, 4, seeds[0])
    np.testing.assert_allclose(got1, want1, rtol=0, atol=1e-6)
    ours.update_observation(o2)  # window [o1, o2]; LeRobot's queue after select_action(o2) holds the same
    got2 = ours.predict_action_chunk()
    want2 = _select_chunk(torch, diffusion.reference, o2, 4, seeds[1])
    np.testing.assert_allclose(got2, want2, rtol=0, atol=1e-6)
    assert got1.shape == (2, 4, 3) and not np.allclose(got1, got2)


def test_act_matches_lerobot_predict_action_chunk(torch_mod, tmp_path):
    from policylink.policies.lerobot import make_lerobot_policy

    torch = torch_mod
    path = save_lerobot_checkpoint(torch, "act", tmp_path / "act", **ACT)
    ours = make_lerobot_policy(f"lerobot:{path}", device="cpu")
    policy, pre, post = ref = _lerobot_load(path)
    obs = _obs(5, b=3)
    ours.update_observation(obs)
    got = ours.predict_action_chunk()
    with torch.no_grad():
        want = post(policy.predict_action_chunk(pre(_as_lerobot(torch, obs)))).numpy()
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
    policy.reset()
    np.testing.assert_allclose(got, _select_chunk(torch, ref, obs, 4), rtol=0, atol=1e-6)
    np.testing.assert_allclose(ours.predict_action_chunk(env_ids=[2]), got[2:], rtol=0, atol=1e-6)


def test_whole_chunk_goes_through_the_postprocessor(torch_mod, tmp_path):
    """A relative-action decoder (cumulative sum over the chunk, registered like any LeRobot step) decodes only
    when the postprocessor sees the whole chunk at once."""
    from lerobot.processor import ActionProcessorStep, ProcessorStepRegistry

    from policylink.policies.lerobot import make_lerobot_policy

    torch = torch_mod
    if "test_cumsum_delta_actions" not in ProcessorStepRegistry.list():

        @ProcessorStepRegistry.register("test_cumsum_delta_actions")
        class CumsumDeltas(ActionProcessorStep):
            def action(self, action):
                return action.cumsum(dim=-2)

            def transform_features(self, features):
                return features

    step = ProcessorStepRegistry.get("test_cumsum_delta_actions")()
    path = save_lerobot_checkpoint(torch, "act", tmp_path / "act", post_steps=[step], **ACT)
    ours = make_lerobot_policy(path, device="cpu")
    policy, pre, post = _lerobot_load(path)
    obs = _obs(7)
    ours.update_observation(obs)
    with torch.no_grad():
        raw = policy.predict_action_chunk(pre(_as_lerobot(torch, obs)))
    mean, std = torch.zeros(3), torch.full((3,), 0.01)  # ACT's action stats: MEAN_STD of _stats
    np.testing.assert_allclose(ours.predict_action_chunk(), (raw * std + mean).cumsum(1).numpy(), rtol=0, atol=1e-6)


def test_missing_files_and_fields_are_named(torch_mod, diffusion, tmp_path):
    import shutil

    from policylink.policies.lerobot import LeRobotCheckpointError, make_lerobot_policy

    copy = shutil.copytree(diffusion.path, tmp_path / "copy")
    (copy / "policylink.json").unlink()
    with pytest.raises(LeRobotCheckpointError, match=r"policylink.json: expected \['action', 'control_frequency'\]"):
        make_lerobot_policy(copy)
    doc = json.loads((copy / "config.json").read_text())
    doc.pop("type")
    (copy / "config.json").write_text(json.dumps(doc))
    with pytest.raises(LeRobotCheckpointError, match="expected a 'type' field"):
        make_lerobot_policy(copy)
    (copy / "policy_postprocessor.json").unlink()
    with pytest.raises(LeRobotCheckpointError, match=r"missing \['policy_postprocessor.json'\]"):
        make_lerobot_policy(copy)


def test_eval_runs_a_lerobot_checkpoint_by_reference(torch_mod, diffusion, tmp_path, capsys):
    """``policylink eval --policies dp=lerobot:PATH`` on ``reach`` (2 episodes; success is irrelevant, untrained)."""
    from policylink.cli import eval as eval_cli
    from policylink.evaluate.refs import reference_label
    from policylink.policies.loading import kind_ref

    ref = f"lerobot:{diffusion.path}"
    assert kind_ref(ref) == ("lerobot", str(diffusion.path)) and kind_ref("tcp://h:1") is None
    assert reference_label("lerobot:/o/run7/checkpoints/last/pretrained_model") == "run7"
    args = ["--policies", f"dp={ref}", "--envs", "reach", "--episodes", "2", "--workers", "0", "--videos", "0"]
    assert eval_cli.main([*args, "--out", str(tmp_path / "eval")]) == 0  # obs_mode and image size from policylink.json
    info = json.loads((tmp_path / "eval" / "cells" / "dp__reach" / "eval_info.json").read_text())
    assert len(info["per_episode"]) == 2
    out = capsys.readouterr()
    assert "| dp |" in out.out
    assert "env_kwargs from the checkpoints: {'obs_mode': 'state+image', 'image_size': 32}" in out.err


def _pi0_stub(torch, target_of_prefix, k: int):
    """The parts of a LeRobot ``PI0Pytorch`` that ``sample_actions`` touches, with a known velocity: pi0's exact
    conditional velocity toward ``a* = prefix + state`` (``v_pi = (x - a*) / tau``), so Euler lands on ``a*``."""
    from types import SimpleNamespace

    lm_config = SimpleNamespace(_attn_implementation="sdpa")
    vlm = SimpleNamespace(
        paligemma=SimpleNamespace(language_model=SimpleNamespace(config=lm_config)),
        forward=lambda inputs_embeds, **kw: (None, target_of_prefix(inputs_embeds[0])),
    )

    def embed_prefix(images, img_masks, lang_tokens, lang_masks):
        b, length = images.shape[0], images.shape[1]
        return images, torch.ones(b, length, dtype=torch.bool), torch.zeros(b, length, dtype=torch.bool)

    def denoise_step(state, prefix_pad_masks, past_key_values, x_t, timestep):
        return (x_t - (past_key_values + state[:, None, :])) / timestep[:, None, None]

    return SimpleNamespace(
        config=SimpleNamespace(num_inference_steps=k, chunk_size=5, max_action_dim=3),
        embed_prefix=embed_prefix, denoise_step=denoise_step, paligemma_with_expert=vlm,
        _prepare_attention_masks_4d=lambda m: m, _rtc_enabled=lambda: False, rtc_processor=None,
    )  # fmt: skip


def test_pi0_time_convention_is_converted_with_known_values(torch_mod):
    from lerobot.policies.pi0.modeling_pi0 import PI0Pytorch

    from policylink.adapters.capabilities import Guidance
    from policylink.policies.lerobot.flow_time import pi0_network, pi0_sampler, pi0_time

    torch = torch_mod
    a = torch.tensor([[[0.5, -1.0, 2.0]]])
    net = pi0_network(lambda x, tau, cond: (x - a) / tau[:, None, None])  # pi0: tau = 1 noise, v_pi = eps - a
    x, t = torch.tensor([[[1.0, 1.0, 1.0]]]), torch.tensor([0.25])
    assert pi0_time(t).item() == 0.75
    v = net(x, t, None)  # ours: v = a - eps = -v_pi at tau = 0.75
    torch.testing.assert_close(v, torch.tensor([[[-2 / 3, -8 / 3, 4 / 3]]]))
    torch.testing.assert_close(x + (1 - t) * v, a)  # our clean estimate at t is a itself
    # LeRobot's own loop (PI0Pytorch.sample_actions, tau 1 -> 0) and ours (t 0 -> 1) on the same stub model
    gen = torch.Generator().manual_seed(0)
    prefix, state = torch.randn(2, 5, 3, generator=gen), torch.randn(2, 3, generator=gen)
    noise = torch.randn(2, 5, 3, generator=gen)
    stub = _pi0_stub(torch, lambda embs: embs * 2.0, k=4)
    masks = torch.ones(2, 5, dtype=torch.bool)
    theirs = PI0Pytorch.sample_actions(stub, prefix, masks, None, None, state, noise=noise)
    sampler, cond = pi0_sampler(stub, (prefix, masks, None, None), state=state)
    seen = []
    hook = Guidance(lambda x_t, t, out, c, s: seen.append(round(float(t[0]), 6)) or out)
    ours = sampler.sample(cond, noise, guidance=hook)
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-6)
    torch.testing.assert_close(ours, prefix * 2.0 + state[:, None, :], rtol=0, atol=1e-5)  # a*
    assert seen == [0.0, 0.25, 0.5, 0.75]  # our hooks see t = 0 at noise


@pytest.mark.parametrize("kind", ["pi0", "pi05", "smolvla"])
def test_vla_configs_map_to_our_spec_offline(torch_mod, kind):
    """What is checkable offline for the VLA types: their config maps to a spec with the instruction (``task``),
    HWC uint8 cameras, one observation step and a 50-step chunk. Their processors (tokenizer) and models need
    transformers<5 and downloaded weights."""
    from lerobot.configs.types import FeatureType, PolicyFeature
    from lerobot.policies.factory import make_policy_config

    from policylink.policies.lerobot.loading import lerobot_spec

    inputs = {STATE: PolicyFeature(FeatureType.STATE, (6,)), CAM: PolicyFeature(FeatureType.VISUAL, (3, 224, 224))}
    outputs = {ACTION: PolicyFeature(FeatureType.ACTION, (3,))}
    cfg = make_policy_config(kind, device="cpu", input_features=inputs, output_features=outputs)
    spec = lerobot_spec(cfg, {"action": ACTION_SPEC.to_dict(), "control_frequency": 10.0})
    feats = spec.observation_features
    assert sorted(feats) == [CAM, STATE, "task"] and feats["task"].is_string and spec.requires_task
    assert (feats[CAM].shape, feats[CAM].dtype) == ((224, 224, 3), "uint8")
    assert (spec.n_obs_steps, spec.chunk_size, spec.n_action_steps) == (1, 50, 50)


def test_serve_a_lerobot_checkpoint_by_reference(torch_mod, diffusion):
    """``policylink serve --checkpoint lerobot:PATH``: a remote client gets the same chunk as the local adapter."""
    import socket
    import threading

    from policylink.adapters.transport import RemotePolicy
    from policylink.cli import serve as serve_cli
    from policylink.policies.lerobot import make_lerobot_policy

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    argv = ["--checkpoint", f"lerobot:{diffusion.path}", "--device", "cpu", "--bind", f"tcp://127.0.0.1:{port}"]
    result: dict = {}
    t = threading.Thread(
        target=lambda: result.setdefault("rc", serve_cli.main([*argv, "--duration_s", "5"])), daemon=True
    )
    t.start()
    remote = RemotePolicy(f"tcp://127.0.0.1:{port}", timeout_s=30)
    local = make_lerobot_policy(diffusion.path, device="cpu", seed=0)
    assert remote.spec == local.spec
    obs = _obs(11)
    remote.update_observation(obs)
    local.update_observation(obs)
    np.testing.assert_array_equal(remote.predict_action_chunk(), local.predict_action_chunk())
    remote.close()
    t.join(20)
    assert result["rc"] == 0
