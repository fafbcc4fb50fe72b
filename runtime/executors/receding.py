"""Receding-horizon execution (Diffusion Policy, Chi et al. 2023, arXiv 2303.04137): execute the first
``n_action_steps`` of each predicted chunk, then re-plan from a fresh observation."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from policylink.runtime.executors.base import ChunkExecutor


class RecedingHorizonExecutor(ChunkExecutor):
    """Each row executes ``n_action_steps`` of its chunk, then re-plans; only the rows that need a plan are
    inferred (``predict_action_chunk(env_ids=rows)``), the others keep their chunk.

    Every step the observation goes to the policy (so its history window stays complete). The whole chunk is
    kept in the queue (``limit = n_action_steps``), so a caller can look past the executed part. With simulated
    latency ``d``, each plan pauses the rows it serves for ``d`` steps, counted in ``stall_steps`` (the
    environment does not advance while a synchronous robot waits).
    """

    def act(self, obs_batch: Mapping[str, Any]) -> np.ndarray:
        """Return float32 ``(B, A)``: the next queued action of each episode (planning rows that need it)."""
        self._begin_step(obs_batch)
        need = np.flatnonzero(self.queue.needs_plan())
        if need.size:
            self._plan_rows(need)
        return self._end_step(self.queue.pop())

    def _install(self, ids: np.ndarray, chunk: np.ndarray, offset: int) -> None:
        self.queue.install(ids, chunk, offset=offset, limit=self.n_action_steps)
