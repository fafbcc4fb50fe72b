"""Training loop: schedule values, loss goes down, resume continues exactly, DDP 2-process parity, batches of the
get_batch path, pluggable losses, and training from a store with no registered env (a LeRobot import)."""

from __future__ import annotations

import csv
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from policylink.adapters.registry import make_env
from policylink.data.buffer import EpisodeStore
from policylink.data.lerobot import export_lerobot, import_lerobot
from policylink.data.normalize import Normalizer
from policylink.data.processors import Processors
from policylink.data.sampler import SequenceDataset
from policylink.data.stats import compute_stats
from policylink.policies.checkpoint import load_training_state
from policylink.policies.common.unet1d import UNetConfig
from policylink.policies.registry import make_config
from policylink.train.data import StoreInfoError
from policylink.train.imitation import DatasetConfig, TrainConfig, cosine_with_warmup, train
from policylink.train.losses import BatchFields, ImitationLoss, register_loss, training_batch
from policylink.train.objectives import unregister_objective

STATE = "observation.state"


@pytest.fixture(scope="module")
def reach_store(tmp_path_factory):
    """4 synthetic episodes (lengths 12..18) with `reach`'s state and action shapes: action = tanh(state)."""
    spec = make_env("reach", obs_mode="state").env_spec
    d, a = spec.observation_features[STATE].shape[0], spec.action.dim
    rng = np.random.default_rng(0)
    path = tmp_path_factory.mktemp("data") / "reach.zarr"
    with EpisodeStore(path, "w") as store:
        for length in (12, 14, 16, 18):
            state = np.cumsum(rng.normal(0, 0.1, (length, d)), 0).astype(np.float32)
            store.add_episode({STATE: state, "action": np.tanh(state[:, :a]).astype(np.float32)})
    return path


def _cfg(store: Path, out: Path, **kw) -> TrainConfig:
    policy = make_config("flow", chunk_size=8, n_action_steps=4, unet=UNetConfig(down_dims=[16, 32], time_embed_dim=16))
    fields = dict(
        policy=policy,
        dataset=DatasetConfig(path=str(store), env="reach", val_fraction=0.25),
        output_dir=str(out),
        steps=12,
        batch_size=8,
        lr=3e-3,
        warmup_steps=2,
        log_every=1,
        val_every=6,
        device="cpu",
        progress=False,
        torch_threads=1,
    )
    return TrainConfig(**{**fields, **kw})


def _losses(out: Path) -> dict[int, float]:
    return {int(r["step"]): float(r["loss"]) for r in csv.DictReader((out / "metrics.csv").open()) if r["loss"]}


def test_cosine_with_warmup_values():
    f = cosine_with_warmup(10, 110)
    assert [f(0), f(4), f(9)] == [0.1, 0.5, 1.0]
    assert f(10) == 1.0 and f(60) == pytest.approx(0.5) and f(110) == pytest.approx(0.0)
    # diffusers' schedule g: the same cosine, a warm-up one step later (g(0) = 0: its first step has LR 0)
    from diffusers.optimization import get_cosine_schedule_with_warmup

    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    g = get_cosine_schedule_with_warmup(opt, 10, 110).lr_lambdas[0]
    assert [g(0), g(5), g(10)] == [0.0, 0.5, 1.0]
    assert [f(s) for s in range(10)] == [g(s + 1) for s in range(10)]
    assert [f(s) for s in range(10, 111)] == [g(s) for s in range(10, 111)]


def test_training_batch_is_bit_identical_to_the_per_item_collate(reach_store):
    """The get_batch path gives exactly the batch of the former ``collate`` (items, torch.stack, chunk slice)."""
    with EpisodeStore(reach_store) as store:
        stats = compute_stats(store, keys=[STATE, "action"])
    norm = Normalizer(stats, {STATE: "mean_std", "action": "min_max"})
    ds = SequenceDataset(
        reach_store, n_obs_steps=2, horizon=9, obs_keys=[STATE], processors=Processors.for_keys([STATE], norm)
    )
    idx = np.random.default_rng([0, 3]).integers(0, len(ds), 16)
    items = [ds[int(i)] for i in idx]
    old = {  # train/imitation.py's collate before the get_batch path
        "obs": torch.stack([it[STATE] for it in items]),
        "action": torch.stack([it["action"] for it in items])[:, 1:],
        "valid": ~torch.stack([it["action_is_pad"] for it in items])[:, 1:],
    }
    new = training_batch(ds, idx, BatchFields(), "cpu")
    assert torch.equal(new["obs"][STATE], old["obs"]) and torch.equal(new["action"], old["action"])
    assert torch.equal(new["valid"], old["valid"]) and new["action"].shape == (16, 8, 3)
    assert not new["valid"].all()  # some windows reach past an episode's end


