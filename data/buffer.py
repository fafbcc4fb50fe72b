"""Crash-safe zarr episode store in diffusion_policy's layout: ``data/<key>`` arrays concatenated over time
plus ``meta/episode_ends``, with per-episode metadata and a single-writer file lock.

Layout (zarr format 3 by default, format 2 on request; both are read)::

    root/
      data/<key>              (N_steps, *shape)  one array per feature, episodes concatenated in time
      data/reward             (N_steps,) float32 per-step reward
      data/done               (N_steps,) bool    True on each episode's last step
      meta/episode_ends       (N_episodes,) int64  exclusive end index of each episode (the commit record)
      meta/episode_success    (N_episodes,) int8   1 success, 0 failure, -1 unknown
      meta/episode_seed       (N_episodes,) int64  reset seed, -1 when none
      meta/episode_task       (N_episodes,) int32  index into attrs["policylink"]["vocab"]["task"]
      meta/episode_source     (N_episodes,) int32  index into vocab "source" (expert / policy / human ...)
      meta/episode_quality    (N_episodes,) int32  index into vocab "quality" (expert / noisy / poor ...)

Key names: contract keys (``observation.state``, ``observation.images.front``, ``action``) are used verbatim
as array names; dots are legal node names in both zarr formats. ``/`` would create a sub-group and ``%`` is
the escape character, so they are percent-encoded (``/`` -> ``%2F``, ``%`` -> ``%25``) on write and decoded
on read. A diffusion_policy replay buffer (``data/``, ``meta/episode_ends`` only) opens as is; its missing
metadata reads as unknown (the per-episode metadata and its coding: :mod:`policylink.data.episode_meta`).

Crash safety: an episode is appended by (1) resizing and writing every ``data/`` array, (2) writing its
metadata, and (3) last, growing ``meta/episode_ends`` -- the commit. zarr's LocalStore writes every file
atomically (temp file + rename), so a killed writer leaves whole files only. Readers trust only the longest
prefix of ``episode_ends`` that is strictly increasing and within the data arrays, so a kill between
resizing and writing ``episode_ends`` (fill value 0) hides the episode too. Reopening for append truncates
every array to that committed prefix. One writer at a time: ``<path>.lock`` (:class:`policylink.data.lock.WriteLock`).

A path that is not an episode store (an empty folder, a file, a zarr group without ``data/`` and
``meta/episode_ends``) raises :class:`StoreError` on open; so does a corrupted chunk on read (the message names
the array and the store), and writing never replaces or fills a folder that is not an episode store.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from policylink.adapters.schema import ACTION_KEY
from policylink.data.episode_meta import (
    META_ARRAYS,
    STRING_FIELDS,
    EpisodeMeta,
    append_meta_codes,
    decode_meta,
    encode_meta,
    read_vocab,
)

REWARD_KEY = "reward"
DONE_KEY = "done"
_ATTRS_KEY = "policylink"
DEFAULT_CHUNK_BYTES = 1 << 18  # 256 KiB uncompressed per chunk: fastest random windows (benchmarks/data_throughput.md)


class StoreError(RuntimeError):
    """Base class of episode-store errors."""


class StoreLockedError(StoreError):
    """Another process holds the store's write lock; only one writer at a time is allowed. The message names the
    holder (pid, host, command) and the lock file."""


class EpisodeDataError(StoreError, ValueError):
    """An episode's arrays do not match the store (missing/extra key, length, shape or dtype)."""


def escape_key(key: str) -> str:
    """Array name for feature ``key``: percent-encode ``%`` and ``/`` (dots are kept)."""
    return key.replace("%", "%25").replace("/", "%2F")


def unescape_key(name: str) -> str:
    """Inverse of :func:`escape_key`."""
    return name.replace("%2F", "/").replace("%25", "%")


