"""Receding-horizon execution (Diffusion Policy, Chi et al. 2023): execute the first ``n_action_steps`` of
each predicted chunk, then re-plan from a fresh observation."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from policylink.runtime.executors.base import ChunkExecutor


class RecedingHorizonExecutor(ChunkExecutor):
    """Queue of ``n_action_steps`` actions per episode; a row re-plans when its queue is empty.

    Every step the observation goes to the policy (so its history window stays complete). When any row needs
    a plan, the policy predicts ``(B, H, A)`` and only the rows that need one take their row; the others keep
    their queue. With simulated latency ``d``, each re-plan pauses that episode for ``d`` steps, which are
    counted in ``stall_steps`` (the environment does not advance while a synchronous robot waits).
    """

    def act(self, obs_batch: Mapping[str, Any]) -> np.ndarray:
        """Return float32 ``(B, A)``: the next queued action of each episode (re-planning empty queues)."""
        b = self._ensure_batch(obs_batch)
        self.policy.update_observation(obs_batch)
        need = self._index >= self.n_action_steps
        if need.any():
            chunk = self.policy.predict_action_chunk()
            self._queue[need] = chunk[need, : self.n_action_steps]
            self._index[need] = 0
            self.inferences[need] += 1
            self.stall_steps[need] += self._latency()
        rows = np.arange(b)
        action = self._queue[rows, self._index].copy()
        self._index += 1
        return action

    def _allocate(self, batch_size: int) -> None:
        self._queue = np.zeros((batch_size, self.n_action_steps, self.policy.spec.action.dim), np.float32)
        self._index = np.full(batch_size, self.n_action_steps, dtype=np.int64)

    def _reset_all(self) -> None:
        self._queue = self._index = None

    def _reset_rows(self, ids: np.ndarray) -> None:
        self._queue[ids] = 0.0
        self._index[ids] = self.n_action_steps
