"""Advantage-conditioned fine-tuning: label dropout rate, classifier-free guidance (w = 0 / 1 exact, w = 1.5 known),
AWR weights, the value model, and a conditioned checkpoint trained, served over ZMQ and evaluated with its
default w (issue 15)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from policylink.adapters.capabilities import ConditioningSpec
from policylink.adapters.registry import make_env
from policylink.data.buffer import EpisodeStore
from policylink.data.episode_meta import EpisodeMeta
from policylink.data.labels import LabelsError, read_labels
from policylink.policies.common.conditioning import NULL_LABEL, classifier_free_guidance, drop_labels
from policylink.policies.common.unet1d import UNetConfig
from policylink.policies.config import check_cfg_scale
from policylink.policies.finetune.advantage import ValueConfig, awr_weights, two_hot
from policylink.policies.processing import processors_for
from policylink.policies.registry import make_config, make_policy
from policylink.train.value import fit_value_model

STATE = "observation.state"


def test_label_dropout_rate_within_one_point_over_10000():
    g = torch.Generator().manual_seed(0)
    for p in (0.1, 0.3):
        dropped = drop_labels(torch.ones(10_000, dtype=torch.long), p, g)
        assert abs(float((dropped == NULL_LABEL).float().mean()) - p) < 0.01
        assert set(dropped.unique().tolist()) == {NULL_LABEL, 1}


class _ZeroUncond:
    """A sampler stand-in whose unconditional prediction is 0 everywhere."""

    def denoise(self, x_t, t, cond):
        return torch.zeros_like(x_t)


def test_cfg_weights_known_values():
    x, t, out = torch.zeros(1, 4, 2), torch.zeros(1), torch.ones(1, 4, 2)  # v_c = 1, v_u = 0
    uncond, zero = torch.zeros(1, 8), _ZeroUncond()

    def guided(w):
        return classifier_free_guidance(uncond, w)(x, t, out, None, zero)

    assert torch.equal(
        classifier_free_guidance(uncond, 1.5)(x, t, out, None, _ZeroUncond()), torch.full((1, 4, 2), 1.5)
    )
    assert torch.equal(guided(0.0), torch.zeros(1, 4, 2))
    assert guided(1.0) is out
    assert torch.equal(
        classifier_free_guidance(uncond, 3.0)(x, t, out, None, _ZeroUncond()), torch.full((1, 4, 2), 3.0)
    )


def _policy(kind: str, **cfg):
    from policylink.adapters.schema import ActionSpec, FeatureSpec, PolicySpec
    from policylink.data.normalize import Normalizer

    config = make_config(kind, chunk_size=8, n_action_steps=4, unet=UNetConfig(down_dims=[16, 32], time_embed_dim=16),
                         conditioning=ConditioningSpec(num_labels=2), **cfg)  # fmt: skip
    action = ActionSpec(names=("x", "y"), control_mode="ee_delta", units=("m", "m"), low=(-1, -1), high=(1, 1))
    spec = PolicySpec({STATE: FeatureSpec("float32", (3,))}, action, n_obs_steps=2, chunk_size=8, n_action_steps=4,
                      control_frequency=10.0)  # fmt: skip
    stats = {STATE: {"min": np.zeros(3), "max": np.ones(3)}, "action": {"min": -np.ones(2), "max": np.ones(2)}}
    norm = Normalizer(stats, {STATE: "min_max", "action": "min_max"})
    policy = make_policy(
        kind, spec=spec, processors=processors_for(config, spec.observation_features, norm), config=config, device="cpu"
    )
    with torch.no_grad():  # a "trained" label embedding (the slot starts at zero, where CFG changes nothing)
        torch.manual_seed(0)
        policy.model.extra_conditioning.labels.weight.normal_(0, 1.0)
    return policy


@pytest.mark.parametrize("kind", ["flow", "diffusion"])
def test_cfg_in_the_policy_w0_is_unconditional_w1_conditional_exactly(kind):
    obs = {STATE: np.random.default_rng(0).uniform(0, 1, (3, 2, 3)).astype(np.float32)}
    noise = torch.randn(3, 8, 2, generator=torch.Generator().manual_seed(1))
    policy = _policy(kind)
    uncond = policy.sample(obs, noise=noise)  # default_label -1: null
    cond = policy.sample(obs, noise=noise, labels=[1, 1, 1])
    assert not np.array_equal(uncond, cond)
    policy.config.default_label = 1
    np.testing.assert_array_equal(policy.sample(obs, noise=noise), cond)  # default label, w = 1
    policy.set_cfg_scale(0.0)
    np.testing.assert_array_equal(policy.sample(obs, noise=noise), uncond)
    policy.set_cfg_scale(2.0)
    guided = policy.sample(obs, noise=noise)
    assert np.isfinite(guided).all() and not np.array_equal(guided, cond)


def test_awr_weights_finite_and_known():
    w = awr_weights(torch.tensor([1e4, np.log(2.0), 0.0, -1e4]), beta=1.0, max_weight=20.0)
    assert torch.isfinite(w).all()
    torch.testing.assert_close(w, torch.tensor([20.0, 2.0, 1.0, 0.0]))
    with pytest.raises(ValueError, match="beta"):
        awr_weights(torch.zeros(1), beta=0.0, max_weight=20.0)


def test_two_hot_and_value_model_fit():
    torch.testing.assert_close(two_hot(torch.tensor([-0.25, -1.0, 0.5]), -1.0, 0.0, 3),
                               torch.tensor([[0.0, 0.5, 0.5], [1.0, 0.0, 0.0], [0.0, 0.0, 1.0]]))  # fmt: skip
    z = np.random.default_rng(0).uniform(0, 1, (512, 4)).astype(np.float32)
    returns = -z[:, 0]
    for kind in ("mse", "bins"):
        model = fit_value_model(z, returns, ValueConfig(kind=kind, steps=400, hidden=32, folds=1), seed=0)
        with torch.no_grad():
            err = np.abs(model.predict(torch.as_tensor(z)).numpy() - returns).mean()
        assert err < 0.05, (kind, err)


@pytest.fixture(scope="module")
def reach_store(tmp_path_factory):
    """6 synthetic `reach` episodes: 3 that approach the target (success), 3 that drift (failure)."""
    rng = np.random.default_rng(0)
    path = tmp_path_factory.mktemp("adv") / "reach.zarr"
    spec = make_env("reach", obs_mode="state").env_spec
    with EpisodeStore(path, "w") as store:
        for i in range(6):
            n, good = 14, i % 2 == 0
            target = rng.uniform(-0.1, 0.1, 3)
            ee = np.linspace(target + 0.2, target if good else target + 0.3, n)
            state = np.concatenate([ee, np.tile(target, (n, 1))], 1).astype(np.float32)
            action = np.clip(np.diff(ee, axis=0, append=ee[-1:]) * 5, -1, 1).astype(np.float32)
            store.add_episode({STATE: state, "action": action}, EpisodeMeta(success=good, source="expert"))
        store.update_info(env="reach", features={k: f.to_dict() for k, f in spec.observation_features.items()
                                                 if k == STATE}, action=spec.action.to_dict())  # fmt: skip
    return path


def test_label_train_serve_and_evaluate_a_conditioned_checkpoint(reach_store, tmp_path, served):
    from policylink.evaluate.advantage_report import AdvantageReportConfig, advantage_report
    from policylink.evaluate.nxm import evaluate
    from policylink.policies import load_policy
    from policylink.train.advantage import AdvantageTrainConfig, LabelCommand, label_store, train_advantage
    from policylink.train.config import DatasetConfig

    with pytest.raises(LabelsError, match="not in the store"):
        read_labels(reach_store)
    attrs = label_store(LabelCommand(dataset=str(reach_store), source="progress", env="reach", horizon=4,
                                     failure_window=3))  # fmt: skip
    labels = read_labels(reach_store)
    assert labels.label.shape == (84,) and attrs["positive"] == pytest.approx(labels.label.mean())
    assert labels.label[13 + 14 - 3 + 1 : 28].sum() == 0  # failed episode 1: its last 3 steps are negative
    report = advantage_report(AdvantageReportConfig(path=str(reach_store), out=str(tmp_path / "rep")))
    assert (tmp_path / "rep" / "advantage_hist.png").exists() and report["by_source"]["expert"][0] == 84

    policy = make_config("flow", chunk_size=8, n_action_steps=4, unet=UNetConfig(down_dims=[16, 32], time_embed_dim=16),
                         cfg_scale=1.5)  # fmt: skip
    cfg = AdvantageTrainConfig(policy=policy, dataset=DatasetConfig(path=str(reach_store), env="reach", val_fraction=0),
                               output_dir=str(tmp_path / "run"), steps=6, batch_size=8, warmup_steps=1, log_every=1,
                               device="cpu", progress=False, torch_threads=1)  # fmt: skip
    ckpt = train_advantage(cfg)
    import csv

    rows = list(csv.DictReader((tmp_path / "run" / "metrics.csv").open()))
    assert all(np.isfinite(float(r["loss"])) for r in rows) and "dropped_fraction" in rows[0]
    # RECAP labels from a value model on this checkpoint's frozen latents (cross-fitted over 2 episode folds)
    value = ValueConfig(steps=30, hidden=16, batch_size=32)
    cmd = LabelCommand(dataset=str(reach_store), checkpoint=str(ckpt), name="value", n_step=3, value=value)
    attrs = label_store(cmd)
    value_labels = read_labels(reach_store, "value").label
    assert attrs["source"] == "value" and attrs["max_episode_steps"] == 14 and 0.0 < attrs["positive"] <= 0.3
    assert value_labels.shape == (84,) and value_labels[14 + 4 : 28].sum() == 0  # failure window: last 10 steps
    local = load_policy(ckpt, device="cpu")
    assert (local.config.conditioning.num_labels, local.config.default_label, local.config.cfg_scale) == (2, 1, 1.5)
    with pytest.raises(ValueError, match=r"expected values in \[-1, 2\)"):
        local.set_conditioning(labels=[2])  # a label the checkpoint was not trained with
    for bad in ([1.5], ["pos"]):
        with pytest.raises(ValueError, match=r"conditioning.labels: expected integers in \[-1, 2\)"):
            local.set_conditioning(labels=bad)

    remote = served(load_policy(ckpt, device="cpu"))
    obs = {STATE: np.random.default_rng(0).uniform(-0.2, 0.2, (2, 6)).astype(np.float32)}
    local.update_observation(obs)
    remote.update_observation(obs)
    np.testing.assert_array_equal(remote.predict_action_chunk(), local.predict_action_chunk())
    summary = evaluate([("adv", str(ckpt))], ["reach"], episodes=2, workers=0, out=tmp_path / "eval", videos=0,
                       progress=False, write_report=False, env_kwargs={"obs_mode": "state"})  # fmt: skip
    assert len(summary) == 1 and summary[0]["n_episodes"] == 2  # eval loads it with its default label and w
    # --cfg_scale (eval, run, serve) replaces the checkpoint's w: the same chunk as setting it in the config
    override = load_policy(ckpt, device="cpu", cfg_scale=0.0)
    local.set_cfg_scale(0.0)
    for p in (override, local):
        p.reset()
        p.reseed(7)
        p.update_observation(obs)
    assert override.cfg_scale == 0.0 and override.config.cfg_scale == 1.5  # an inference option, not the config
    np.testing.assert_array_equal(override.predict_action_chunk(), local.predict_action_chunk())
    resaved = override.save(tmp_path / "resaved")  # --cfg_scale at evaluation never reaches a saved checkpoint
    assert load_policy(resaved, device="cpu").config.cfg_scale == 1.5
    for bad, msg in (
        (-1.0, "expected a finite weight >= 0"),
        (float("nan"), "expected a finite weight >= 0"),
        ("x", "expected a number"),
    ):
        with pytest.raises(ValueError, match=f"cfg_scale: {msg}"):
            load_policy(ckpt, device="cpu", cfg_scale=bad)
    summary = evaluate([("adv", str(ckpt))], ["reach"], episodes=2, workers=0, out=tmp_path / "eval", videos=0,
                       progress=False, write_report=False, env_kwargs={"obs_mode": "state"}, cfg_scale=0.0,
                       on_mismatch="redo")  # fmt: skip
    saved = json.loads(next((tmp_path / "eval").rglob("000000.json")).read_text())
    assert summary[0]["n_episodes"] == 2 and saved["settings"]["cfg_scale"] == 0.0

    cfg.loss, cfg.output_dir = "awr", str(tmp_path / "awr")  # the AWR baseline on the same labels
    cfg.policy = make_config(
        "flow", chunk_size=8, n_action_steps=4, unet=UNetConfig(down_dims=[16, 32], time_embed_dim=16)
    )
    train_advantage(cfg)
    rows = list(csv.DictReader((tmp_path / "awr" / "metrics.csv").open()))
    assert all(np.isfinite(float(r["loss"])) and float(r["mean_weight"]) > 0 for r in rows if r["loss"])


def test_cfg_scale_needs_a_label_slot(tmp_path):
    with pytest.raises(ValueError, match="policy.cfg_scale: expected 1.0 for a policy without a label slot"):
        make_config("flow", cfg_scale=2.0).validate()
    with pytest.raises(ValueError, match=r"policy.cfg_scale: expected a finite weight >= 0 .*received nan"):
        make_config("flow", conditioning=ConditioningSpec(num_labels=2), cfg_scale=float("nan")).validate()
    with pytest.raises(ValueError, match="cfg_scale: expected 1.0 for a policy without a label slot"):
        check_cfg_scale(2.0, num_labels=0)
    assert check_cfg_scale("1.5", num_labels=2) == 1.5
    from policylink.policies import load_policy

    with pytest.raises(ValueError, match="cfg_scale: applies to a checkpoint folder loaded here"):
        load_policy("tcp://127.0.0.1:1", cfg_scale=2.0)
    with pytest.raises(ValueError, match="policy.default_label"):
        make_config("flow", conditioning=ConditioningSpec(num_labels=2), default_label=2).validate()


def test_label_command_refuses_settings_it_would_ignore_or_misapply(reach_store, tmp_path):
    from types import SimpleNamespace

    from policylink.adapters.schema import FeatureSpec
    from policylink.evaluate.advantage_report import AdvantageReportConfig, advantage_report
    from policylink.train.advantage import LabelCommand, _check_checkpoint_fits, label_store

    cases = [
        ({"dataset": str(tmp_path / "none.zarr")}, r"dataset: expected an episode store path .* \(no such path\)"),
        ({"source": "progress", "env": "push"}, "env: the store .* was recorded on 'reach', received env='push'"),
        ({"source": "progress", "checkpoint": "x"}, "checkpoint: used by source=value only"),
        ({"n_step": 0}, "n_step: expected >= 1 steps, received 0"),
        ({"source": "progress", "positive_qualities": ["bogus"]}, r"positive_qualities: no episode .* \['bogus'\]"),
    ]
    for kwargs, message in cases:
        with pytest.raises(ValueError, match=message):
            label_store(LabelCommand(**{"dataset": str(reach_store), **kwargs}))
    model = SimpleNamespace(features={"observation.state": FeatureSpec("float32", (3,))})
    cmd = LabelCommand(dataset=str(reach_store))
    with pytest.raises(ValueError, match=r"checkpoint: its policy reads 'observation.state' of shape \(3,\).*\(6,\)"):
        _check_checkpoint_fits(cmd, model, EpisodeStore(reach_store, "r"))
    with pytest.raises(ValueError, match="worst: expected >= 0 episodes, received -1"):
        advantage_report(AdvantageReportConfig(path=str(reach_store), worst=-1))
