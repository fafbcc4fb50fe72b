"""Action-chunk executors: receding horizon, temporal ensembling (ACT) and asynchronous execution with
real-time chunking, behind one interface (:class:`ChunkExecutor`: ``act``, ``reset``, ``truncate``, ``replan``)
chosen by :class:`ExecutorConfig`, all built on one per-row :class:`ChunkQueue`."""

from __future__ import annotations

from policylink.adapters.policy import PolicyAdapter
from policylink.runtime.executors.asynchronous import AsyncExecutor, PolicyStoppedAnswering
from policylink.runtime.executors.base import (
    ChunkExecutor,
    ExecutorConfig,
    ExecutorConfigError,
    ExecutorKind,
    executor_problems,
    request_chunk,
)
from policylink.runtime.executors.corrective import CorrectiveExecutor, CorrectiveLog
from policylink.runtime.executors.ensemble import TemporalEnsembleExecutor
from policylink.runtime.executors.latency import LatencyConfig, LatencyMode
from policylink.runtime.executors.queue import ChunkQueue
from policylink.runtime.executors.receding import RecedingHorizonExecutor
from policylink.runtime.executors.rtc import rtc_weights

__all__ = [
    "AsyncExecutor",
    "ChunkExecutor",
    "ChunkQueue",
    "CorrectiveExecutor",
    "CorrectiveLog",
    "ExecutorConfig",
    "ExecutorConfigError",
    "ExecutorKind",
    "LatencyConfig",
    "LatencyMode",
    "PolicyStoppedAnswering",
    "RecedingHorizonExecutor",
    "TemporalEnsembleExecutor",
    "executor_problems",
    "make_executor",
    "request_chunk",
    "rtc_weights",
]

_KINDS = {
    ExecutorKind.RECEDING_HORIZON: RecedingHorizonExecutor,
    ExecutorKind.TEMPORAL_ENSEMBLE: TemporalEnsembleExecutor,
    ExecutorKind.ASYNC: AsyncExecutor,
    ExecutorKind.CORRECTIVE: CorrectiveExecutor,
}


def make_executor(policy: PolicyAdapter, config: ExecutorConfig | None = None) -> ChunkExecutor:
    """The executor of ``config.kind`` for ``policy`` (default: receding horizon with the policy's horizons).

    Raises:
        ExecutorConfigError: the config asks for more than the policy's chunk can provide.
    """
    config = config or ExecutorConfig()
    return _KINDS[ExecutorKind(config.kind)](policy, config)
