"""EpisodeStore: layout, metadata, formats 2/3, crash safety (SIGKILL) and the single-writer lock."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
import zarr

from policylink.data.buffer import (
    EpisodeDataError,
    EpisodeStore,
    StoreError,
    StoreLockedError,
    escape_key,
    unescape_key,
)
from policylink.data.episode_meta import EpisodeMeta


def _episode(i: int, t: int = 5) -> dict[str, np.ndarray]:
    return {
        "observation.state": np.full((t, 3), i, np.float32) + np.arange(t, dtype=np.float32)[:, None],
        "observation.images.front": np.full((t, 4, 4, 3), i, np.uint8),
        "action": np.full((t, 2), -i, np.float32),
    }


def test_layout_values_and_meta(tmp_path):
    path = tmp_path / "s.zarr"
    with EpisodeStore(path, "a") as s:
        s.add_episode(
            _episode(0, 3), EpisodeMeta(task="push the box", success=True, seed=7, source="expert", quality="noisy")
        )
        s.add_episode(_episode(1, 4), EpisodeMeta(task="lift", success=False, source="policy"))
        s.add_episode(_episode(2, 2))
    s = EpisodeStore(path)
    assert s.zarr_format == 3
    assert s.n_episodes == 3 and s.n_steps == 9
    np.testing.assert_array_equal(s.episode_ends, [3, 7, 9])
    np.testing.assert_array_equal(s.episode_lengths, [3, 4, 2])
    assert s.keys == ["action", "done", "observation.images.front", "observation.state", "reward"]
    ep = s.get_episode(1)
    np.testing.assert_array_equal(ep["observation.state"][:, 0], [1, 2, 3, 4])
    np.testing.assert_array_equal(ep["done"], [False, False, False, True])
    np.testing.assert_array_equal(ep["reward"], np.zeros(4, np.float32))
    assert s.episode_meta(0) == EpisodeMeta("push the box", True, 7, "expert", "noisy")
    assert s.episode_meta(1) == EpisodeMeta("lift", False, None, "policy", "")
    assert s.episode_meta(2) == EpisodeMeta()
    # plain diffusion_policy-style read with zarr alone
    root = zarr.open_group(str(path), mode="r")
    np.testing.assert_array_equal(root["meta/episode_ends"][:], [3, 7, 9])
    assert root["data/action"].shape == (9, 2)
    with pytest.raises(StoreError, match="read-only"):
        s.add_episode(_episode(3))


def test_rejects_mismatched_episode(tmp_path):
    with EpisodeStore(tmp_path / "s.zarr", "a") as s:
        s.add_episode(_episode(0))
        with pytest.raises(EpisodeDataError, match="observation.state: expected per-step shape"):
            s.add_episode({**_episode(1), "observation.state": np.zeros((5, 4), np.float32)})
        with pytest.raises(EpisodeDataError, match="keys: expected"):
            s.add_episode({"action": np.zeros((5, 2), np.float32)})
        with pytest.raises(EpisodeDataError, match="lengths"):
            s.add_episode({**_episode(1), "action": np.zeros((4, 2), np.float32)})
        assert s.n_episodes == 1


def test_key_escaping_roundtrip(tmp_path):
    assert escape_key("a/b%c.d") == "a%2Fb%25c.d"
    assert unescape_key(escape_key("a/b%c.d")) == "a/b%c.d"
    with EpisodeStore(tmp_path / "s.zarr", "a") as s:
        s.add_episode({"weird/key": np.ones((2, 1), np.float32), "action": np.zeros((2, 1), np.float32)})
        assert "weird/key" in s.keys
        assert s.get_episode(0)["weird/key"].sum() == 2.0


def test_format2_write_and_diffusion_policy_buffer(tmp_path):
    with EpisodeStore(tmp_path / "v2.zarr", "w", zarr_format=2) as s:
        s.add_episode(_episode(0), EpisodeMeta(task="t", success=True))
    s = EpisodeStore(tmp_path / "v2.zarr")
    assert s.zarr_format == 2 and (tmp_path / "v2.zarr" / ".zgroup").exists()
    assert s.episode_meta(0).success is True
    # a replay buffer as diffusion_policy writes it (zarr v2: data/<key>, meta/episode_ends only)
    root = zarr.open_group(str(tmp_path / "pusht.zarr"), mode="w", zarr_format=2)
    root.create_array("data/action", data=np.arange(20, dtype=np.float32).reshape(10, 2))
    root.create_array("data/img", data=np.zeros((10, 8, 8, 3), np.float32))
    root.create_array("meta/episode_ends", data=np.array([4, 10], np.int64))
    s = EpisodeStore(tmp_path / "pusht.zarr")
    assert s.n_episodes == 2 and s.keys == ["action", "img"]
    np.testing.assert_array_equal(s.get_episode(1)["action"][0], [8, 9])
    assert s.episode_meta(1) == EpisodeMeta()
    with EpisodeStore(tmp_path / "pusht.zarr", "a") as s:  # appending adds our metadata; old = unknown
        s.add_episode(
            {
                "action": np.ones((2, 2), np.float32),
                "img": np.ones((2, 8, 8, 3), np.float32),
                "reward": np.ones(2, np.float32),
                "done": np.array([False, True]),
            },
            EpisodeMeta(success=True),
        )
    s = EpisodeStore(tmp_path / "pusht.zarr")
    assert [m.success for m in s.all_meta()] == [None, None, True]


def test_zipped_v2_buffer_reads(tmp_path):
    """diffusion_policy distributes replay buffers as zipped zarr v2 directories (``*.zarr.zip``)."""
    import shutil

    root = zarr.open_group(str(tmp_path / "buf.zarr"), mode="w", zarr_format=2)
    root.create_array("data/action", data=np.arange(6, dtype=np.float32).reshape(3, 2))
    root.create_array("meta/episode_ends", data=np.array([1, 3], np.int64))
    shutil.make_archive(str(tmp_path / "buf.zarr"), "zip", root_dir=tmp_path / "buf.zarr")
    s = EpisodeStore(tmp_path / "buf.zarr.zip")
    assert s.zarr_format == 2 and s.n_episodes == 2
    np.testing.assert_array_equal(s.get_episode(1)["action"], [[2, 3], [4, 5]])


def test_torn_commit_is_invisible(tmp_path):
    """Killed between growing episode_ends and writing it: the fill value 0 entry is not an episode."""
    path = tmp_path / "s.zarr"
    with EpisodeStore(path, "a") as s:
        s.add_episode(_episode(0))
    root = zarr.open_group(str(path), mode="r+")
    root["data/action"].resize((8, 2))
    root["meta/episode_ends"].resize((2,))
    assert EpisodeStore(path).n_episodes == 1
    with EpisodeStore(path, "a") as s:
        assert s.array("action").shape[0] == 5  # partial tail truncated
        s.add_episode(_episode(1))
    np.testing.assert_array_equal(EpisodeStore(path).episode_ends, [5, 10])


_KILL_CHILD = textwrap.dedent("""
    import sys, time, numpy as np
    from policylink.data import buffer
    from policylink.data.buffer import EpisodeStore
    path, mode, k = sys.argv[1], sys.argv[2], int(sys.argv[3])
    s = EpisodeStore(path, "a")
    if mode == "mid":
        orig = EpisodeStore._vocab_index
        def hang(self, field, word):   # data of episode k is written, not committed yet
            if self.n_episodes == k:
                print("MID", flush=True)
                time.sleep(60)
            return orig(self, field, word)
        EpisodeStore._vocab_index = hang
    i = 0
    while True:
        t = 3 + i % 5
        s.add_episode({"x": np.full((t, 2), i, np.float32), "action": np.full((t, 1), i, np.float32)})
        print("COMMITTED", i, flush=True)
        i += 1