class _ProbeLoss(ImitationLoss):
    """Imitation plus a metric read from the requested fields: the largest chunk return in the batch."""

    fields = BatchFields(step=("reward",), episode=("source",), transition_gamma=0.5)
    metrics = ("max_return",)

    def __call__(self, model, batch, step):
        b = len(batch["task"])  # 8 in training, the validation windows at validation
        assert batch["reward"].shape == batch["valid"].shape == (b, 8)  # (B, H) aligned with the chunk
        assert batch["source"] == ["expert"] * b and batch["next_obs"][STATE].shape == batch["obs"][STATE].shape
        loss, _ = super().__call__(model, batch, step)
        return loss, {"max_return": float(batch["return"].max())}


def test_a_registered_loss_gets_its_fields_and_logs_its_metrics(reach_store, tmp_path):
    from policylink.data.episode_meta import EpisodeMeta

    path = tmp_path / "rewarded.zarr"
    with EpisodeStore(reach_store) as src, EpisodeStore(path, "w") as dst:
        for i in range(src.n_episodes):
            ep = src.get_episode(i, [STATE, "action"])
            dst.add_episode({**ep, "reward": np.ones(len(ep[STATE]), np.float32)}, EpisodeMeta(source="expert"))
    register_loss("probe", _ProbeLoss, overwrite=True)
    out = tmp_path / "run"
    try:
        train(_cfg(path, out, loss="probe", steps=3, val_every=3))
    finally:
        unregister_objective("probe")  # the registry is global: later tests list the registered objectives
    rows = list(csv.DictReader((out / "metrics.csv").open()))
    # every batch holds a full 8-step chunk of rewards 1: R = sum_k 0.5^k = 2 (1 - 0.5^8) = 1.9921875
    assert [float(r["max_return"]) for r in rows] == [1.9921875] * 3 and rows[-1]["val_loss"]
    with pytest.raises(ValueError, match=r"loss: expected one of \[.*'imitation'.*\], received 'q_magic'"):
        train(_cfg(path, tmp_path / "bad", loss="q_magic"))


@pytest.mark.slow
def test_train_writes_checkpoint_and_metrics(reach_store, tmp_path):
    full = tmp_path / "full"
    ckpt = train(_cfg(reach_store, full))
    assert ckpt == full / "checkpoints" / "last"
    assert sorted(f.name for f in ckpt.iterdir()) == [
        "config.json",
        "model.safetensors",
        "normalizer.safetensors",
        "policy_spec.json",
        "processors.json",
        "training_state.json",
        "training_state.safetensors",
    ]
    losses = _losses(full)
    assert sorted(losses) == list(range(1, 13))
    rows = list(csv.DictReader((full / "metrics.csv").open()))
    assert [r["step"] for r in rows if r["val_loss"]] == ["6", "12"]
    assert np.mean([losses[s] for s in (10, 11, 12)]) < np.mean([losses[s] for s in (1, 2, 3)])


@pytest.mark.slow
def test_resume_continues_from_the_saved_step(reach_store, tmp_path):
    a = tmp_path / "a"
    train(_cfg(reach_store, a, save_every=6))
    assert load_training_state(a / "checkpoints" / "step_000006")["step"] == 6
    b = tmp_path / "b"
    (b / "checkpoints").mkdir(parents=True)
    shutil.copytree(a / "checkpoints" / "step_000006", b / "checkpoints" / "last")
    train(_cfg(reach_store, b, resume=True))
    assert load_training_state(b / "checkpoints" / "last")["step"] == 12
    la, lb = _losses(a), _losses(b)
    assert sorted(lb) == list(range(7, 13))  # it continued at step 7, not from scratch
    np.testing.assert_allclose([lb[s] for s in range(7, 13)], [la[s] for s in range(7, 13)], rtol=1e-6)


