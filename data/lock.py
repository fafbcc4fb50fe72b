"""Single-writer lock of an episode store: ``<store>.lock`` held with ``filelock`` (released by the OS when the
holder dies) plus ``<store>.lock.owner``, a JSON note of who holds it, so a refused writer can name the holder."""

from __future__ import annotations

import json
import os
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


__all__ = ["WriteLock"]
