"""The action-chunk executor interface: one ``act(obs) -> (B, A)`` call per control step, chosen by config.

An executor sits between an environment loop and a :class:`~policylink.adapters.policy.PolicyAdapter`: it
feeds each observation to the policy, decides which rows need a new chunk, and picks the action to execute
now. Episodes are independent rows: ``reset(env_ids)``, ``truncate(env_ids)`` and ``replan(env_ids)`` touch
only those rows.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from enum import StrEnum
from typing import Any

import numpy as np

from policylink.adapters.capabilities import (
    PREFIX_METHODS,
    ChunkPrefix,
    Guidance,
    GuidanceFn,
    GuidedSampler,
    PrefixConditioned,
)
from policylink.adapters.policy import PolicyAdapter
from policylink.adapters.registry import unknown_name_message
from policylink.adapters.validation import batch_size_of
from policylink.policies.corrector.config import CorrectiveConfig
from policylink.runtime.executors.latency import LatencyConfig
from policylink.runtime.executors.queue import ChunkQueue


class ExecutorKind(StrEnum):
    """How chunks are executed.

    - ``receding_horizon``: run ``n_action_steps`` of each chunk, then re-plan (Diffusion Policy).
    - ``temporal_ensemble``: query every step, average overlapping predictions (ACT, Zhao et al. 2023).
    - ``async``: infer the next chunk on a background inference worker while the current one executes; with a
      :class:`~policylink.adapters.capabilities.PrefixConditioned` policy, real-time chunking (Black et al. 2025).
    """

    RECEDING_HORIZON = "receding_horizon"
    TEMPORAL_ENSEMBLE = "temporal_ensemble"
    ASYNC = "async"
    CORRECTIVE = "corrective"  # receding horizon + latent monitor, truncate and guided replan (issue 16)


class ExecutorConfigError(ValueError):
    """An executor config that the policy's horizons cannot provide; the message names the field."""


@dataclass(frozen=True)
class ExecutorConfig:
    """Configuration of chunk execution (one frozen dataclass for every executor kind).

    Attributes:
        kind: how chunks are executed, an :class:`ExecutorKind` value (``"receding_horizon"``,
            ``"temporal_ensemble"``, ``"async"``, ``"corrective"``).
        n_action_steps: action horizon: actions executed from each chunk before replanning (receding horizon), or the
            inference period ``s`` in steps (async); ``None`` takes the policy's ``spec.n_action_steps``. For
            temporal ensembling the query period in steps, ``None`` = 1 (every step, as ACT).
        ensemble_m: temporal-ensembling decay ``m`` in ``w_i = exp(-m * i)``, ``i = 0`` the oldest prediction
            (ACT uses 0.01); 1/step.
        latency: simulated inference delay in control steps (:class:`LatencyConfig`); synchronous
            executors pause the episode for it (counted in ``stall_steps``), async ones keep executing.
        rtc: use real-time chunking when the policy is
            :class:`~policylink.adapters.capabilities.PrefixConditioned`.
        rtc_max_guidance: RTC's guidance weight clip ``beta`` (5 in the paper).
        rtc_method: how the new chunk is made to agree with the committed actions (``rtc`` on):
            ``"guidance"``: RTC's soft-masked guidance (Black et al. 2025, eq. 2-5: weights ``rtc_weights``, a
            vector-Jacobian product per sampler step, about twice a plain inference); ``"inpaint"``: replacement
            inpainting of the ``d`` actions executed while the chunk is computed (weights ``inpaint_weights``: 1
            for ``i < d``, 0 after; no gradient, the cost of a plain inference, so it adds no delay of its own;
            the hard-masking baseline of the same paper, section 4); ``"condition"``: the same ``d`` actions given
            clean to a policy trained with them (loss ``prefix_conditioned``, training-time action conditioning,
            Black et al. 2025, arXiv 2512.05964; the cost of a plain inference).
    """

    kind: str = ExecutorKind.RECEDING_HORIZON.value
    n_action_steps: int | None = None
    ensemble_m: float = 0.01
    latency: LatencyConfig = field(default_factory=LatencyConfig)
    rtc: bool = True
    rtc_max_guidance: float = 5.0
    rtc_method: str = "guidance"
    corrective: CorrectiveConfig = field(default_factory=CorrectiveConfig)  # kind: corrective (issue 16)

    def __post_init__(self) -> None:
        try:
            ExecutorKind(self.kind)
        except ValueError:
            raise ExecutorConfigError(
                unknown_name_message("executor.kind", self.kind, [k.value for k in ExecutorKind])
            ) from None
        if self.n_action_steps is not None and int(self.n_action_steps) < 1:
            raise ExecutorConfigError(
                f"executor.n_action_steps: expected >= 1 (or None), received {self.n_action_steps}"
            )
        if not math.isfinite(self.ensemble_m):
            raise ExecutorConfigError(f"executor.ensemble_m: expected a finite number, received {self.ensemble_m}")
        if not self.rtc_max_guidance > 0:
            raise ExecutorConfigError(f"executor.rtc_max_guidance: expected > 0, received {self.rtc_max_guidance}")
        if self.rtc_method not in PREFIX_METHODS:
            raise ExecutorConfigError(
                unknown_name_message("executor.rtc_method", self.rtc_method, list(PREFIX_METHODS))
            )
        default = CorrectiveConfig()
        if self.kind != ExecutorKind.CORRECTIVE.value and self.corrective != default:
            names = [f.name for f in fields(default) if getattr(self.corrective, f.name) != getattr(default, f.name)]
            raise ExecutorConfigError(
                f"executor.corrective: options apply to executor.kind 'corrective' only; expected none with kind "
                f"{self.kind!r}, received {', '.join(f'corrective.{n}' for n in names)}"
            )