@pytest.mark.slow
def test_ddp_two_processes_match_one_process(reach_store, tmp_path):
    one = tmp_path / "one"
    train(_cfg(reach_store, one, steps=6, val_every=0))
    two = tmp_path / "two"
    torchrun = Path(sys.executable).parent / "torchrun"
    cmd = [
        str(torchrun),
        "--standalone",
        "--nproc_per_node=2",
        "-m",
        "policylink.cli.train",
        "--dataset.path",
        str(reach_store),
        "--dataset.env",
        "reach",
        "--dataset.val_fraction",
        "0.25",
        "--policy.type",
        "flow",
        "--policy.chunk_size",
        "8",
        "--policy.n_action_steps",
        "4",
        "--policy.unet.down_dims",
        "[16,32]",
        "--policy.unet.time_embed_dim",
        "16",
        "--output_dir",
        str(two),
        "--steps",
        "6",
        "--batch_size",
        "8",
        "--lr",
        "0.003",
        "--warmup_steps",
        "2",
        "--log_every",
        "1",
        "--device",
        "cpu",
        "--progress",
        "false",
        "--torch_threads",
        "1",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    a, b = _losses(one), _losses(two)
    assert sorted(a) == sorted(b) == list(range(1, 7))
    np.testing.assert_allclose([b[s] for s in sorted(b)], [a[s] for s in sorted(a)], rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"batch_size": 0}, "batch_size: expected an integer >= 1, received 0"),
        ({"steps": -5}, "steps: expected an integer >= 1, received -5"),
        ({"lr": 0.0}, "lr: expected > 0, received 0.0"),
        ({"log_every": -1}, "log_every: expected an integer >= 0, received -1"),
        ({"device": "tpu"}, "device: expected 'auto', 'cpu' or 'cuda[:N]', received 'tpu'"),
        ({"betas": [0.9]}, "betas: expected two values in [0, 1), received [0.9]"),
    ],
)
def test_bad_fields_are_rejected_before_any_work(reach_store, tmp_path, override, message):
    with pytest.raises(ValueError) as e:
        train(_cfg(reach_store, tmp_path / "run", **override))
    assert str(e.value) == message
    assert not (tmp_path / "run").exists()


def test_missing_store_and_bad_obs_mode_are_named(reach_store, tmp_path):
    cfg = _cfg(reach_store, tmp_path / "run")
    cfg.dataset.path = str(tmp_path / "nope.zarr")
    with pytest.raises(FileNotFoundError, match="dataset.path: expected an episode store"):
        train(cfg)
    cfg = _cfg(reach_store, tmp_path / "run")
    cfg.dataset.obs_mode = "pixels"
    with pytest.raises(ValueError, match="dataset.obs_mode: expected one of .*received 'pixels'"):
        train(cfg)


def test_store_from_another_env_or_obs_mode_is_rejected(reach_store, tmp_path):
    store_path = tmp_path / "tagged.zarr"
    shutil.copytree(reach_store, store_path)
    with EpisodeStore(store_path, "a") as store:
        store.update_info(env="push")
    with pytest.raises(ValueError) as e:
        train(_cfg(store_path, tmp_path / "run"))
    assert "dataset.env: the store" in str(e.value) and "recorded on env 'push', received dataset.env='reach'" in str(
        e.value
    )
    spec = make_env("reach", obs_mode="state").env_spec
    with EpisodeStore(store_path, "a") as store:
        store.update_info(env="reach", features={STATE: {**spec.observation_features[STATE].to_dict(), "shape": [3]}})
    cfg = _cfg(store_path, tmp_path / "run")
    with pytest.raises(ValueError, match=r"observation.state: env 'reach' with obs_mode='state' gives shape \(6,\), "):
        train(cfg)


def test_unknown_env_and_non_store_path_name_the_field(reach_store, tmp_path):
    cfg = _cfg(reach_store, tmp_path / "run")
    cfg.dataset.env = "nosuchenv"
    with pytest.raises(ValueError, match=r"dataset.env: expected one of \[.*'reach'.*\], received 'nosuchenv'$"):
        train(cfg)
    (tmp_path / "folder").mkdir()
    cfg = _cfg(tmp_path / "folder", tmp_path / "run")
    with pytest.raises(ValueError, match="dataset.path: .*not an episode store"):
        train(cfg)


def test_a_new_run_over_an_old_one_warns(reach_store, tmp_path, capsys):
    train(_cfg(reach_store, tmp_path / "run", steps=2, val_every=0))
    assert "already holds a run" not in capsys.readouterr().err
    train(_cfg(reach_store, tmp_path / "run", steps=2, val_every=0))
    assert "already holds a run; starting over" in capsys.readouterr().err


