"""The store's write lock (data/lock.py): a clean release leaves no file beside the store, a killed holder's lock
is released by the OS (its file stays until the next writer releases), and an acquirer that locked a file its
previous holder had just removed does not count itself the holder."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from policylink.data import lock as lock_mod
from policylink.data.buffer import EpisodeStore, StoreLockedError
from policylink.data.lock import WriteLock


def test_a_clean_release_removes_the_lock_file_and_the_note(tmp_path):
    path = tmp_path / "s.zarr"
    with EpisodeStore(path, "a") as s:
        s.add_episode({"action": np.zeros((3, 1), np.float32)})
        assert sorted(p.name for p in tmp_path.iterdir()) == ["s.zarr", "s.zarr.lock", "s.zarr.lock.owner"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.zarr"]
    with EpisodeStore(path, "a") as s:  # and the next writer takes it again
        s.add_episode({"action": np.zeros((3, 1), np.float32)})
        with pytest.raises(StoreLockedError, match="only one writer"):
            EpisodeStore(path, "a")
    assert EpisodeStore(path).n_episodes == 2 and sorted(p.name for p in tmp_path.iterdir()) == ["s.zarr"]
    lock = WriteLock(path)
    lock.release()  # never acquired: nothing to do
    lock.acquire(0)
    lock.release()
    lock.release()  # idempotent
    assert not lock.lock_path.exists()


_HOLD = textwrap.dedent("""
    import sys, time
    from policylink.data.lock import WriteLock
    WriteLock(sys.argv[1]).acquire(0)
    print("HELD", flush=True)
    time.sleep(120)
""")


def test_a_killed_holder_releases_the_lock_and_the_next_writer_removes_its_file(tmp_path):
    path = tmp_path / "s.zarr"
    proc = subprocess.Popen([sys.executable, "-c", _HOLD, str(path)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "HELD"
        with pytest.raises(TimeoutError, match=rf"^pid {proc.pid} on "):
            WriteLock(path).acquire(0)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    assert (tmp_path / "s.zarr.lock").exists()  # a crash leaves the file (and the note): the OS dropped the lock
    lock = WriteLock(path)
    lock.acquire(0)
    lock.release()
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_an_acquirer_that_locked_the_removed_file_takes_the_new_one(tmp_path, monkeypatch):
    """The race removing the file opens: B opens ``s.zarr.lock``, A (the holder) releases and removes it, B's
    ``flock`` then succeeds on the removed file. B must not hold that one (a C would create and lock a new file):
    it lets it go and locks the file the path names."""
    path = tmp_path / "s.zarr"
    a, b = WriteLock(path), WriteLock(path)
    a.acquire(0)
    real_open, opened = os.open, []

    def open_then_holder_releases(file, *args, **kwargs):
        fd = real_open(file, *args, **kwargs)
        if str(file) == str(a.lock_path):
            opened.append(fd)
            if len(opened) == 1:
                a.release()  # between B's open and B's flock
        return fd

    with monkeypatch.context() as m:
        m.setattr(lock_mod.os, "open", open_then_holder_releases)
        b.acquire(0)
    assert len(opened) == 2  # the removed file was let go, the new one locked
    assert os.path.samestat(os.fstat(b._fd), os.stat(b.lock_path))
    with pytest.raises(TimeoutError):
        WriteLock(path).acquire(0)  # a third is refused: B holds the file the path names
    b.release()
    assert not b.lock_path.exists()


def test_a_forked_child_releasing_its_copy_leaves_the_parent_holding_the_lock(tmp_path):
    path = tmp_path / "s.zarr"
    lock = WriteLock(path)
    lock.acquire(0)
    pid = os.fork()
    if pid == 0:  # the child: what a worker forked by a recording process does when it tears its copy down
        lock.release()
        os._exit(0)
    assert os.waitpid(pid, 0)[1] == 0
    assert lock.lock_path.exists() and lock.owner_path.exists()
    with pytest.raises(TimeoutError, match=rf"^pid {os.getpid()} on "):
        WriteLock(path).acquire(0)
    lock.release()
    assert not lock.lock_path.exists()


def test_the_owner_note_shows_the_command_once():
    """The CLI sets argv[0] to 'policylink record' while argv[1] is still 'record' (the note showed it twice)."""
    cmd = lock_mod.command_line(["policylink record", "record", "--env", "push", "--out", "a.zarr"])
    assert cmd == "policylink record --env push --out a.zarr"
    assert lock_mod.command_line(["/venv/bin/policylink", "record", "--env"]) == "/venv/bin/policylink record --env"
    assert lock_mod.command_line(["python", "python"]) == "python python"  # one word: not the CLI's prog