class ChunkExecutor(ABC):
    """Base class: turns a chunk policy into one action per control step for ``B`` parallel episodes.

    Every executor keeps its chunks in one :class:`~policylink.runtime.executors.queue.ChunkQueue` (``queue``,
    allocated at the first :meth:`act`) and asks the policy only for the rows that need a plan
    (``predict_action_chunk(env_ids=rows)``). Besides :meth:`act` and :meth:`reset` it offers :meth:`truncate`
    and :meth:`replan`, which a monitor calls between steps (the corrective executor, issue 16). Per-episode
    counters (``inferences``: plans installed, ``stall_steps``: simulated steps the episode waited for
    inference) are int64 ``(B,)`` and cleared by :meth:`reset`.

    Subclasses implement :meth:`act` (usually ``_begin_step`` -> plan -> ``_end_step(queue.pop())``) and
    :meth:`_install`; sync executors call the policy directly, the asynchronous one routes every policy call
    through its inference worker by overriding :meth:`_infer` and :meth:`_policy_reset`. An executor's own methods
    are called from one thread (the control loop and its subscribers).

    Args:
        policy: the policy; its ``spec.chunk_size`` is ``H``.
        config: the :class:`ExecutorConfig`.

    Raises:
        ExecutorConfigError: ``n_action_steps`` (or the latency) is more than ``H`` can provide.
    """

    _queue_dtype: type = np.float32

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
        self.queue: ChunkQueue | None = None
        self.inferences = np.zeros(0, dtype=np.int64)
        self.stall_steps = np.zeros(0, dtype=np.int64)
        self._stepped = False  # the newest observation's action has been returned by act()

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
        if env_ids is None or self.queue is None:
            self._policy_reset(None)
            self.batch_size = self.queue = None
            self._reset_all()
            return
        ids = self.queue.rows(env_ids)
        self._policy_reset(ids.tolist())
        self.queue.reset(ids)
        self.inferences[ids] = 0
        self.stall_steps[ids] = 0
        self._reset_rows(ids)

    def truncate(self, env_ids: Sequence[int] | None = None) -> None:
        """Drop the rest of the chunks of rows ``env_ids`` (``None`` = all): none of the dropped actions is ever
        executed (nor a plan that was in flight for them), and the next :meth:`act` plans those rows from its
        observation. A no-op before the first :meth:`act`.

        Raises:
            IndexError: an id outside ``[0, B)``.
        """
        if self.queue is None:
            return
        ids = self.queue.rows(env_ids)
        self.queue.truncate(ids)
        self._truncate_rows(ids)

    def replan(self, env_ids: Sequence[int] | None = None, guidance: Guidance | GuidanceFn | None = None) -> bool:
        """Truncate rows ``env_ids`` (``None`` = all) and plan them now from the newest observation the policy has.

        With ``guidance`` and a policy that is a :class:`~policylink.adapters.capabilities.GuidedSampler`, the
        chunk is ``policy.sample(history of those rows, guidance=guidance)``; otherwise a plain
        ``predict_action_chunk(env_ids)``. The new chunk's index 0 is the newest observation's step: called
        after :meth:`act` returned that step's action, reading starts at index 1 (a passed action is dropped,
        never executed late); with ``H = 1`` the rows then stay truncated and the next :meth:`act` plans them.
        Counts one inference and one simulated delay for each row (like any synchronous plan).

        Returns:
            True when the guidance was applied (False without guidance or for a policy that cannot take it).

        Raises:
            RuntimeError: no observation yet (call :meth:`act` first).
            IndexError: an id outside ``[0, B)``.
        """
        if self.queue is None:
            raise RuntimeError("replan: no observation yet; call act() first")
        ids = self.queue.rows(env_ids)
        self.truncate(ids)
        offset = 1 if self._stepped else 0
        if not ids.size or offset >= self.chunk_size:
            return False
        return self._plan_rows(ids, guidance=guidance, offset=offset)

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release background resources (threads); a no-op for synchronous executors."""

    # -- steps shared by the executors -------------------------------------------------------------------------

    def _begin_step(self, obs_batch: Mapping[str, Any]) -> int:
        """Allocate on the first call, check ``B``, hand the observation to the policy; returns ``B``."""
        b = self._ensure_batch(obs_batch)
        self._observe(obs_batch)
        self._stepped = False
        return b

    def _end_step(self, action: np.ndarray) -> np.ndarray:
        """Mark the newest observation's action as returned; float32 ``(B, A)``."""
        self._stepped = True
        return np.asarray(action, dtype=np.float32)

    def _plan_rows(self, ids: np.ndarray, guidance: Guidance | GuidanceFn | None = None, offset: int = 0) -> bool:
        """Plan rows ``ids`` now (blocking), install from ``offset``, count one inference and one simulated
        delay each; returns whether guidance was applied."""
        chunk, guided = self._infer(ids, guidance)
        self._install(ids, chunk, offset)
        self.inferences[ids] += 1
        self.stall_steps[ids] += self._latency()
        return guided

    def _policy_ids(self, ids: np.ndarray) -> list[int] | None:
        """``env_ids`` for the policy: None when ``ids`` are all rows in order (no row selection needed)."""
        if len(ids) == self.batch_size and np.array_equal(ids, np.arange(self.batch_size)):
            return None
        return ids.tolist()

    def _infer(
        self, ids: np.ndarray, guidance: Guidance | GuidanceFn | None = None, prefix: ChunkPrefix | None = None
    ) -> tuple[np.ndarray, bool]:
        """``(chunk (len(ids), H, A), guided)`` for rows ``ids`` (see :func:`request_chunk`)."""
        return request_chunk(self.policy, self._policy_ids(ids), guidance, prefix)

    def _observe(self, obs_batch: Mapping[str, Any]) -> None:
        self.policy.update_observation(obs_batch)

    def _policy_reset(self, env_ids: list[int] | None) -> None:
        self.policy.reset(env_ids)

    def _ensure_batch(self, obs_batch: Mapping[str, Any]) -> int:
        b = batch_size_of(obs_batch)
        if self.queue is None:
            self.batch_size = b
            self.queue = ChunkQueue(b, self.chunk_size, self.policy.spec.action.dim, self._queue_dtype)
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
    def _install(self, ids: np.ndarray, chunk: np.ndarray, offset: int) -> None:
        """Put the new chunks ``(len(ids), H, A)`` of rows ``ids`` in the queue, read from ``offset``."""

    def _allocate(self, batch_size: int) -> None:  # noqa: B027 - optional hook
        """Create per-row state besides the queue for ``batch_size`` episodes."""

    def _reset_all(self) -> None:  # noqa: B027 - optional hook
        """Forget every row's extra state (the next ``act`` allocates again)."""

    def _reset_rows(self, ids: np.ndarray) -> None:  # noqa: B027 - optional hook
        """Clear extra per-row state of new episodes ``ids`` (the queue is already reset)."""

    def _truncate_rows(self, ids: np.ndarray) -> None:  # noqa: B027 - optional hook
        """Clear extra per-row state of truncated rows ``ids`` (the queue is already truncated)."""