""")


def _check_intact(path, n_min):
    s = EpisodeStore(path)
    assert s.n_episodes >= n_min
    for i in range(s.n_episodes):
        ep = s.get_episode(i)
        assert len(ep["x"]) == 3 + i % 5
        assert np.all(ep["x"] == i) and np.all(ep["action"] == i)
    return s.n_episodes


@pytest.mark.parametrize("mode", ["mid", "random"])
def test_sigkill_leaves_committed_episodes(tmp_path, mode):
    path = tmp_path / "s.zarr"
    k = 3
    proc = subprocess.Popen(
        [sys.executable, "-c", _KILL_CHILD, str(path), mode, str(k)], stdout=subprocess.PIPE, text=True
    )
    committed = -1
    try:
        for line in proc.stdout:
            if line.startswith("COMMITTED"):
                committed = int(line.split()[1])
                if mode == "random" and committed >= 2:
                    time.sleep(np.random.default_rng().uniform(0, 0.2))
                    break
            if line.startswith("MID"):
                break
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    n = _check_intact(path, committed + 1)
    if mode == "mid":
        assert n == k and committed == k - 1
        assert EpisodeStore(path).array("x").shape[0] > EpisodeStore(path).n_steps  # uncommitted tail exists
    with EpisodeStore(path, "a") as s:  # reopen for append: the tail is dropped, appends continue
        assert s.array("x").shape[0] == s.n_steps
        s.add_episode({"x": np.full((3 + n % 5, 2), n, np.float32), "action": np.full((3 + n % 5, 1), n, np.float32)})
    assert _check_intact(path, n + 1) == n + 1
    assert not list(path.rglob("*.partial"))


def test_second_writer_is_refused(tmp_path):
    path = tmp_path / "s.zarr"
    first = EpisodeStore(path, "a")
    with pytest.raises(StoreLockedError, match="only one writer"):
        EpisodeStore(path, "a")
    assert EpisodeStore(path, "r").n_episodes == 0  # readers are never blocked
    first.close()
    with EpisodeStore(path, "a") as s:
        s.add_episode(_episode(0))


_WRITER = textwrap.dedent("""
    import sys, numpy as np
    from policylink.data.buffer import EpisodeStore
    from policylink.data.episode_meta import EpisodeMeta
    path, w = sys.argv[1], int(sys.argv[2])
    with EpisodeStore(path, "a", lock_timeout=60) as s:
        for j in range(3):
            s.add_episode({"x": np.full((4, 1), w, np.float32), "action": np.full((4, 1), j, np.float32)},
                          EpisodeMeta(quality=f"writer{w}"))