def test_validation_without_held_out_episodes_warns(reach_store, tmp_path, capsys):
    cfg = _cfg(reach_store, tmp_path / "run", steps=2, val_every=1)
    cfg.dataset.val_fraction = 0.0
    train(cfg)
    assert "val_every=1 but no episode is held out (dataset.val_fraction=0.0, 4 episodes)" in capsys.readouterr().err
    assert not any(r["val_loss"] for r in csv.DictReader((tmp_path / "run" / "metrics.csv").open()))


@pytest.fixture
def lerobot_store(tmp_path):
    """A store recorded on an env that does not exist here ('bench_arm'), exported to LeRobot v3.0 and imported
    back: its info keeps fps, features and action names, but no env and no complete ActionSpec."""
    src = tmp_path / "robot.zarr"
    rng = np.random.default_rng(1)
    with EpisodeStore(src, "w") as store:
        store.update_info(
            fps=15.0,
            env="bench_arm",
            features={STATE: {"dtype": "float32", "shape": [3], "names": ["j0", "j1", "j2"], "unit": "rad"}},
            action={"names": ["dx", "dy"]},
        )
        for length in (10, 12, 14):
            state = np.cumsum(rng.normal(0, 0.1, (length, 3)), 0).astype(np.float32)
            store.add_episode({STATE: state, "action": np.tanh(state[:, :2]).astype(np.float32)})
    with EpisodeStore(src) as store:
        root = export_lerobot(store, tmp_path / "lerobot")
    return import_lerobot(root, tmp_path / "imported.zarr").path


def test_train_on_a_lerobot_import_with_no_registered_env(lerobot_store, tmp_path):
    from policylink.policies import load_policy

    with EpisodeStore(lerobot_store) as store:
        assert "env" not in store.info and store.info["fps"] == 15.0
        actions = store.load(["action"])["action"]
    cfg = _cfg(lerobot_store, tmp_path / "run", steps=3, val_every=0)
    cfg.dataset = DatasetConfig(path=str(lerobot_store), control_mode="ee_delta", val_fraction=0.0)
    ckpt = train(cfg)
    policy = load_policy(ckpt, device="cpu", seed=0)
    spec = policy.spec
    assert spec.control_frequency == 15.0 and spec.observation_features[STATE].names == ("j0", "j1", "j2")
    assert spec.action.names == ("dx", "dy") and spec.action.control_mode == "ee_delta"
    np.testing.assert_allclose(spec.action.low, actions.min(0), rtol=1e-6)
    np.testing.assert_allclose(spec.action.high, actions.max(0), rtol=1e-6)
    policy.update_observation({STATE: np.zeros((2, 3), np.float32)})
    chunk = policy.predict_action_chunk()
    assert chunk.shape == (2, 8, 2) and chunk.dtype == np.float32 and np.isfinite(chunk).all()


def test_a_store_missing_spec_info_is_named(lerobot_store, tmp_path):
    cfg = _cfg(lerobot_store, tmp_path / "run", steps=1, val_every=0)
    cfg.dataset = DatasetConfig(path=str(lerobot_store), val_fraction=0.0)
    with pytest.raises(
        StoreInfoError, match=r"action: the store .* records no complete ActionSpec .*dataset.control_mode"
    ):
        train(cfg)
    bare = tmp_path / "bare.zarr"  # no info at all: features come from the arrays, the rate from nowhere
    with EpisodeStore(lerobot_store) as src, EpisodeStore(bare, "w") as dst:
        dst.add_episode(src.get_episode(0, [STATE, "action"]))
    cfg.dataset = DatasetConfig(path=str(bare), control_mode="ee_delta", val_fraction=0.0)
    with pytest.raises(StoreInfoError, match=r"fps: the store .* does not record its control frequency"):
        train(cfg)
    cfg.dataset = DatasetConfig(path=str(bare), env="nowhere", val_fraction=0.0)
    with pytest.raises(ValueError, match=r"dataset.env: expected one of \[.*\], received 'nowhere'$"):
        train(cfg)
    cfg = _cfg(bare, tmp_path / "run", steps=1)
    cfg.dataset.env, cfg.eval.every = "", 5
    with pytest.raises(ValueError, match=r"dataset.env: evaluation rollouts \(eval.every=5\) need a registered env"):
        train(cfg)


def test_a_store_without_episodes_is_named(tmp_path):
    path = tmp_path / "empty.zarr"
    EpisodeStore(path, "w").close()
    with pytest.raises(ValueError, match=r"^dataset.path: expected a store with at least one episode, received '.*"
                                         r"empty.zarr' with 0 episodes$"):  # fmt: skip
        train(_cfg(path, tmp_path / "run"))
