"""Single-writer lock of an episode store: ``<store>.lock`` held with ``filelock`` (released by the OS when the
holder dies) plus ``<store>.lock.owner``, a JSON note of who holds it, so a refused writer can name the holder;
and the clean-up of what a killed writer leaves beside a store (:func:`remove_stale_temporaries`)."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import sys
import time
from pathlib import Path


class WriteLock:
    """Exclusive, inter-process write lock of the store at ``path``.

    Args:
        path: the store's directory; the lock is ``<path>.lock`` and the holder's note ``<path>.lock.owner``.
    """

    def __init__(self, path: str | os.PathLike):
        import filelock

        path = Path(path)
        self.lock_path = path.with_name(path.name + ".lock")
        self.owner_path = path.with_name(path.name + ".lock.owner")
        self._lock = filelock.FileLock(str(self.lock_path))

    def acquire(self, timeout: float) -> None:
        """Take the lock, waiting up to ``timeout`` s (0 = fail at once; -1 = forever), and record the holder.

        Raises:
            TimeoutError: another process holds the lock (message: :meth:`holder`).
        """
        import filelock

        self.lock_path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._lock.acquire(timeout=timeout)
        except filelock.Timeout:
            raise TimeoutError(self.holder()) from None
        note = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.strftime("%Y-%m-%d %H:%M:%S")}
        note["command"] = " ".join(sys.argv)[:200]
        tmp = self.owner_path.with_name(self.owner_path.name + f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(note))
        os.replace(tmp, self.owner_path)

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
        """Remove the holder's note and release the lock."""
        self.owner_path.unlink(missing_ok=True)
        self._lock.release()


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
    processes are kept. The store's own ``<name>.lock.owner`` note is removed when its pid is dead (the
    ``<name>.lock`` file itself stays: filelock keeps it between holders).

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


__all__ = ["WriteLock", "pid_alive", "remove_stale_temporaries"]
