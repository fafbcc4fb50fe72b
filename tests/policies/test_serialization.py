"""One save format (safetensors + JSON, never pickle) for every artefact: the tree round trip, the policy checkpoint,
the critic, the monitor and the training-resume state reload exactly; a resumed run continues with the same optimizer
state; files of the old pickle layout get a clear error and are never unpickled."""

from __future__ import annotations

import copy
import json
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

from policylink.policies.checkpoint import (
    CheckpointError,
    load_components,
    load_training_state,
    read_checkpoint_config,
    save_checkpoint,
)
from policylink.policies.config import build_model
from policylink.policies.corrector.calibration import ConformalThresholds
from policylink.policies.corrector.monitor import LatentMonitor, MonitorConfig, load_monitor, save_monitor
from policylink.policies.critics import ChunkCritic, CriticConfig
from policylink.policies.serialization import (
    LegacyFormatError,
    SerializationError,
    load_json,
    load_tree,
    save_json,
    save_tree,
)
from policylink.train.trainer import OptimConfig, Optimization


def assert_same_tree(a, b, where="tree"):
    """Equal structure, types, dtypes, shapes and values (tensors and arrays bit for bit); dict order aside
    (safetensors files list their tensors sorted by name; a state_dict's OrderedDict comes back a dict)."""
    assert type(a) is type(b) or (isinstance(a, dict) and isinstance(b, dict)), (where, type(a), type(b))
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b), where
    elif isinstance(a, (np.ndarray, np.generic)):
        assert a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b), where
    elif isinstance(a, dict):
        assert sorted(a, key=str) == sorted(b, key=str), (where, list(a), list(b))
        for k in a:
            assert_same_tree(a[k], b[k], f"{where}/{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same_tree(x, y, f"{where}/{i}")
    else:
        assert a == b, (where, a, b)


def _optimizer_state():
    torch.manual_seed(0)
    net = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3, betas=(0.9, 0.95))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (s + 1))
    for _ in range(3):
        opt.zero_grad()
        net(torch.randn(4, 3)).square().sum().backward()
        opt.step()
        sched.step()
    return {"optimizer": opt.state_dict(), "scheduler": sched.state_dict()}


def test_tree_round_trip_keeps_every_type_and_bit(tmp_path):
    tree = {
        **_optimizer_state(),
        "rng": {"torch": torch.get_rng_state(), "numpy": np.random.get_state()},
        "step": 7,
        "scalars": [np.float32(0.1), np.int64(-3), 0.1, float("inf"), None, True, "text"],
        "bf16": torch.tensor([1.5, -2.25], dtype=torch.bfloat16),
        "empty": torch.zeros(0, 4),
        "same_tensor_twice": [torch.arange(3)] * 2,
        "odd_keys": {4: "int key", "__tensor__": "a str key that looks like a marker"},
    }
    files = save_tree(tmp_path / "state", tree)
    assert [f.name for f in files] == ["state.safetensors", "state.json"]
    back = load_tree(tmp_path / "state")
    assert_same_tree(tree, back)
    assert back["optimizer"]["param_groups"][0]["betas"] == (0.9, 0.95)  # a tuple again
    assert sorted(back["optimizer"]["state"]) == [0, 1]  # int keys again
    assert back["rng"]["numpy"][1].dtype == np.uint32 and back["rng"]["numpy"][1].shape == (624,)
    skeleton = json.loads((tmp_path / "state.json").read_text())
    assert skeleton["format"] == "policylink.tree/1" and skeleton["tree"]["step"] == 7
    assert skeleton["tree"]["rng"]["torch"] == {"__tensor__": "rng/torch"}


def test_tree_refuses_what_only_pickle_could_save(tmp_path):
    with pytest.raises(SerializationError, match=r"optimizer/hook: expected a tensor, .* received function"):
        save_tree(tmp_path / "s", {"optimizer": {"hook": lambda: 0}})
    with pytest.raises(SerializationError, match=r"state: expected str or int keys, received \(1, 2\)"):
        save_tree(tmp_path / "s", {"state": {(1, 2): 0}})
    with pytest.raises(SerializationError, match=r"s.json: cannot be written as JSON"):
        save_json(tmp_path / "s.json", {"a": {1, 2}})
    assert not list(tmp_path.iterdir())  # nothing half-written


