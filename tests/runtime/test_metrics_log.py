"""The trainer's metrics sinks: metrics.csv, TensorBoard event files, and a wandb run (a stand-in module)."""

from __future__ import annotations

import csv
import sys
import types

import pytest

from policylink.train.config import TrainConfig, validate_config
from policylink.train.metrics_log import MetricsLogger


def test_csv_and_tensorboard_hold_the_logged_values(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    log = MetricsLogger(tmp_path, ("step", "loss", "lr"))
    log.log(10, {"loss": 0.5, "lr": 1e-4})
    log.log(20, {"loss": 0.25})
    log.close()
    with (tmp_path / "metrics.csv").open() as f:
        assert list(csv.DictReader(f)) == [
            {"step": "10", "loss": "0.5", "lr": "0.0001"},
            {"step": "20", "loss": "0.25", "lr": ""},
        ]
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("loss")] == [(10, 0.5), (20, 0.25)]
    assert [(e.step, pytest.approx(e.value)) for e in acc.Scalars("lr")] == [(10, pytest.approx(1e-4))]
    again = MetricsLogger(tmp_path, ("step", "loss", "lr"), resume=True)  # resume appends
    again.log(30, {"loss": 0.125})
    again.close()
    assert (tmp_path / "metrics.csv").read_text().splitlines()[-1] == "30,0.125,"


def test_wandb_run_gets_each_row(tmp_path, monkeypatch):
    calls = []

    class Run:
        def log(self, row, step):
            calls.append(("log", row, step))

        def finish(self):
            calls.append(("finish",))

    fake = types.ModuleType("wandb")
    fake.init = lambda **kw: calls.append(("init", kw["project"], kw["name"], kw["resume"], kw["config"])) or Run()
    monkeypatch.setitem(sys.modules, "wandb", fake)
    log = MetricsLogger(tmp_path / "run1", ("step", "loss"), wandb_project="pl", config={"steps": 3})
    log.log(3, {"loss": 1.5})
    log.close()
    assert calls == [("init", "pl", "run1", "allow", {"steps": 3}), ("log", {"loss": 1.5}, 3), ("finish",)]
    off = MetricsLogger(tmp_path / "rank1", ("step", "loss"), enabled=False, wandb_project="pl")
    off.log(1, {"loss": 1.0})
    assert len(calls) == 3 and not (tmp_path / "rank1").exists()


def test_wandb_project_without_wandb_is_one_error_naming_the_field(tmp_path, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    store = tmp_path / "s.zarr"
    store.mkdir()
    cfg = TrainConfig(wandb_project="pl")
    cfg.dataset.path = str(store)
    with pytest.raises(ValueError, match=r"^wandb_project: 'pl' needs wandb \(pip install wandb; wandb login\)"):
        validate_config(cfg)