class EpisodeStore:
    """An append-only store of episodes on zarr (see the module docstring for the layout).

    Args:
        path: directory of the store (``.zarr``); a ``.zip`` path opens a zipped store read-only.
        mode: ``"r"`` read-only (no lock), ``"a"`` append (created when missing), ``"w"`` create, replacing
            any existing store.
        zarr_format: 3 (default) or 2 when creating; an existing store keeps its format.
        chunk_bytes: target uncompressed bytes per chunk along time when creating arrays.
        lock_timeout: seconds to wait for the write lock (0 = fail at once; -1 = wait forever).

    Raises:
        StoreLockedError: ``mode`` is ``"a"``/``"w"`` and another process holds the write lock.
        FileNotFoundError: ``mode="r"`` and there is no store at ``path``.
        StoreError: ``path`` exists but is not an episode store (``<path>: not an episode store (expected data/
            and meta/episode_ends)``), or its metadata cannot be read.
        ValueError: bad ``mode`` or ``zarr_format``.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        mode: str = "r",
        *,
        zarr_format: int = 3,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        lock_timeout: float = 0.0,
    ):
        import zarr

        if mode not in ("r", "a", "w"):
            raise ValueError(f"mode: expected 'r', 'a' or 'w', received {mode!r}")
        if zarr_format not in (2, 3):
            raise ValueError(f"zarr_format: expected 2 or 3, received {zarr_format!r}")
        self.path = Path(path)
        self.mode = mode
        self.chunk_bytes = int(chunk_bytes)
        self._lock = None
        if mode == "r":
            if not self.path.exists():
                raise FileNotFoundError(f"path: no episode store at {str(self.path)!r}")
            if self.path.suffix == ".zip":
                store = zarr.storage.ZipStore(self.path, mode="r")
            else:
                store = zarr.storage.LocalStore(self.path, read_only=True)
            with self._open_errors():
                self._root = zarr.open_group(store, mode="r")
                self._check_layout(writing=False)
        else:
            self._acquire_lock(lock_timeout)
            try:
                exists = (self.path / "zarr.json").exists() or (self.path / ".zgroup").exists()
                if self.path.exists() and not exists and (not self.path.is_dir() or any(self.path.iterdir())):
                    raise StoreError(self._not_a_store())  # never write into / replace a foreign folder or file
                store = zarr.storage.LocalStore(self.path)
                if exists:
                    with self._open_errors():
                        self._root = zarr.open_group(store, mode="r+")
                        self._check_layout(writing=True)
                if mode == "w" or not exists:
                    self._root = zarr.open_group(store, mode="w", zarr_format=zarr_format)
                    self._root.attrs[_ATTRS_KEY] = {"version": 1, "vocab": {f: [] for f in STRING_FIELDS}}
                meta = self._root.require_group("meta")
                self._root.require_group("data")
                if "episode_ends" not in meta:
                    meta.create_array("episode_ends", shape=(0,), chunks=(4096,), dtype="int64", fill_value=0)
                self._cache_arrays()
                self._truncate_to_committed()
            except BaseException:
                self.close()
                raise
        with self._open_errors():
            self._cache_arrays()
        self._ends = self._committed_ends()

    def _not_a_store(self, detail: str = "") -> str:
        return f"{self.path}: not an episode store (expected data/ and meta/episode_ends{detail})"

    @contextlib.contextmanager
    def _open_errors(self) -> Iterator[None]:
        """Turn zarr's errors on opening (no group, unreadable metadata) into :class:`StoreError`."""
        import zarr

        try:
            yield
        except StoreError:
            raise
        except (zarr.errors.NodeNotFoundError, FileNotFoundError, NotADirectoryError) as e:
            raise StoreError(self._not_a_store()) from e
        except Exception as e:
            raise StoreError(f"{self.path}: cannot open the episode store ({type(e).__name__}: {e})") from e

    def _check_layout(self, writing: bool) -> None:
        """An existing group must hold ``data/`` and ``meta/episode_ends``; a writer may repair a store that was
        interrupted while being created (``data/`` still without arrays)."""
        data = self._root["data"] if "data" in self._root else None
        if data is None and not (writing and not list(self._root.keys())):
            raise StoreError(self._not_a_store("; no data/ group"))
        if "meta" in self._root and "episode_ends" in self._root["meta"]:
            return
        if not writing or (data is not None and list(data.array_keys())):
            raise StoreError(self._not_a_store("; no meta/episode_ends: the episode boundaries are lost"))

    def _read(self, arr: Any, where: str, sel: slice) -> np.ndarray:
        """``arr[sel]`` as numpy; a corrupted chunk raises StoreError naming ``where`` and the store."""
        try:
            return np.asarray(arr[sel])
        except Exception as e:
            raise StoreError(
                f"{self.path}: cannot read {where} rows {sel.start}:{sel.stop} (corrupted chunk?): "
                f"{type(e).__name__}: {e}"
            ) from e

    def _cache_arrays(self) -> None:
        """Array handles by name (zarr group look-ups read metadata from disk on every call)."""
        if "data" not in self._root:
            raise StoreError(self._not_a_store("; no data/ group"))
        self._data_group = self._root["data"]
        self._meta_group = self._root["meta"] if "meta" in self._root else None
        self._data: dict[str, Any] = dict(self._data_group.arrays())
        self._meta: dict[str, Any] = dict(self._meta_group.arrays()) if self._meta_group is not None else {}

    # ---------------------------------------------------------------- properties

    @property
    def zarr_format(self) -> int:
        """2 or 3."""
        return int(self._root.metadata.zarr_format)

    @property
    def n_episodes(self) -> int:
        """Number of committed episodes."""
        return int(len(self._ends))

    @property
    def n_steps(self) -> int:
        """Number of committed steps (frames) over all episodes."""
        return int(self._ends[-1]) if len(self._ends) else 0

    @property
    def episode_ends(self) -> np.ndarray:
        """int64 ``(N_episodes,)`` exclusive end index of each committed episode (a copy)."""
        return self._ends.copy()

    @property
    def episode_lengths(self) -> np.ndarray:
        """int64 ``(N_episodes,)`` steps per episode."""
        return np.diff(self._ends, prepend=0)

    @property
    def keys(self) -> list[str]:
        """Feature keys stored under ``data/`` (unescaped), sorted."""
        return sorted(unescape_key(k) for k in self._data)

    def feature_shape(self, key: str) -> tuple[int, ...]:
        """Per-step shape of ``key`` (without the time dim). Raises KeyError naming the known keys."""
        return tuple(self._array(key).shape[1:])

    def feature_dtype(self, key: str) -> np.dtype:
        """numpy dtype of ``key``. Raises KeyError naming the known keys."""
        return np.dtype(self._array(key).dtype)

    def array(self, key: str) -> Any:
        """The zarr array of ``key`` (``(>= n_steps, *shape)``; rows past :attr:`n_steps` are uncommitted)."""
        return self._array(key)

    @property
    def info(self) -> dict[str, Any]:
        """Dataset-level description kept in the root attributes (``fps`` in Hz, ``env`` name, ``features``:
        key -> FeatureSpec dict, ``action``: ActionSpec dict); empty for a foreign store."""
        return dict(dict(dict(self._root.attrs).get(_ATTRS_KEY, {})).get("info", {}))

    def update_info(self, **fields: Any) -> None:
        """Merge JSON-serialisable ``fields`` into :attr:`info` (e.g. ``fps=10.0``). Raises StoreError read-only."""
        if self.mode == "r":
            raise StoreError(f"store {str(self.path)!r} is open read-only; open it with mode='a' to update info")
        attrs = dict(dict(self._root.attrs).get(_ATTRS_KEY, {"version": 1}))
        attrs["info"] = {**dict(attrs.get("info", {})), **fields}
        self._root.attrs[_ATTRS_KEY] = attrs

    # ---------------------------------------------------------------- reading

    def episode_slice(self, i: int) -> slice:
        """Time slice of episode ``i`` in the concatenated arrays. Raises IndexError."""
        n = self.n_episodes
        if not -n <= i < n:
            raise IndexError(f"episode index: expected in [0, {n}), received {i}")
        i %= n
        start = int(self._ends[i - 1]) if i > 0 else 0
        return slice(start, int(self._ends[i]))

    def get_episode(self, i: int, keys: Sequence[str] | None = None) -> dict[str, np.ndarray]:
        """Arrays of episode ``i``: key -> ``(T_i, *shape)`` numpy array (all keys by default)."""
        s = self.episode_slice(i)
        return {k: self._read(self._array(k), f"data/{k}", s) for k in (keys if keys is not None else self.keys)}

    def load(self, keys: Sequence[str] | None = None) -> dict[str, np.ndarray]:
        """Every committed step of ``keys`` in memory: key -> ``(n_steps, *shape)`` numpy array."""
        s = slice(0, self.n_steps)
        return {k: self._read(self._array(k), f"data/{k}", s) for k in (keys if keys is not None else self.keys)}

    def episode_meta(self, i: int) -> EpisodeMeta:
        """Metadata of episode ``i`` (fields missing in a foreign store read as unknown)."""
        self.episode_slice(i)  # bounds check
        i %= self.n_episodes
        codes = {}
        for name in META_ARRAYS:
            have = name in self._meta and self._meta[name].shape[0] > i
            codes[name] = int(self._read(self._meta[name], f"meta/{name}", slice(i, i + 1))[0]) if have else -1
        return decode_meta(codes, self._vocab())

    def all_meta(self) -> list[EpisodeMeta]:
        """Metadata of every committed episode, in order."""
        return [self.episode_meta(i) for i in range(self.n_episodes)]

    def __len__(self) -> int:
        return self.n_episodes

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        return (self.get_episode(i) for i in range(self.n_episodes))

    # ---------------------------------------------------------------- writing

    def add_episode(self, data: Mapping[str, np.ndarray], meta: EpisodeMeta | None = None) -> int:
        """Append one complete episode and commit it; returns its index.

        Args:
            data: key -> ``(T, *shape)`` array, the same ``T >= 1`` for every key. The first episode fixes the
                store's keys, shapes and dtypes; later ones must match them exactly. ``reward`` (float32
                ``(T,)``) defaults to zeros and ``done`` (bool ``(T,)``) to True on the last step only.
            meta: per-episode metadata (default: unknown).

        Raises:
            StoreError: the store is open read-only.
            EpisodeDataError: lengths differ, ``T == 0``, or keys/shapes/dtypes differ from the store's.
        """
        if self.mode == "r":
            raise StoreError(f"store {str(self.path)!r} is open read-only; open it with mode='a' to append")
        meta = meta or EpisodeMeta()
        data = {k: np.asarray(v) for k, v in data.items()}
        lengths = {k: (v.shape[0] if v.ndim else 0) for k, v in data.items()}
        t = next(iter(lengths.values()), 0)
        if t < 1 or any(n != t for n in lengths.values()):
            raise EpisodeDataError(f"episode lengths: expected the same T >= 1 for every key, received {lengths}")
        if REWARD_KEY not in data:
            data[REWARD_KEY] = np.zeros(t, np.float32)
        if DONE_KEY not in data:
            done = np.zeros(t, bool)
            done[-1] = True
            data[DONE_KEY] = done
        self._backfill_step_arrays(data)
        self._check_episode(data)
        start = self.n_steps
        for k, v in data.items():  # (1) data
            arr = self._array(k) if escape_key(k) in self._data else self._create_array(k, v)
            arr.resize((start + t, *arr.shape[1:]))
            arr[start : start + t] = v
        n = self.n_episodes
        append_meta_codes(self._meta_group, self._meta, n, encode_meta(meta, self._vocab_index))  # (2) metadata
        ends = self._meta["episode_ends"]  # (3) commit
        ends.resize((n + 1,))
        ends[n] = start + t
        self._ends = np.append(self._ends, np.int64(start + t))
        return n

    def close(self) -> None:
        """Release the write lock (reads stay possible). Idempotent."""
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def __enter__(self) -> EpisodeStore:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    def __repr__(self) -> str:
        return (
            f"EpisodeStore({str(self.path)!r}, mode={self.mode!r}, format={self.zarr_format}, "
            f"episodes={self.n_episodes}, steps={self.n_steps}, keys={self.keys})"
        )

    # ---------------------------------------------------------------- helpers

    def _acquire_lock(self, timeout: float) -> None:
        from policylink.data.lock import WriteLock

        lock = WriteLock(self.path)
        try:
            lock.acquire(timeout=timeout)
        except TimeoutError as e:
            raise StoreLockedError(
                f"{self.path}: being written by {e} -- it holds the lock {lock.lock_path} (waited {timeout} s); "
                "only one writer at a time is allowed. Wait for it to finish (or stop it), pass a lock_timeout "
                "(--lock_timeout SECONDS) to wait for it, or write to another path"
            ) from None
        self._lock = lock

    def _array(self, key: str) -> Any:
        name = escape_key(key)
        if name not in self._data:
            raise KeyError(f"feature {key!r}: not in the store; available: {self.keys}")
        return self._data[name]

    def _create_array(self, key: str, v: np.ndarray) -> Any:
        steps = chunk_steps_for(v.shape[1:], v.dtype, self.chunk_bytes)
        arr = self._data_group.create_array(
            escape_key(key),
            shape=(0, *v.shape[1:]),
            chunks=(steps, *v.shape[1:]),
            dtype=v.dtype,
            fill_value=np.zeros((), v.dtype).item(),
        )
        self._data[escape_key(key)] = arr
        return arr

    def _backfill_step_arrays(self, data: Mapping[str, np.ndarray]) -> None:
        """A foreign store (e.g. diffusion_policy's) gains ``reward`` (0) and ``done`` (episode ends) arrays."""
        if not self.keys:
            return
        n = self.n_steps
        for key in (REWARD_KEY, DONE_KEY):
            if escape_key(key) in self._data or key not in data:
                continue
            arr = self._create_array(key, data[key])
            arr.resize((n, *arr.shape[1:]))
            values = np.zeros((n, *arr.shape[1:]), data[key].dtype)
            if key == DONE_KEY and n:
                values[self._ends - 1] = True
            arr[:] = values

    def _check_episode(self, data: Mapping[str, np.ndarray]) -> None:
        have = set(self.keys)
        if not have:  # first episode: it fixes keys, shapes and dtypes
            for k, v in data.items():
                if v.dtype.kind not in "biuf":
                    raise EpisodeDataError(f"{k}: expected a numeric/bool array, received dtype {v.dtype}")
            return
        problems = []
        if set(data) != have:
            problems.append(f"keys: expected {sorted(have)}, received {sorted(data)}")
        for k in set(data) & have:
            arr = self._array(k)
            if tuple(data[k].shape[1:]) != tuple(arr.shape[1:]):
                problems.append(
                    f"{k}: expected per-step shape {tuple(arr.shape[1:])}, received {tuple(data[k].shape[1:])}"
                )
            if data[k].dtype != np.dtype(arr.dtype):
                problems.append(f"{k}: expected dtype {np.dtype(arr.dtype)}, received {data[k].dtype}")
        if problems:
            raise EpisodeDataError("episode does not match the store: " + "; ".join(problems))

    def _vocab(self) -> dict[str, list[str]]:
        return read_vocab(dict(self._root.attrs).get(_ATTRS_KEY, {}))

    def _vocab_index(self, field: str, word: str) -> int:
        vocab = self._vocab()
        if word not in vocab[field]:
            vocab[field].append(word)
            attrs = dict(dict(self._root.attrs).get(_ATTRS_KEY, {"version": 1}))
            attrs["vocab"] = vocab
            self._root.attrs[_ATTRS_KEY] = attrs
        return vocab[field].index(word)

    def _committed_ends(self) -> np.ndarray:
        """Longest valid prefix of ``meta/episode_ends`` (strictly increasing, within every data array)."""
        if "episode_ends" not in self._meta:
            return np.zeros(0, np.int64)
        arr = self._meta["episode_ends"]
        ends = self._read(arr, "meta/episode_ends", slice(0, arr.shape[0])).astype(np.int64)
        lengths = [a.shape[0] for a in self._data.values()]
        limit = min(lengths) if lengths else 0
        ok = (ends > np.concatenate([[0], ends[:-1]])) & (ends <= limit)
        bad = np.flatnonzero(~ok)
        return ends[: bad[0]] if len(bad) else ends

    def _truncate_to_committed(self) -> None:
        """Drop an uncommitted tail left by a killed writer (arrays and metadata) and stray temp files."""
        ends = self._committed_ends()
        n, steps = len(ends), int(ends[-1]) if len(ends) else 0
        for arr in self._data.values():
            if arr.shape[0] != steps:
                arr.resize((steps, *arr.shape[1:]))
        for name in ["episode_ends", *META_ARRAYS]:
            if name in self._meta and self._meta[name].shape[0] != n:
                self._meta[name].resize((n,))
        for p in self.path.rglob("*.partial"):
            p.unlink(missing_ok=True)


def chunk_steps_for(shape: Sequence[int], dtype: Any, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> int:
    """Time steps per chunk for per-step ``shape``/``dtype`` at ``chunk_bytes`` (1 .. 65536)."""
    row = max(1, math.prod(shape) * np.dtype(dtype).itemsize)
    return max(1, min(1 << 16, chunk_bytes // row))


__all__ = [
    "ACTION_KEY",
    "DONE_KEY",
    "REWARD_KEY",
    "EpisodeDataError",
    "EpisodeStore",
    "StoreError",
    "StoreLockedError",
    "chunk_steps_for",
    "escape_key",
    "unescape_key",
]