def test_tree_with_a_foreign_skeleton_or_a_missing_tensor_is_refused(tmp_path):
    save_tree(tmp_path / "s", {"w": torch.ones(2)})
    doc = load_json(tmp_path / "s.json")
    save_json(tmp_path / "s.json", {**doc, "tree": {"w": {"__tensor__": "v"}}})
    with pytest.raises(SerializationError, match=r"s.safetensors: missing tensor 'v' named by .*s.json"):
        load_tree(tmp_path / "s")
    save_json(tmp_path / "s.json", {"tree": {}})
    with pytest.raises(SerializationError, match=r"format: expected 'policylink.tree/1', received None"):
        load_tree(tmp_path / "s")


def test_policy_checkpoint_reloads_every_tensor_exactly(kit, tmp_path, normalizer):
    cfg = kit.tiny_config("flow", keys=(kit.STATE, kit.IMAGE))
    spec = kit.make_spec(cfg, kit.FEATURES)
    model = build_model(cfg, kit.FEATURES, 2)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p))  # off the init: a skipped load would show
    path = save_checkpoint(
        tmp_path / "ckpt", model=model, spec=spec, processors=kit.chain(cfg, normalizer), train_config={"lr": 0.1}
    )
    assert read_checkpoint_config(path) == {"policy": cfg.to_dict(), "train": {"lr": 0.1}}
    cfg2, spec2, model2, chain2 = load_components(path)
    assert cfg2 == cfg and spec2 == spec
    assert_same_tree(model.state_dict(), model2.state_dict())
    assert_same_tree(normalizer.state_dict(), chain2.normalizer.state_dict())
    assert chain2.to_dict() == kit.chain(cfg, normalizer).to_dict()


def _step_loss(model):
    x = torch.randn(8, 3)  # global RNG: the resumed run must draw the same batches
    return (model(x) - 1.0).square().mean()


def _run(model):
    cfg = OptimConfig("adamw", lr=1e-2, grad_clip=1.0, schedule="cosine", warmup_steps=2, total_steps=10,
                      ema_max_decay=0.99)  # fmt: skip
    return Optimization(model, cfg)


def test_resumed_training_continues_with_identical_optimizer_state(kit, tmp_path, normalizer):
    """Steps 1-3, save (as runtime.train does), steps 4-6; a fresh run loaded from the save does steps 4-6 too:
    the optimizer, schedule, EMA, weights and RNG match the uninterrupted run exactly."""
    cfg = kit.tiny_config("flow")
    spec = kit.make_spec(cfg, kit.FEATURES)
    torch.manual_seed(0)
    ckpt_model = build_model(cfg, kit.FEATURES, 2)  # the served weights in the folder; not what is resumed here
    net = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    run = _run(net)
    for _ in range(3):
        run.step(_step_loss(net))
    state = {"model": net.state_dict(), **run.state(), "step": 3, "rng": {"torch": torch.get_rng_state()}}
    save_checkpoint(
        tmp_path / "ckpt", model=ckpt_model, spec=spec, processors=kit.chain(cfg, normalizer), training_state=state
    )
    saved = copy.deepcopy(state)  # state_dict() tensors are the live ones: the next steps change them in place
    for _ in range(3):
        run.step(_step_loss(net))

    torch.manual_seed(123)  # anything: the saved RNG state must win
    net2 = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    run2 = _run(net2)
    loaded = load_training_state(tmp_path / "ckpt")
    assert_same_tree(saved, loaded)
    net2.load_state_dict(loaded["model"])
    run2.load(loaded)
    torch.set_rng_state(loaded["rng"]["torch"])
    assert loaded["step"] == 3 and run2.lr == pytest.approx(1e-2 * 0.5 * (1 + np.cos(np.pi * 1 / 8)))
    for _ in range(3):
        run2.step(_step_loss(net2))
    assert_same_tree(net.state_dict(), net2.state_dict())
    assert_same_tree(run.optimizer.state_dict(), run2.optimizer.state_dict())
    assert_same_tree(run.scheduler.state_dict(), run2.scheduler.state_dict())
    assert_same_tree(run.ema.state_dict(), run2.ema.state_dict())


