"""``policylink dataset {info,stats,export-lerobot,import-lerobot,merge}`` on small stores with known values."""

from __future__ import annotations

import json

import numpy as np
import pytest

from policylink.cli import dataset as cli
from policylink.data.buffer import EpisodeDataError, EpisodeStore, StoreError
from policylink.data.episode_meta import EpisodeMeta


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


def test_info_counts_the_reality_gaps(tmp_path, capsys):
    path = _store(tmp_path / "a.zarr", [1.0], [True])
    assert cli.main(["info", str(path)]) == 0
    assert "reality gap" not in capsys.readouterr().out  # no gap: no line
    with EpisodeStore(path, "a") as s:
        for gap in ('{"name": "worn_gantry", "seed": 0}', '{"name": "worn_gantry"}', '{"seed": 1}'):
            s.add_episode(
                {
                    "observation.state": np.zeros((4, 2), np.float32),
                    "observation.images.cam": np.zeros((4, 4, 4, 3), np.uint8),
                    "action": np.zeros((4, 1), np.float32),
                },
                EpisodeMeta(task="reach", success=True, source="expert", quality="expert", gap=gap),
            )
    assert cli.main(["info", str(path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "reality gap: 'worn_gantry' x2, 'none' x1, 'unnamed' x1" in out


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
    c = tmp_path / "c.zarr"
    with pytest.raises(EpisodeDataError) as e:
        cli.main(["merge", "--inputs", f"{a},{c}", "--out", str(tmp_path / "bad.zarr")])
    assert str(e.value) == (
        f"inputs: feature 'observation.images.cam' is in {a} but not in {c}; merge needs identical features"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "a.zarr",
        "b.zarr",
        "c.zarr",
        "m.zarr",
    ]  # nothing half-written, no lock file left


def test_merge_shape_mismatch_names_feature(tmp_path):
    a = _store(tmp_path / "a.zarr", [1.0], [True])
    with EpisodeStore(tmp_path / "d.zarr", "a") as d:
        d.add_episode(
            {
                "observation.state": np.zeros((4, 3), np.float32),
                "observation.images.cam": np.zeros((4, 4, 4, 3), np.uint8),
                "action": np.zeros((4, 1), np.float32),
            }
        )
    with pytest.raises(EpisodeDataError) as e:
        cli.main(["merge", "--inputs", f"{a},{tmp_path / 'd.zarr'}", "--out", str(tmp_path / "m.zarr")])
    assert str(e.value) == (
        f"inputs: feature 'observation.state' is (per-step shape (2,), dtype float32) in {a} but (per-step shape "
        f"(3,), dtype float32) in {tmp_path / 'd.zarr'}; merge needs identical features"
    )
    assert not (tmp_path / "m.zarr").exists()


def test_merge_refuses_output_among_inputs(tmp_path):
    a = _store(tmp_path / "a.zarr", [1.0, 2.0], [True, False])
    b = _store(tmp_path / "b.zarr", [5.0], [True])
    for out in (str(a), f"{tmp_path}/./a.zarr"):  # same store, spelt differently
        with pytest.raises(ValueError) as e:
            cli.main(["merge", "--inputs", f"{a},{b}", "--out", out, "--overwrite", "true"])
        assert str(e.value) == f"out: expected a path that is not one of the inputs, received {out!r} (also an input)"
    s = EpisodeStore(a)  # untouched: data and metadata
    assert s.n_episodes == 2 and [m.success for m in s.all_meta()] == [True, False] and s.info["fps"] == 20.0


def test_merge_overwrite_flag(tmp_path, capsys):
    a = _store(tmp_path / "a.zarr", [1.0, 2.0], [True, False])
    b = _store(tmp_path / "b.zarr", [5.0], [True])
    m = tmp_path / "m.zarr"
    assert cli.main(["merge", "--inputs", str(a), "--out", str(m)]) == 0
    with pytest.raises(ValueError) as e:
        cli.main(["merge", "--inputs", str(b), "--out", str(m)])
    assert str(e.value) == f"out: {str(m)!r} already exists; pass --overwrite true to replace it"
    assert EpisodeStore(m).n_episodes == 2  # untouched
    assert cli.main(["merge", "--inputs", str(b), "--out", str(m), "--overwrite", "true"]) == 0
    s = EpisodeStore(m)
    assert s.n_episodes == 1 and float(s.get_episode(0)["observation.state"][0, 0]) == 5.0
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp/backup left
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "x.txt").write_text("keep")
    with pytest.raises(StoreError, match="not an episode store"):  # --overwrite only ever replaces a store
        cli.main(["merge", "--inputs", str(b), "--out", str(tmp_path / "notes"), "--overwrite", "true"])
    assert (tmp_path / "notes" / "x.txt").read_text() == "keep"
    with pytest.raises(SystemExit):
        cli.main(["merge", "--help"])
    assert "--overwrite" in capsys.readouterr().out


def test_non_store_path_errors(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(StoreError) as e:
        cli.main(["info", str(tmp_path / "empty")])
    assert str(e.value) == f"{tmp_path / 'empty'}: not an episode store (expected data/ and meta/episode_ends)"


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


_KILLED_MERGE = """
import sys, time
from policylink.data.buffer import EpisodeStore
from policylink.cli import dataset

def stall(self, *a, **k):  # the merge's temporary store and locks exist; wait here to be SIGKILLed
    open(sys.argv[1], "w").close()
    time.sleep(600)

EpisodeStore.add_episode = stall
dataset.main(["merge", "--inputs", sys.argv[2], "--out", sys.argv[3]])
"""


def test_merge_after_sigkill_cleans_stale_temporaries(tmp_path, capsys):
    import os
    import signal
    import subprocess
    import sys
    import time

    a = _store(tmp_path / "a.zarr", [1.0, 2.0], [True, False])
    m, ready = tmp_path / "m.zarr", tmp_path / "ready"
    proc = subprocess.Popen([sys.executable, "-c", _KILLED_MERGE, str(ready), str(a), str(m)])
    deadline = time.monotonic() + 120
    while not ready.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert ready.exists(), "the merge subprocess never reached add_episode"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    tag = f".m.zarr.merging-{proc.pid}"
    left = {p.name for p in tmp_path.iterdir()}
    assert {tag, tag + ".lock", tag + ".lock.owner", "m.zarr.lock.owner"} <= left and "m.zarr" not in left
    live = tmp_path / f".m.zarr.merging-{os.getppid()}"  # a merge of a live process (our parent): kept
    live.mkdir()
    assert cli.main(["merge", "--inputs", str(a), "--out", str(m)]) == 0
    err = capsys.readouterr().err
    assert f"cleaned up {tag} (left by a killed merge)" in err and f"cleaned up {tag}.lock " in err
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".") or "owner" in p.name) == [live.name]
    assert EpisodeStore(m).n_episodes == 2


def test_merge_killed_between_renames_restores_the_replaced_store(tmp_path, capsys):
    import subprocess
    import sys

    old = _store(tmp_path / "m.zarr", [7.0], [True])
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    backup = tmp_path / f".m.zarr.replaced-{int(dead.stdout)}"
    old.rename(backup)  # the state after `os.replace(out, old)` when the merge died before `os.replace(tmp, out)`
    b = _store(tmp_path / "b.zarr", [5.0], [True])
    with pytest.raises(ValueError, match="already exists; pass --overwrite true"):
        cli.main(["merge", "--inputs", str(b), "--out", str(tmp_path / "m.zarr")])
    assert not backup.exists()
    s = EpisodeStore(tmp_path / "m.zarr")
    assert s.n_episodes == 1 and float(s.get_episode(0)["observation.state"][0, 0]) == 7.0
