"""The action-chunk executor interface: one ``act(obs) -> (B, A)`` call per control step, chosen by config.

An executor sits between an environment loop and a :class:`~policylink.adapters.policy.PolicyAdapter`: it
feeds each observation to the policy, decides when to ask for a new chunk, and picks the action to execute
now. Episodes are independent rows: ``reset(env_ids)`` clears only those rows.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import numpy as np

from policylink.adapters.policy import PolicyAdapter
from policylink.adapters.schema import TASK_KEY
from policylink.runtime.executors.latency import LatencyConfig


class ExecutorKind(StrEnum):
    """How chunks are executed.

    - ``receding_horizon``: run ``n_action_steps`` of each chunk, then re-plan (Diffusion Policy).
    - ``temporal_ensemble``: query every step, average overlapping predictions (ACT, Zhao et al. 2023).
    - ``async``: infer the next chunk in a background thread while the current one executes; with guided
      sampling, real-time chunking (Black et al. 2025).
    """

    RECEDING_HORIZON = "receding_horizon"
    TEMPORAL_ENSEMBLE = "temporal_ensemble"
    ASYNC = "async"


class ExecutorConfigError(ValueError):
    """An executor config that the policy's horizons cannot provide; the message names the field."""


@dataclass(frozen=True)
class ExecutorConfig:
    """Configuration of chunk execution (one frozen dataclass for every executor kind).

    Attributes:
        kind: an :class:`ExecutorKind` value (``"receding_horizon"``, ``"temporal_ensemble"``, ``"async"``).
        n_action_steps: actions executed from each chunk before re-planning (receding horizon), or the
            inference period ``s`` in steps (async); ``None`` takes the policy's ``spec.n_action_steps``.
        ensemble_m: temporal-ensembling decay ``m`` in ``w_i = exp(-m * i)``, ``i = 0`` the oldest prediction
            (ACT uses 0.01); 1/step.
        latency: simulated inference delay in control steps (:class:`LatencyConfig`); synchronous
            executors pause the episode for it (counted in ``stall_steps``), async ones keep executing.
        rtc: use real-time chunking guidance when the policy offers ``sample(obs, guidance=fn)``.
        rtc_max_guidance: RTC's guidance weight clip ``beta`` (5 in the paper).
    """

    kind: str = ExecutorKind.RECEDING_HORIZON.value
    n_action_steps: int | None = None
    ensemble_m: float = 0.01
    latency: LatencyConfig = field(default_factory=LatencyConfig)
    rtc: bool = True
    rtc_max_guidance: float = 5.0

    def __post_init__(self) -> None:
        try:
            ExecutorKind(self.kind)
        except ValueError:
            raise ExecutorConfigError(
                f"executor.kind: expected one of {[k.value for k in ExecutorKind]}, received {self.kind!r}"
            ) from None
        if self.n_action_steps is not None and int(self.n_action_steps) < 1:
            raise ExecutorConfigError(
                f"executor.n_action_steps: expected >= 1 (or None), received {self.n_action_steps}"
            )
        if not math.isfinite(self.ensemble_m):
            raise ExecutorConfigError(f"executor.ensemble_m: expected a finite number, received {self.ensemble_m}")
        if not self.rtc_max_guidance > 0:
            raise ExecutorConfigError(f"executor.rtc_max_guidance: expected > 0, received {self.rtc_max_guidance}")