def test_critic_reloads_every_tensor_exactly(tmp_path):
    torch.manual_seed(0)
    critic = ChunkCritic(CriticConfig(state_dim=5, action_dim=2, horizon=3, hidden_dim=8, n_layers=2, n_heads=3))
    with torch.no_grad():
        for p in critic.q_targets.parameters():
            p.add_(1.0)  # targets differ from the online heads: both must come back
    folder = critic.save(tmp_path / "critic")
    assert sorted(f.name for f in folder.iterdir()) == ["critic.json", "critic.safetensors"]
    assert load_json(folder / "critic.json")["n_heads"] == 3
    back = ChunkCritic.load(folder)
    assert back.cfg == critic.cfg
    assert_same_tree(critic.state_dict(), back.state_dict())


def test_monitor_reloads_exactly_with_thresholds_and_meta(tmp_path):
    torch.manual_seed(0)
    mon = LatentMonitor(4, 2, MonitorConfig(horizon=3, hidden_dim=8, n_layers=1, score="residual"))
    rng = np.random.default_rng(0)
    mon.set_statistics(rng.normal(size=(20, 4)), rng.normal(size=(20, 2)), rng.normal(size=(20, 4)))
    thr = ConformalThresholds(np.array([0.5, 0.25]), 0.05, np.array([30, 12]), 0.35)
    save_monitor(tmp_path / "m", mon, thr, meta={"probe_latent": [0.5, -1.0]})
    back, thr2 = load_monitor(tmp_path / "m")
    assert_same_tree(mon.state_dict(), back.state_dict())
    assert back.config == mon.config and back.policy_probe == [0.5, -1.0]
    np.testing.assert_array_equal(thr2.thresholds, [0.5, 0.25])
    np.testing.assert_array_equal(thr2.counts, [30, 12])
    assert (thr2.alpha, thr2.ewma) == (0.05, 0.35)


class _Tripwire:
    """Unpickling this touches ``path``: proof that a legacy file was (or was not) unpickled."""

    def __init__(self, path: Path):
        self.path = path

    def __reduce__(self):
        return (Path.touch, (self.path,))


def test_the_tripwire_fires_when_unpickled(tmp_path):
    pickle.loads(pickle.dumps(_Tripwire(tmp_path / "fired")))
    assert (tmp_path / "fired").exists()


def test_old_pickle_training_state_is_refused_by_name_and_never_unpickled(kit, tmp_path, normalizer):
    cfg = kit.tiny_config("flow")
    path = save_checkpoint(
        tmp_path / "old", model=build_model(cfg, kit.FEATURES, 2), processors=kit.chain(cfg, normalizer),
        spec=kit.make_spec(cfg, kit.FEATURES),
    )  # fmt: skip
    marker = tmp_path / "unpickled"
    (path / "training_state.pt").write_bytes(pickle.dumps(_Tripwire(marker)))
    with pytest.raises(LegacyFormatError, match=r"old/training_state.pt: an old-format pickle file") as err:
        load_training_state(path)
    assert "train again without --resume" in str(err.value) and "training_state.safetensors" in str(err.value)
    assert not marker.exists()
    (path / "training_state.pt").unlink()
    with pytest.raises(CheckpointError, match=r"missing training_state.safetensors \+ training_state.json"):
        load_training_state(path)
    load_components(path)  # the rest of an old-layout folder still loads


def test_old_pickle_critic_is_refused_by_name_and_never_unpickled(tmp_path):
    folder = ChunkCritic(CriticConfig(state_dim=5, action_dim=2, horizon=3, hidden_dim=8)).save(tmp_path / "c")
    (folder / "critic.safetensors").rename(folder / "critic.pt")
    marker = tmp_path / "unpickled"
    (folder / "critic.pt").write_bytes(pickle.dumps(_Tripwire(marker)))
    with pytest.raises(LegacyFormatError, match=r"c/critic.pt: an old-format pickle file.*policylink finetune critic"):
        ChunkCritic.load(folder)
    assert not marker.exists()
