"""Training straight from a LeRobot v3 dataset folder (``dataset.path`` pointing at it, no import step): the same
spec, statistics and batches as from the store it was exported from, and a clear error for a folder that is
neither."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from policylink.adapters.registry import make_env
from policylink.data.buffer import EpisodeStore
from policylink.data.episode_meta import EpisodeMeta
from policylink.data.lerobot import export_lerobot, is_lerobot_dataset, open_lerobot
from policylink.policies.common.unet1d import UNetConfig
from policylink.policies.registry import make_config
from policylink.train.data import training_data
from policylink.train.imitation import DatasetConfig, TrainConfig, train
from policylink.train.losses import BatchFields

STATE = "observation.state"


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> tuple[Path, Path]:
    """A 3-episode store with `reach`'s info (as the recorder writes it) and its LeRobot v3 export."""
    spec = make_env("reach", obs_mode="state").env_spec
    rng = np.random.default_rng(0)
    base = tmp_path_factory.mktemp("lerobot_folder")
    with EpisodeStore(base / "reach.zarr", "w") as store:
        store.update_info(
            fps=10.0, env="reach", features={STATE: spec.observation_features[STATE].to_dict()},
            action=spec.action.to_dict(),
        )  # fmt: skip
        for i, length in enumerate((9, 11, 13)):
            state = np.cumsum(rng.normal(0, 0.1, (length, 6)), 0).astype(np.float32)
            actions = (0.02 * np.tanh(state[:, :3])).astype(np.float32)
            store.add_episode({STATE: state, "action": actions}, EpisodeMeta(task="reach", seed=i, success=True))
    with EpisodeStore(base / "reach.zarr") as store:
        folder = export_lerobot(store, base / "lerobot")
    return base / "reach.zarr", folder


def _cfg(path: Path, out: Path, **kw) -> TrainConfig:
    policy = make_config("flow", chunk_size=4, n_action_steps=2, unet=UNetConfig(down_dims=[8, 16], time_embed_dim=8))
    return TrainConfig(
        policy=policy, dataset=DatasetConfig(path=str(path), val_fraction=0.0), output_dir=str(out), batch_size=4,
        log_every=1, val_every=0, device="cpu", progress=False, torch_threads=1, **kw,
    )  # fmt: skip


def test_a_lerobot_folder_gives_the_stores_spec_stats_and_batches(exported, tmp_path, monkeypatch):
    store_path, folder = exported
    monkeypatch.setenv("POLICYLINK_CACHE", str(tmp_path / "cache"))
    assert is_lerobot_dataset(folder) and not is_lerobot_dataset(store_path)
    spec_a, ds_a, _ = training_data(_cfg(store_path, tmp_path / "a"), BatchFields())
    spec_b, ds_b, _ = training_data(_cfg(folder, tmp_path / "b"), BatchFields())
    assert spec_b == spec_a  # features, ActionSpec (carried in info.json) and rate, with no dataset.env
    for key, stats in ds_a.processors.normalizer.state_dict().items():
        np.testing.assert_array_equal(ds_b.processors.normalizer.state_dict()[key], stats)
    assert len(ds_b) == len(ds_a) == 33
    for i in (0, 8, 32):
        a, b = ds_a[i], ds_b[i]
        for key in (STATE, "action"):
            np.testing.assert_array_equal(np.asarray(b[key]), np.asarray(a[key]))
    cached = sorted((tmp_path / "cache" / "lerobot").iterdir())
    assert len(cached) == 1 and cached[0].name.startswith("lerobot-")
    assert open_lerobot(folder).path == cached[0]  # read once, reused while the folder is unchanged


def test_train_three_steps_from_a_lerobot_folder(exported, tmp_path, monkeypatch):
    from policylink.policies import load_policy

    monkeypatch.setenv("POLICYLINK_CACHE", str(tmp_path / "cache"))
    ckpt = train(_cfg(exported[1], tmp_path / "run", steps=3, lr=1e-3, warmup_steps=1))
    policy = load_policy(ckpt, device="cpu")
    assert policy.spec.action.control_mode == "ee_delta" and policy.spec.control_frequency == 10.0
    policy.update_observation({STATE: np.zeros((1, 6), np.float32), "task": ["reach"]})
    assert policy.predict_action_chunk().shape == (1, 4, 3)


def test_a_folder_that_is_neither_names_the_field(tmp_path):
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "notes.txt").write_text("hello")
    with pytest.raises(ValueError, match=r"dataset.path: expected an episode store or a LeRobot v3 dataset folder"):
        train(_cfg(tmp_path / "junk", tmp_path / "run", steps=1))
