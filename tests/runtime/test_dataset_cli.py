"""``policylink dataset {info,stats,export-lerobot,import-lerobot,merge}`` on small stores with known values."""

from __future__ import annotations

import json

import numpy as np
import pytest

from policylink.data.buffer import EpisodeDataError, EpisodeMeta, EpisodeStore
from policylink.runtime import dataset as cli


def _store(path, values, success):
    with EpisodeStore(path, "a") as s:
        s.update_info(fps=20.0, env="toy")
        for v, ok in zip(values, success):
            s.add_episode(
                {
                    "observation.state": np.full((4, 2), v, np.float32),
                    "observation.images.cam": np.full((4, 4, 4, 3), 51, np.uint8),
                    "action": np.full((4, 1), -v, np.float32),
                },
                EpisodeMeta(task="reach", success=ok, source="expert", quality="noisy"),
            )
    return path


def test_info_and_stats(tmp_path, capsys):
    path = _store(tmp_path / "a.zarr", [1.0, 3.0], [True, False])
    assert cli.main(["info", str(path)]) == 0
    out = capsys.readouterr().out
    assert "zarr format 3, 2 episodes, 8 steps" in out
    assert "fps: 20.0 Hz, env: toy" in out
    assert "success rate: 0.500 (1/2" in out
    assert "observation.state" in out and "(2,)" in out
    assert "source: 'expert' x2" in out
    assert cli.main(["stats", str(path), "--out", str(tmp_path / "s.json")]) == 0
    st = json.loads((tmp_path / "s.json").read_text())
    assert st["observation.state"]["mean"] == [2.0, 2.0] and st["observation.state"]["std"] == [1.0, 1.0]
    assert st["observation.images.cam"]["mean"] == [[[0.2]], [[0.2]], [[0.2]]]
    assert st["action"]["count"] == [8]


def test_merge_only_success_and_mismatch(tmp_path, capsys):
    a = _store(tmp_path / "a.zarr", [1.0, 2.0], [True, False])
    b = _store(tmp_path / "b.zarr", [5.0], [True])
    assert cli.main(["merge", "--inputs", f"{a},{b}", "--out", str(tmp_path / "m.zarr"), "--only_success", "true"]) == 0
    m = EpisodeStore(tmp_path / "m.zarr")
    assert m.n_episodes == 2 and m.info["fps"] == 20.0
    assert [float(m.get_episode(i)["observation.state"][0, 0]) for i in range(2)] == [1.0, 5.0]
    assert "merged 2 episodes (8 steps) from 2 stores" in capsys.readouterr().out
    with EpisodeStore(tmp_path / "c.zarr", "a") as c:
        c.add_episode({"action": np.zeros((2, 1), np.float32)})
    with pytest.raises(EpisodeDataError, match="keys: expected"):
        cli.main(["merge", "--inputs", f"{a},{tmp_path / 'c.zarr'}", "--out", str(tmp_path / "bad.zarr")])


def test_export_import_lerobot_cli(tmp_path, capsys):
    path = _store(tmp_path / "a.zarr", [1.0, 3.0], [True, False])
    assert cli.main(["export-lerobot", str(path), "--out", str(tmp_path / "lr")]) == 0
    info = json.loads((tmp_path / "lr" / "meta" / "info.json").read_text())
    assert info["fps"] == 20 and info["total_episodes"] == 2
    assert cli.main(["import-lerobot", str(tmp_path / "lr"), "--out", str(tmp_path / "back.zarr")]) == 0
    back = EpisodeStore(tmp_path / "back.zarr")
    np.testing.assert_array_equal(back.load(["action"])["action"], EpisodeStore(path).load(["action"])["action"])
    assert [m.success for m in back.all_meta()] == [True, False]
    out = capsys.readouterr().out
    assert "exported 2 episodes, 8 frames" in out and "imported 2 episodes, 8 frames" in out


def test_usage(capsys):
    assert cli.main([]) == 0
    assert "export-lerobot" in capsys.readouterr().out
    assert cli.main(["frobnicate"]) == 2
    with pytest.raises(ValueError, match="path: expected a path"):
        cli.main(["info"])
