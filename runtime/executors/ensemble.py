"""Temporal ensembling (ACT, Zhao et al. 2023, "Learning Fine-Grained Bimanual Manipulation with Low-Cost
Hardware", arXiv 2304.13705, section 3.3): query the policy every step and execute a weighted average of every
prediction made for the current step, with weights ``w_i = exp(-m * i)`` where ``i = 0`` is the oldest
prediction."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from policylink.runtime.executors.base import ChunkExecutor


class TemporalEnsembleExecutor(ChunkExecutor):
    """Running weighted average over overlapping chunks, per episode.

    The queue row holds the blend (float64 ``(H, A)``) and is installed with ``limit = p``, so every row plans
    every ``p`` steps: ``p = config.n_action_steps``, ``None`` = 1 (every step, as ACT); a longer query period
    blends fewer, older predictions at ``1 / p`` of the policy calls. Blend position ``j`` (counted from the
    next action) holds every prediction for step ``t + j``; after ``k`` predictions its value is
    ``sum_i w_i a_i / sum_i w_i`` over ``i = 0..k-1`` (oldest first), updated incrementally:
    ``x <- (x * W_{k-1} + w_k a_k) / W_k`` with ``W_k = sum_{i<=k} w_i`` (as LeRobot's ``ACTTemporalEnsembler``).
    With ``p = 1`` and constant chunks ``c_t`` predicted at step ``t`` the executed action at step ``t`` is
    ``sum_{i<n} w_i c_{t-n+1+i} / sum_{i<n} w_i``, ``n = min(t + 1, H)``. :meth:`truncate` and :meth:`replan`
    drop a row's blend: its next action comes from new predictions only.

    Each query is one inference; simulated latency adds ``d`` stall steps per inference.
    """

    _queue_dtype = np.float64

    def act(self, obs_batch: Mapping[str, Any]) -> np.ndarray:
        """Return float32 ``(B, A)``: the ensembled action for the current step of each episode."""
        self._begin_step(obs_batch)
        self._plan_rows(np.flatnonzero(self.queue.needs_plan()))
        return self._end_step(self.queue.pop())

    def _install(self, ids: np.ndarray, chunk: np.ndarray, offset: int) -> None:
        # replan() truncates first, so a chunk installed past index 0 never meets an earlier blend
        h = self.chunk_size
        prev, have = self.queue.remaining(ids)  # (B', H, A), (B', H): the blend from the next action on
        pos = np.minimum(self.queue.offset[ids][:, None] + np.arange(h)[None], h - 1)
        k = np.where(have, self._count[ids[:, None], pos], 0)  # (B', H) predictions already blended
        prev_total = self._cum[np.maximum(k - 1, 0)][..., None]
        new_total = self._cum[k][..., None]
        chunk = chunk.astype(np.float64)
        blended = (prev * prev_total + chunk * self._w[k][..., None]) / new_total
        period = int(self.config.n_action_steps or 1)
        self.queue.install(ids, np.where((k == 0)[..., None], chunk, blended), offset=offset, limit=offset + period)
        self._count[ids] = k + 1

    def _allocate(self, batch_size: int) -> None:
        h = self.chunk_size
        self._w = np.exp(-self.config.ensemble_m * np.arange(h + 1, dtype=np.float64))
        self._cum = np.cumsum(self._w)
        self._count = np.zeros((batch_size, h), np.int64)
