"""The per-row action-chunk queue every executor is built on: for each of ``B`` episodes the full chunk, the offset
of the next action, how far into the chunk it may run before re-planning, and tags that make stale plans
detectable (a reset, a truncation or a newer plan)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


class ChunkQueue:
    """Full chunks ``(B, H, A)`` with a per-row read offset.

    Per row ``b``:

    - ``chunks[b]``: the whole chunk last installed (index 0 = the action for the step of the observation it was
      planned from); nothing is cut at intake, so a caller can look ahead or extend a plan;
    - ``offset[b]``: index of the next action to execute;
    - ``limit[b]``: chunk index at which the row asks for a new plan (``offset >= limit``); receding horizon
      installs with ``limit = n_action_steps``, temporal ensembling with ``1``, async with ``H`` (it triggers
      on its own schedule);
    - ``valid[b]``: the row holds a chunk (False after :meth:`reset` or :meth:`truncate`: :meth:`pop` refuses
      to read it, so a dropped action can never be executed);
    - ``episode[b]``: incremented by :meth:`reset`;
    - ``epoch[b]``: incremented by every :meth:`install`, :meth:`truncate` and :meth:`reset`; a plan computed
      for epoch ``e`` is stale once ``epoch[b] != e`` (used by the asynchronous executor).

    Args:
        batch_size: ``B``.
        chunk_size: ``H``.
        action_dim: ``A``.
        dtype: storage dtype of the chunks (float32; temporal ensembling keeps float64 running averages).

    Raises:
        ValueError: a non-positive size.
    """

    def __init__(self, batch_size: int, chunk_size: int, action_dim: int, dtype: type = np.float32):
        for name, value in (("batch_size", batch_size), ("chunk_size", chunk_size), ("action_dim", action_dim)):
            if int(value) < 1:
                raise ValueError(f"chunk queue {name}: expected >= 1, received {value}")
        self.batch_size, self.chunk_size, self.action_dim = int(batch_size), int(chunk_size), int(action_dim)
        self.chunks = np.zeros((self.batch_size, self.chunk_size, self.action_dim), dtype)
        self.offset = np.zeros(self.batch_size, np.int64)
        self.limit = np.zeros(self.batch_size, np.int64)
        self.valid = np.zeros(self.batch_size, bool)
        self.episode = np.zeros(self.batch_size, np.int64)
        self.epoch = np.zeros(self.batch_size, np.int64)

    def rows(self, env_ids: Sequence[int] | np.ndarray | None) -> np.ndarray:
        """int64 row indices of ``env_ids`` (``None`` = all rows, in order).

        Raises:
            IndexError: an id outside ``[0, B)``.
        """
        if env_ids is None:
            return np.arange(self.batch_size)
        ids = np.asarray(list(env_ids), dtype=np.int64).reshape(-1)
        if ids.size and (ids.min() < 0 or ids.max() >= self.batch_size):
            raise IndexError(f"env_ids: expected indices in [0, {self.batch_size}), received {ids.tolist()}")
        return ids

    def needs_plan(self) -> np.ndarray:
        """bool ``(B,)``: rows without a chunk or whose offset reached their limit."""
        return ~self.valid | (self.offset >= self.limit)

    def install(self, env_ids: Sequence[int] | np.ndarray, chunks: np.ndarray, offset: int, limit: int) -> None:
        """Give rows ``env_ids`` new chunks ``(len(env_ids), H, A)``, read from index ``offset`` until ``limit``.

        Raises:
            ValueError: wrong chunk shape, or not ``0 <= offset < H`` and ``1 <= limit <= H``.
        """
        ids = self.rows(env_ids)
        chunks = np.asarray(chunks)
        want = (len(ids), self.chunk_size, self.action_dim)
        if chunks.shape != want:
            raise ValueError(f"chunk queue install: expected chunks of shape {want}, received {chunks.shape}")
        if not (0 <= offset < self.chunk_size and 1 <= limit <= self.chunk_size):
            raise ValueError(
                f"chunk queue install: expected 0 <= offset < {self.chunk_size} and 1 <= limit <= "
                f"{self.chunk_size}, received offset={offset}, limit={limit}"
            )
        self.chunks[ids] = chunks
        self.offset[ids] = offset
        self.limit[ids] = limit
        self.valid[ids] = True
        self.epoch[ids] += 1

    def pop(self) -> np.ndarray:
        """``(B, A)`` (the storage dtype): each row's action at its offset; every offset then advances by one.

        Raises:
            RuntimeError: a row holds no chunk (never planned, reset or truncated) or has read past its chunk.
        """
        bad = ~self.valid | (self.offset >= self.chunk_size)
        if bad.any():
            raise RuntimeError(
                f"chunk queue pop: expected every row to hold an unread action, rows {np.flatnonzero(bad).tolist()} "
                "have none (plan them first)"
            )
        action = self.chunks[np.arange(self.batch_size), self.offset].copy()
        self.offset += 1
        return action

    def truncate(self, env_ids: Sequence[int] | np.ndarray | None = None) -> None:
        """Drop the rest of the chunks of rows ``env_ids`` (``None`` = all): none of their actions is executed,
        and the rows need a new plan. Offsets are kept (they say how far the dropped chunks ran)."""
        ids = self.rows(env_ids)
        self.chunks[ids] = 0.0
        self.valid[ids] = False
        self.epoch[ids] += 1

    def reset(self, env_ids: Sequence[int] | np.ndarray | None = None) -> None:
        """New episodes in rows ``env_ids`` (``None`` = all): truncate them, zero their offsets, bump their tag."""
        ids = self.rows(env_ids)
        self.truncate(ids)
        self.offset[ids] = 0
        self.limit[ids] = 0
        self.episode[ids] += 1

    def hold_last(self, env_ids: Sequence[int] | np.ndarray) -> None:
        """Rows ``env_ids`` that read past their chunk repeat its last action (a fallback; callers count it)."""
        ids = self.rows(env_ids)
        self.offset[ids] = np.minimum(self.offset[ids], self.chunk_size - 1)

    def remaining(self, env_ids: Sequence[int] | np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The unread actions of rows ``env_ids`` shifted so that index 0 is the next action.

        Returns:
            ``(actions, valid)``: actions ``(B', H, A)`` (storage dtype; zero where absent) and bool ``(B', H)``,
            True where an unread action exists (all False for rows without a chunk).
        """
        ids = self.rows(env_ids)
        h = self.chunk_size
        pos = self.offset[ids][:, None] + np.arange(h)[None]  # (B', H)
        valid = (pos < h) & self.valid[ids][:, None]
        actions = self.chunks[ids[:, None], np.minimum(pos, h - 1)]
        return np.where(valid[..., None], actions, 0.0).astype(self.chunks.dtype), valid
