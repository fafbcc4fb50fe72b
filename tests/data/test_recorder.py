"""EpisodeRecorder: step pairing, commit on end, discard on abort, parallel slots, lock ownership."""

from __future__ import annotations

import numpy as np
import pytest

from policylink.data.buffer import EpisodeStore, StoreLockedError
from policylink.data.episode_meta import EpisodeMeta
from policylink.data.recorder import EpisodeRecorder, RecorderError


def _obs(t: int) -> dict:
    return {
        "observation.state": np.array([t, 2 * t], np.float32),
        "observation.images.front": np.full((2, 2, 3), t, np.uint8),
        "task": "stack the cubes",
    }


def test_record_commit_and_abort(tmp_path):
    path = tmp_path / "r.zarr"
    with EpisodeRecorder(path) as rec:
        rec.start_episode(EpisodeMeta(seed=3, source="policy", quality="ckpt-10"))
        for t in range(4):
            rec.add_step(_obs(t), np.array([t + 0.5], np.float32), reward=float(t), done=False)
        assert rec.n_steps() == 4
        assert rec.end_episode(success=True) == 0
        rec.start_episode(EpisodeMeta(seed=4))
        rec.add_step(_obs(9), np.zeros(1, np.float32))
        rec.abort_episode()  # discarded
        assert not rec.is_recording()
        rec.start_episode()
        rec.add_step(_obs(7), np.zeros(1, np.float32))
        rec.close()  # an open episode is discarded on close
    s = EpisodeStore(path)
    assert s.n_episodes == 1 and s.n_steps == 4
    ep = s.get_episode(0)
    np.testing.assert_array_equal(ep["observation.state"], [[0, 0], [1, 2], [2, 4], [3, 6]])
    np.testing.assert_array_equal(ep["action"][:, 0], [0.5, 1.5, 2.5, 3.5])
    np.testing.assert_array_equal(ep["reward"], [0, 1, 2, 3])
    np.testing.assert_array_equal(ep["done"], [False, False, False, True])
    assert ep["observation.images.front"].shape == (4, 2, 2, 3) and ep["observation.images.front"][2].max() == 2
    assert "task" not in s.keys
    assert s.episode_meta(0) == EpisodeMeta("stack the cubes", True, 3, "policy", "ckpt-10")


def test_parallel_slots_commit_in_end_order(tmp_path):
    with EpisodeRecorder(tmp_path / "r.zarr") as rec:
        for slot in (0, 1):
            rec.start_episode(EpisodeMeta(seed=slot), slot=slot)
        for t in range(3):
            for slot in (0, 1) if t < 2 else (0,):
                rec.add_step({"observation.state": np.array([slot], np.float32)}, np.zeros(1, np.float32), slot=slot)
            if t == 1:
                assert rec.end_episode(False, slot=1) == 0  # slot 1 finishes first
        assert rec.end_episode(True, slot=0) == 1
    s = EpisodeStore(tmp_path / "r.zarr")
    np.testing.assert_array_equal(s.episode_lengths, [2, 3])
    assert [m.seed for m in s.all_meta()] == [1, 0]
    assert s.get_episode(1)["observation.state"].sum() == 0.0


def test_errors_and_lock(tmp_path):
    path = tmp_path / "r.zarr"
    rec = EpisodeRecorder(path)
    with pytest.raises(RecorderError, match="no episode started"):
        rec.add_step(_obs(0), np.zeros(1, np.float32))
    rec.start_episode()
    with pytest.raises(RecorderError, match="no steps"):
        rec.end_episode(True)
    rec.start_episode()
    rec.add_step(_obs(0), np.zeros(1, np.float32))
    with pytest.raises(RecorderError, match=r"action: expected per-step shape \(1,\)"):
        rec.add_step(_obs(1), np.zeros(2, np.float32))
    with pytest.raises(StoreLockedError):
        EpisodeRecorder(path)
    rec.close()
    EpisodeRecorder(path).close()  # lock released