def request_chunk(
    policy: PolicyAdapter,
    env_ids: list[int] | None,
    guidance: Guidance | GuidanceFn | None = None,
    prefix: ChunkPrefix | None = None,
) -> tuple[np.ndarray, bool]:
    """One chunk request for rows ``env_ids`` (``None`` = all): the single place executors call the policy.

    - ``guidance`` and ``policy`` a :class:`~policylink.adapters.capabilities.GuidedSampler`:
      ``policy.sample(None, guidance=guidance, env_ids=env_ids)`` (the rows' windows, cached latents and
      conditioning);
    - else ``prefix`` and ``policy`` a :class:`~policylink.adapters.capabilities.PrefixConditioned`:
      ``policy.predict_action_chunk_with_prefix(prefix, env_ids)`` (real-time chunking);
    - else ``policy.predict_action_chunk(env_ids)``.

    Returns:
        ``(chunk, guided)``: float32 ``(B', H, A)`` in the ActionSpec's units, and whether ``guidance`` was used.
    """
    if guidance is not None and isinstance(policy, GuidedSampler):
        return np.asarray(policy.sample(None, guidance=guidance, env_ids=env_ids), dtype=np.float32), True
    if prefix is not None and isinstance(policy, PrefixConditioned):
        return np.asarray(policy.predict_action_chunk_with_prefix(prefix, env_ids), dtype=np.float32), False
    return np.asarray(policy.predict_action_chunk(env_ids), dtype=np.float32), False