""")


def test_four_concurrent_writers_serialize(tmp_path):
    path = tmp_path / "s.zarr"
    procs = [subprocess.Popen([sys.executable, "-c", _WRITER, str(path), str(w)]) for w in range(1, 5)]
    assert [p.wait(timeout=120) for p in procs] == [0, 0, 0, 0]
    s = EpisodeStore(path)
    assert s.n_episodes == 12 and s.n_steps == 48
    x = s.load(["x"])["x"]
    assert float(x.sum()) == 120.0  # writer w adds 3 episodes x 4 steps of value w: 12 * (1+2+3+4)
    # never interleaved: each writer's 3 episodes are consecutive and tagged by it
    writers = [int(s.get_episode(i)["x"][0, 0]) for i in range(12)]
    assert all(writers[i] == writers[i - i % 3] for i in range(12))
    assert sorted(set(writers)) == [1, 2, 3, 4]
    assert all(s.episode_meta(i).quality == f"writer{writers[i]}" for i in range(12))


def test_non_store_paths_are_refused(tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "notes.txt").write_text("hello")
    (tmp_path / "photos").mkdir()
    (tmp_path / "photos" / "a.jpg").write_bytes(b"x")
    for p in ("empty", "notes.txt"):
        with pytest.raises(StoreError) as e:
            EpisodeStore(tmp_path / p)
        assert str(e.value) == f"{tmp_path / p}: not an episode store (expected data/ and meta/episode_ends)"
    for mode in ("a", "w"):  # never writes into (or wipes) a folder or file that is not a store
        with pytest.raises(StoreError, match="not an episode store"):
            EpisodeStore(tmp_path / "photos", mode)
        with pytest.raises(StoreError, match="not an episode store"):
            EpisodeStore(tmp_path / "notes.txt", mode)
    assert (tmp_path / "photos" / "a.jpg").read_bytes() == b"x" and (tmp_path / "notes.txt").read_text() == "hello"


def test_missing_meta_is_an_error_not_empty(tmp_path):
    import shutil

    path = tmp_path / "s.zarr"
    with EpisodeStore(path, "a") as s:
        s.add_episode(_episode(0))
    shutil.rmtree(path / "meta")
    for mode in ("r", "a"):  # appending would truncate the data to 0 episodes: refused too
        with pytest.raises(StoreError, match=r"not an episode store .*no meta/episode_ends"):
            EpisodeStore(path, mode)
    assert zarr.open_group(str(path), mode="r")["data/action"].shape == (5, 2)


def test_corrupted_chunk_names_array_and_store(tmp_path):
    path = tmp_path / "s.zarr"
    with EpisodeStore(path, "a") as s:
        s.add_episode(_episode(0))
    (path / "data" / "observation.state" / "c" / "0" / "0").write_bytes(b"garbage")
    s = EpisodeStore(path)
    np.testing.assert_array_equal(s.get_episode(0, ["reward"])["reward"], np.zeros(5))  # other arrays still read
    with pytest.raises(StoreError, match=rf"^{path}: cannot read data/observation.state rows 0:5 \(corrupted chunk"):
        s.get_episode(0)
    with pytest.raises(StoreError, match="cannot read data/observation.state"):
        s.load(["observation.state"])
    (path / "meta" / "episode_ends" / "zarr.json").write_text("{")
    with pytest.raises(StoreError, match=rf"^{path}: cannot open the episode store \(JSONDecodeError"):
        EpisodeStore(path)


def test_locked_error_names_holder_and_remedy(tmp_path):
    path = tmp_path / "s.zarr"
    with EpisodeStore(path, "a"):
        with pytest.raises(StoreLockedError) as e:
            EpisodeStore(path, "a")
        assert (tmp_path / "s.zarr.lock.owner").exists()
    msg = str(e.value)
    assert msg.startswith(f"{path}: being written by pid {os.getpid()} on ")
    assert f"it holds the lock {path}.lock" in msg and "--lock_timeout SECONDS" in msg
    assert not (tmp_path / "s.zarr.lock.owner").exists()  # released: the holder's note is gone
