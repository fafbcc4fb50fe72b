"""Streaming statistics: float64 accumulation, Chan merging, pooled quantiles, image stats in [0, 1]."""

from __future__ import annotations

import numpy as np
import pytest

from policylink.data.buffer import EpisodeStore
from policylink.data.stats import ImageStats, RunningStats, compute_stats, stats_from_arrays


def test_large_offset_float32_std():
    x = np.array([[10000.0], [10001.0], [10002.0]], np.float32)
    s = RunningStats((1,))
    for row in x:  # one row at a time: Chan merges of single values
        s.update(row[None])
    r = s.result()
    assert r["mean"][0] == pytest.approx(10001.0, abs=1e-9)
    assert r["std"][0] == pytest.approx(np.sqrt(2 / 3), abs=1e-9)  # 0.8165
    assert r["count"][0] == 3
    assert r["min"][0] == 10000.0 and r["max"][0] == 10002.0


def test_chan_merge_equals_one_pass():
    rng = np.random.default_rng(0)
    parts = [rng.normal(5, 3, size=(n, 4)) for n in (1, 7, 100, 33)]
    merged = RunningStats((4,))
    for p in parts:
        merged.update(p)
    pooled = np.concatenate(parts)
    r = merged.result()
    np.testing.assert_allclose(r["mean"], pooled.mean(0), rtol=1e-12)
    np.testing.assert_allclose(r["std"], pooled.std(0), rtol=1e-12)
    np.testing.assert_allclose(r["q01"], np.quantile(pooled, 0.01, axis=0), rtol=1e-12)


def test_quantiles_are_pooled_not_averaged(tmp_path):
    with EpisodeStore(tmp_path / "s.zarr", "a") as s:
        s.add_episode({"action": np.zeros((100, 1), np.float32)})
        s.add_episode({"action": np.arange(1, 101, dtype=np.float32)[:, None]})
    st = compute_stats(EpisodeStore(tmp_path / "s.zarr"), keys=["action"])["action"]
    pooled = np.concatenate([np.zeros(100), np.arange(1, 101)])
    assert st["q99"][0] == pytest.approx(np.quantile(pooled, 0.99))  # 98.01
    assert st["q99"][0] == pytest.approx(98.01)
    per_episode_average = (0.0 + np.quantile(np.arange(1, 101), 0.99)) / 2  # 49.505: wrong answer
    assert abs(st["q99"][0] - per_episode_average) > 40
    assert st["q01"][0] == 0.0
    assert st["mean"][0] == pytest.approx(25.25)
    assert st["count"][0] == 200


def test_quantile_subsample_past_cap_is_close():
    x = np.arange(100000, dtype=np.float64)[:, None]
    s = RunningStats((1,), max_samples=20000)
    for chunk in np.array_split(x, 10):
        s.update(chunk)
    r = s.result()
    assert r["q99"][0] == pytest.approx(98999.01, rel=0.01)
    assert r["mean"][0] == pytest.approx(49999.5)  # exact regardless of the cap


def test_image_stats_in_unit_scale_and_exact():
    frames = np.zeros((2, 2, 2, 3), np.uint8)
    frames[..., 0] = 255  # red channel all 255
    frames[0, :, :, 1] = 51  # green: 4 pixels 51 (0.2), 4 pixels 0
    st = stats_from_arrays({"observation.images.front": frames})["observation.images.front"]
    assert st["mean"].shape == (3, 1, 1)
    np.testing.assert_allclose(st["mean"].ravel(), [1.0, 0.1, 0.0])
    np.testing.assert_allclose(st["std"].ravel(), [0.0, 0.1, 0.0], atol=1e-12)
    np.testing.assert_allclose(st["max"].ravel(), [1.0, 0.2, 0.0])
    np.testing.assert_allclose(st["min"].ravel(), [1.0, 0.0, 0.0])
    assert st["count"][0] == 2
    # histogram quantile equals numpy's linear quantile of the pixels in [0, 1]
    rng = np.random.default_rng(1)
    img = rng.integers(0, 256, size=(5, 7, 9, 3), dtype=np.uint8)
    acc = ImageStats()
    acc.update(img[:2])
    acc.update(img[2:])
    r = acc.result()
    ref = img.reshape(-1, 3).astype(np.float64) / 255.0
    np.testing.assert_allclose(r["q01"].ravel(), np.quantile(ref, 0.01, axis=0), atol=1e-12)
    np.testing.assert_allclose(r["q99"].ravel(), np.quantile(ref, 0.99, axis=0), atol=1e-12)
    np.testing.assert_allclose(r["std"].ravel(), ref.std(0), atol=1e-12)


def test_compute_stats_episode_subset(tmp_path):
    with EpisodeStore(tmp_path / "s.zarr", "a") as s:
        for v in (1.0, 3.0, 100.0):
            s.add_episode({"action": np.full((4, 2), v, np.float32)})
    st = compute_stats(EpisodeStore(tmp_path / "s.zarr"), episodes=[0, 1])
    assert set(st) == {"action", "reward"}  # done is skipped
    np.testing.assert_allclose(st["action"]["mean"], [2.0, 2.0])
    np.testing.assert_allclose(st["action"]["std"], [1.0, 1.0])
    with pytest.raises(ValueError, match="at least one episode"):
        compute_stats(EpisodeStore(tmp_path / "s.zarr"), episodes=[])
