"""Temporal ensembling (ACT, Zhao et al. 2023, "Learning Fine-Grained Bimanual Manipulation with Low-Cost
Hardware", section 3.3): query the policy every step and execute a weighted average of every prediction made
for the current step, with weights ``w_i = exp(-m * i)`` where ``i = 0`` is the oldest prediction."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from policylink.runtime.executors.base import ChunkExecutor


class TemporalEnsembleExecutor(ChunkExecutor):
    """Running weighted average over overlapping chunks, per episode.

    Position ``j`` of the buffer holds the blend of every prediction for step ``t + j``; after ``k``
    predictions its value is ``sum_i w_i a_i / sum_i w_i`` over ``i = 0..k-1`` (oldest first). It is updated
    incrementally: ``x <- (x * W_{k-1} + w_k a_k) / W_k`` with ``W_k = sum_{i<=k} w_i`` (as LeRobot's
    ``ACTTemporalEnsembler``). With constant chunks ``c_t`` predicted at step ``t`` the executed action at
    step ``t`` is ``sum_{i<n} w_i c_{t-n+1+i} / sum_{i<n} w_i``, ``n = min(t + 1, H)``.

    Each step is one inference; simulated latency adds ``d`` stall steps per inference.
    """

    def act(self, obs_batch: Mapping[str, Any]) -> np.ndarray:
        """Return float32 ``(B, A)``: the ensembled action for the current step of each episode."""
        self._ensure_batch(obs_batch)
        self.policy.update_observation(obs_batch)
        chunk = self.policy.predict_action_chunk().astype(np.float64)
        self.inferences += 1
        self.stall_steps += self._latency()
        k = self._count  # (B, H) predictions already blended at each position
        prev_total = self._cum[np.maximum(k - 1, 0)][..., None]
        new_total = self._cum[k][..., None]
        blended = (self._sum * prev_total + chunk * self._w[k][..., None]) / new_total
        self._sum = np.where((k == 0)[..., None], chunk, blended)
        self._count = k + 1
        action = self._sum[:, 0].astype(np.float32)
        self._sum = np.concatenate([self._sum[:, 1:], np.zeros_like(self._sum[:, :1])], axis=1)
        self._count = np.concatenate([self._count[:, 1:], np.zeros_like(self._count[:, :1])], axis=1)
        return action

    def _allocate(self, batch_size: int) -> None:
        h, a = self.chunk_size, self.policy.spec.action.dim
        self._w = np.exp(-self.config.ensemble_m * np.arange(h + 1, dtype=np.float64))
        self._cum = np.cumsum(self._w)
        self._sum = np.zeros((batch_size, h, a), np.float64)
        self._count = np.zeros((batch_size, h), np.int64)

    def _reset_all(self) -> None:
        self._sum = self._count = None

    def _reset_rows(self, ids: np.ndarray) -> None:
        self._sum[ids] = 0.0
        self._count[ids] = 0