class ChunkExecutor(ABC):
    """Base class: turns a chunk policy into one action per control step for ``B`` parallel episodes.

    Subclasses implement :meth:`act` and :meth:`_reset_rows`. Per-episode counters (inferences, stall steps)
    are kept per row and cleared by :meth:`reset`.

    Args:
        policy: the policy; its ``spec.chunk_size`` is ``H``.
        config: the :class:`ExecutorConfig`.

    Raises:
        ExecutorConfigError: ``n_action_steps`` (or the latency) is more than ``H`` can provide.
    """

    def __init__(self, policy: PolicyAdapter, config: ExecutorConfig):
        self.policy = policy
        self.config = config
        self.chunk_size = int(policy.spec.chunk_size)
        self.n_action_steps = int(config.n_action_steps or policy.spec.n_action_steps)
        problems = executor_problems(policy.spec, config)
        if problems:
            raise ExecutorConfigError("; ".join(problems))
        self._latency = config.latency.sampler()
        self.batch_size: int | None = None
        self.inferences = np.zeros(0, dtype=np.int64)
        self.stall_steps = np.zeros(0, dtype=np.int64)

    @abstractmethod
    def act(self, obs_batch: Mapping[str, Any]) -> np.ndarray:
        """Feed one observation per episode (arrays ``(B, ...)``, ``task`` list of ``B`` str) and return the
        float32 ``(B, A)`` actions to execute now, in the ActionSpec's units."""

    def reset(self, env_ids: Sequence[int] | None = None) -> None:
        """Start new episodes in rows ``env_ids`` (``None`` = all): their queued actions, policy history and
        counters are cleared; other rows are untouched.

        Raises:
            IndexError: an id outside ``[0, B)``.
        """
        if env_ids is None or self.batch_size is None:
            self.policy.reset(None)
            self.batch_size = None
            self._reset_all()
            return
        ids = np.asarray(list(env_ids), dtype=np.int64)
        if ids.size and (ids.min() < 0 or ids.max() >= self.batch_size):
            raise IndexError(f"env_ids: expected indices in [0, {self.batch_size}), received {ids.tolist()}")
        self._reset_policy_rows(ids)
        self.inferences[ids] = 0
        self.stall_steps[ids] = 0
        self._reset_rows(ids)

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release background resources (threads); a no-op for synchronous executors."""

    def _reset_policy_rows(self, ids: np.ndarray) -> None:
        self.policy.reset(ids.tolist())

    def _ensure_batch(self, obs_batch: Mapping[str, Any]) -> int:
        b = batch_size_of(obs_batch)
        if self.batch_size is None:
            self.batch_size = b
            self.inferences = np.zeros(b, dtype=np.int64)
            self.stall_steps = np.zeros(b, dtype=np.int64)
            self._allocate(b)
        elif b != self.batch_size:
            raise ValueError(
                f"observation batch size: expected {self.batch_size} (as before), received {b}; "
                "call reset() to change it"
            )
        return b

    @abstractmethod
    def _allocate(self, batch_size: int) -> None:
        """Create per-row buffers for ``batch_size`` episodes."""

    @abstractmethod
    def _reset_all(self) -> None:
        """Forget every row (the next ``act`` allocates again)."""

    @abstractmethod
    def _reset_rows(self, ids: np.ndarray) -> None:
        """Clear queued actions of rows ``ids``."""


def batch_size_of(obs_batch: Mapping[str, Any]) -> int:
    """``B`` of an observation batch: the leading dim of its arrays (or the length of ``task``).

    Raises:
        ValueError: the batch holds no feature.
    """
    for key, value in obs_batch.items():
        if key != TASK_KEY:
            return int(np.shape(value)[0])
    if TASK_KEY in obs_batch:
        return len(obs_batch[TASK_KEY])
    raise ValueError("observation batch: expected at least one feature, received none")


def executor_problems(spec: Any, config: ExecutorConfig) -> list[str]:
    """Every reason ``config`` cannot run a policy with PolicySpec ``spec`` (empty when it can), so callers can
    reject a (policy, executor) pair before loading envs or starting episodes.

    Checks ``n_action_steps <= chunk_size`` (every kind) and, for ``async`` with simulated latency, RTC's
    ``d <= s`` and ``s + d <= H`` (``d`` the largest delay, ``s`` the inference period, ``H`` the chunk size).

    Args:
        spec: the policy's :class:`~policylink.adapters.schema.PolicySpec` (``chunk_size``, ``n_action_steps``).
        config: the :class:`ExecutorConfig`.
    """
    h = int(spec.chunk_size)
    s = int(config.n_action_steps or spec.n_action_steps)
    if s > h:
        return [f"executor.n_action_steps: expected <= the policy's chunk_size ({h}), received {s}"]
    lat = config.latency
    if config.kind != ExecutorKind.ASYNC.value or not lat.simulated:
        return []
    if lat.max_steps > s:
        return [f"executor.latency: expected a delay <= n_action_steps ({s}) steps, received up to {lat.max_steps}"]
    if s + lat.max_steps > h:
        return [f"executor.n_action_steps + latency: expected <= chunk_size ({h}), received {s} + {lat.max_steps}"]
    return []
