"""Single-writer lock of an episode store: ``<store>.lock`` held with ``flock`` (released by the OS when the holder
dies; the file is removed by a clean release) plus ``<store>.lock.owner``, a JSON note of who holds it, so a refused
writer can name the holder; and the clean-up of what a killed writer leaves beside a store
(:func:`remove_stale_temporaries`)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import socket
import sys
import time
from pathlib import Path
from typing import Any

try:
    import fcntl
except ImportError:  # Windows: filelock's lock instead
    fcntl = None  # type: ignore[assignment]


class WriteLock:
    """Exclusive, inter-process write lock of the store at ``path``: ``flock`` on ``<path>.lock`` (released by the
    OS when the holder dies, however it dies), removed again by a clean :meth:`release`.

    Removing a lock file is safe only with the protocol used here: the holder unlinks the file *before* it
    unlocks, and an acquirer keeps its lock only when the path still names the file it locked (``samestat``);
    one that locked a file the previous holder has just unlinked (it opened it before the unlink) closes it and
    locks the new one. So there is never more than one holder, with or without the file between writers. Where
    ``fcntl`` is missing (Windows) ``filelock`` holds the lock and the file stays.

    Args:
        path: the store's directory; the lock is ``<path>.lock`` and the holder's note ``<path>.lock.owner``.
    """

    POLL_S = 0.05
    """Seconds between two tries while another process holds the lock."""

    def __init__(self, path: str | os.PathLike):
        path = Path(path)
        self.lock_path = path.with_name(path.name + ".lock")
        self.owner_path = path.with_name(path.name + ".lock.owner")
        self._fd: int | None = None  # the locked file's descriptor (fcntl)
        self._pid = 0  # the process that locked it (a forked child inherits the descriptor, not the lock's duty)
        self._fallback: Any = None  # a held filelock.FileLock (no fcntl)

    def acquire(self, timeout: float) -> None:
        """Take the lock, waiting up to ``timeout`` s (0 = fail at once; -1 = forever), and record the holder.

        Raises:
            TimeoutError: another process holds the lock (message: :meth:`holder`).
        """
        self.lock_path.parent.mkdir(parents=True, exist_ok=True)
        if fcntl is None:
            self._acquire_filelock(timeout)
        else:
            deadline = None if timeout < 0 else time.monotonic() + timeout
            while (fd := _try_lock(self.lock_path)) is None:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise TimeoutError(self.holder())
                time.sleep(self.POLL_S if left is None else min(self.POLL_S, left))
            self._fd, self._pid = fd, os.getpid()
        note = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.strftime("%Y-%m-%d %H:%M:%S")}
        note["command"] = command_line()[:200]
        tmp = self.owner_path.with_name(self.owner_path.name + f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(note))
        os.replace(tmp, self.owner_path)

    def _acquire_filelock(self, timeout: float) -> None:
        import filelock

        lock = filelock.FileLock(str(self.lock_path))
        try:
            lock.acquire(timeout=timeout)
        except filelock.Timeout:
            raise TimeoutError(self.holder()) from None
        self._fallback = lock

    def holder(self) -> str:
        """``"pid 123 on host (command 'policylink record ...', since 2025-01-01 12:00:00)"`` or
        ``"an unknown process"`` when the holder left no note."""
        try:
            note = json.loads(self.owner_path.read_text())
            return (
                f"pid {note['pid']} on {note['host']} (command {note.get('command', '?')!r}, "
                f"since {note.get('since', '?')})"
            )
        except (OSError, ValueError, KeyError, TypeError):
            return "an unknown process"

    def release(self) -> None:
        """Remove the holder's note and the lock file (while still holding it: see the class docstring), then
        unlock. Idempotent. In a forked child of the holder it only closes the child's copy of the descriptor
        (``flock`` is shared with the parent, which still holds the lock)."""
        if self._fd is not None and self._pid != os.getpid():
            fd, self._fd = self._fd, None
            os.close(fd)
            return
        if self._fd is None and self._fallback is None:
            return
        self.owner_path.unlink(missing_ok=True)
        if self._fallback is not None:
            self._fallback.release()
            self._fallback = None
            return
        fd, self._fd = self._fd, None
        try:
            with contextlib.suppress(OSError):
                if os.path.samestat(os.fstat(fd), os.stat(self.lock_path)):
                    self.lock_path.unlink()
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)


def command_line(argv: list[str] | None = None) -> str:
    """The command line of this process (``sys.argv`` by default) as its owner note shows it: the CLI sets
    ``argv[0]`` to ``"policylink <command>"`` (argparse's usage) while ``argv[1]`` is still ``<command>``, so a
    repeated word is dropped (``policylink record --env push``, not ``policylink record record --env push``)."""
    argv = list(sys.argv if argv is None else argv)
    if len(argv) > 1 and argv[0].split()[-1:] == [argv[1]] and " " in argv[0]:
        del argv[1]
    return " ".join(argv)


def _try_lock(path: Path) -> int | None:
    """A descriptor of ``path`` holding its exclusive ``flock``, or None while another process holds it. A file
    unlinked by its previous holder between our ``open`` and our ``flock`` is let go and the new one tried."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        except BaseException:
            os.close(fd)
            raise
        try:
            if os.path.samestat(os.fstat(fd), os.stat(path)):
                return fd
        except FileNotFoundError:
            pass
        os.close(fd)  # closing drops the lock on the unlinked file


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists on this host (``os.kill(pid, 0)``; a process of another user counts)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale_temporaries(path: str | os.PathLike, tags: tuple[str, ...], restore: str = "") -> list[Path]:
    """Remove the temporaries that writers killed with SIGKILL left beside the store at ``path``.

    A writer names its temporaries ``.<name>.<tag>-<pid>`` (plus ``.lock`` / ``.lock.owner`` files of its own
    write lock) next to ``<name>``; those whose ``pid`` no longer runs on this host are removed, those of live
    processes are kept. The store's own ``<name>.lock.owner`` note is removed when its pid is dead (a killed
    writer's ``<name>.lock`` file stays: the next writer locks it, and removes it when it releases).

    Args:
        path: the store's path (need not exist).
        tags: the temporary kinds to look for, e.g. ``("merging", "replaced")``.
        restore: a tag among ``tags`` whose stale folder is a backup of the store: when ``path`` is missing (the
            writer died between moving the store aside and moving its output in), the backup is renamed back to
            ``path`` instead of being removed.

    Returns:
        The removed (or restored) temporaries, sorted.
    """
    path = Path(path)
    if not path.parent.is_dir():
        return []
    pattern = re.compile(rf"\.{re.escape(path.name)}\.({'|'.join(map(re.escape, tags))})-(\d+)(\.lock(\.owner)?)?$")
    removed = []
    for p in path.parent.iterdir():
        m = pattern.match(p.name)
        if not m or pid_alive(int(m.group(2))):
            continue
        if restore and m.group(1) == restore and not m.group(3) and not path.exists():
            os.replace(p, path)
        elif p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)
        removed.append(p)
    owner = path.with_name(path.name + ".lock.owner")
    try:
        note = json.loads(owner.read_text())
        if note.get("host") == socket.gethostname() and not pid_alive(int(note["pid"])):
            owner.unlink(missing_ok=True)
            removed.append(owner)
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return sorted(removed)


__all__ = ["WriteLock", "command_line", "pid_alive", "remove_stale_temporaries"]