def executor_problems(spec: Any, config: ExecutorConfig) -> list[str]:
    """Every reason ``config`` cannot run a policy with PolicySpec ``spec`` (empty when it can), so callers can
    reject a (policy, executor) pair before loading envs or starting episodes.

    Checks ``n_action_steps <= chunk_size`` (every kind), ``corrective.short_horizon <= chunk_size``
    (``corrective``) and, for ``async`` with simulated latency, RTC's
    ``d <= s`` and ``s + d <= H`` (``d`` the largest delay, ``s`` the inference period, ``H`` the chunk size).

    Args:
        spec: the policy's :class:`~policylink.adapters.schema.PolicySpec` (``chunk_size``, ``n_action_steps``).
        config: the :class:`ExecutorConfig`.
    """
    h = int(spec.chunk_size)
    s = int(config.n_action_steps or spec.n_action_steps)
    if s > h:
        return [f"executor.n_action_steps: expected <= the policy's chunk_size ({h}), received {s}"]
    short = config.corrective.short_horizon
    if config.kind == ExecutorKind.CORRECTIVE.value and short is not None and int(short) > h:
        return [f"executor.corrective.short_horizon: expected <= the policy's chunk_size ({h}), received {short}"]
    lat = config.latency
    if config.kind != ExecutorKind.ASYNC.value or not lat.simulated:
        return []
    if lat.max_steps > s:
        return [f"executor.latency: expected a delay <= n_action_steps ({s}) steps, received up to {lat.max_steps}"]
    if s + lat.max_steps > h:
        return [f"executor.n_action_steps + latency: expected <= chunk_size ({h}), received {s} + {lat.max_steps}"]
    return []
