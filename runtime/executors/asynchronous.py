"""Asynchronous chunk execution: the next chunk is inferred in a background thread while the current one
executes, aligned by the measured delay, optionally with real-time chunking guidance (Black et al. 2025)."""

from __future__ import annotations

import copy
import time
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from policylink.adapters.policy import PolicyAdapter
from policylink.runtime.executors.base import ChunkExecutor, ExecutorConfig
from policylink.runtime.executors.guided import sample_with_rtc, supports_rtc
from policylink.runtime.executors.rtc import rtc_weights


@dataclass
class _Request:
    future: Future
    episode: np.ndarray  # (B,) episode tags at the trigger; rows whose tag changed discard the result
    delay: int  # simulated delay in steps (sim mode); -1 when measured
    started: float  # time.perf_counter() at submission
    age: int = 0  # actions executed since the trigger


class AsyncExecutor(ChunkExecutor):
    """Inference every ``s = n_action_steps`` steps, overlapped with execution.

        Timeline of one episode row: at a trigger step ``T`` the policy is asked for a chunk conditioned on the
        observation of step ``T`` (its index 0 is step ``T``). Meanwhile the current chunk keeps executing. When
        the result is ready after ``d`` executed steps (the *measured* delay: ``d`` = actions executed since
        ``T``), the row switches to the new chunk at index ``d``: the ``d`` actions whose time has passed are
        dropped, never executed late. The next trigger is ``s`` steps after ``T`` and at most one inference is in
        flight. With latency simulation (``config.latency``) a result counts as ready exactly ``d`` sampled steps
        after its trigger (waiting for the thread if needed), so runs are reproducible; without it, it is ready
        when the thread has finished. If a row runs out of actions before the result is ready, the executor waits
        and counts the wait in ``stall_steps``. The first chunk of every episode is a blocking inference (queued
    behind the one in flight, which stays in flight); a chunk in flight for an episode that has since been reset
    is discarded for that row.

        Real-time chunking: when the policy implements :class:`~policylink.runtime.executors.guided.GuidedSampler`
        and ``config.rtc`` is set, each new chunk is sampled with RTC's prefix-weighted inpainting guidance toward
        the previous chunk's remaining actions (``rtc_weights(H, d, s)``), ``d`` being the sampled delay or the
        last measured one.

        Raises:
            ExecutorConfigError: simulated delays with ``max_delay > s`` or ``s + max_delay > H`` (RTC's
                ``d <= s <= H - d``).
    """

    def __init__(self, policy: PolicyAdapter, config: ExecutorConfig):
        super().__init__(policy, config)
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="policylink-infer")
        self._rtc = bool(config.rtc) and supports_rtc(policy)
        self._hz = float(policy.spec.control_frequency)
        self._ops: list[tuple[str, Any]] = []  # policy calls deferred to the inference thread, in order
        self._request: _Request | None = None
        self._last_delay = 0

    @property
    def uses_rtc(self) -> bool:
        """True when new chunks are sampled with real-time-chunking guidance."""
        return self._rtc

    def act(self, obs_batch: Mapping[str, Any]) -> np.ndarray:
        """Return float32 ``(B, A)``: each episode's action for this step (never blocks on a ready chunk)."""
        b = self._ensure_batch(obs_batch)
        self._ops.append(("obs", _copy_obs(obs_batch)))
        fresh = ~self._has_chunk
        if fresh.any():  # first chunk of an episode: blocking, from index 0; queued behind any chunk in flight
            delay = self._latency()
            chunk = self._submit(delay, target=None).future.result()
            self._chunk[fresh], self._index[fresh], self._has_chunk[fresh] = chunk[fresh], 0, True
            self.inferences[fresh] += 1
            self.stall_steps[fresh] += delay
            if fresh.all():
                self._since_trigger = 0
        self._collect(wait=False)  # a chunk that arrives now frees the slot for the next trigger (d = s)
        if self._request is None and self._since_trigger >= self.n_action_steps:
            self._request = self._submit(self._latency(), target=self._committed())
            self._since_trigger = 0
        self._collect(wait=False)  # d = 0: ready at once
        if (self._index >= self.chunk_size).any():  # ran out: wait for the chunk in flight
            waited = self._collect(wait=True)
            if self._request is None and (self._index >= self.chunk_size).any():
                self._index = np.minimum(self._index, self.chunk_size - 1)
            self.stall_steps += waited
        action = self._chunk[np.arange(b), self._index].copy()
        self._index += 1
        self._since_trigger += 1
        if self._request is not None:
            self._request.age += 1
        return action

    def close(self) -> None:
        """Wait for the inference in flight and stop the background thread."""
        self._thread.shutdown(wait=True)

    def _reset_policy_rows(self, ids: np.ndarray) -> None:
        self._ops.append(("reset", ids.tolist()))
        self._episode[ids] += 1

    def _allocate(self, batch_size: int) -> None:
        h, a = self.chunk_size, self.policy.spec.action.dim
        self._chunk = np.zeros((batch_size, h, a), np.float32)
        self._index = np.zeros(batch_size, np.int64)
        self._has_chunk = np.zeros(batch_size, bool)
        self._episode = np.zeros(batch_size, np.int64)
        self._since_trigger = 0

    def _reset_all(self) -> None:
        if self._request is not None:
            self._request.future.result()
        self._request = None
        self._ops = [("reset", None)]

    def _reset_rows(self, ids: np.ndarray) -> None:
        self._chunk[ids] = 0.0
        self._index[ids] = 0
        self._has_chunk[ids] = False

    def _committed(self) -> tuple[np.ndarray, np.ndarray] | None:
        """``(actions (B, H, A), valid (B, H))``: the remaining actions of each row's current chunk in the new
        chunk's frame (index 0 = now) and where they exist; None without RTC."""
        if not self._rtc:
            return None
        h = self.chunk_size
        rows = np.arange(self._chunk.shape[0])
        pos = self._index[:, None] + np.arange(h)[None]  # (B, H)
        valid = pos < h
        target = self._chunk[rows[:, None], np.minimum(pos, h - 1)]
        return np.where(valid[..., None], target, 0.0).astype(np.float32), valid

    def _submit(self, delay: int, target: tuple[np.ndarray, np.ndarray] | None) -> _Request:
        ops, self._ops = self._ops, []
        weights = None
        if target is not None:
            d = delay if self.config.latency.simulated else self._last_delay
            d = min(d, self.chunk_size - self.n_action_steps)
            committed, valid = target
            weights = rtc_weights(self.chunk_size, d, self.n_action_steps)[None] * valid
            target = committed
        future = self._thread.submit(self._work, ops, target, weights)
        sim = self.config.latency.simulated
        return _Request(future, self._episode.copy(), delay if sim else -1, time.perf_counter())

    def _work(self, ops: list[tuple[str, Any]], target: np.ndarray | None, weights: np.ndarray | None):
        for kind, arg in ops:
            if kind == "obs":
                self.policy.update_observation(arg)
            else:
                self.policy.reset(arg)
        if target is not None:
            return sample_with_rtc(self.policy, target, weights, self.config.rtc_max_guidance)
        return self.policy.predict_action_chunk()

    def _collect(self, wait: bool) -> int:
        """Install the chunk in flight if ready (or ``wait``); returns the stall steps that waiting cost."""
        req = self._request
        if req is None:
            return 0
        if req.delay >= 0:
            ready = req.age >= req.delay
        else:
            ready = req.future.done()
        if not (ready or wait):
            return 0
        before = time.perf_counter()
        chunk = req.future.result()
        if req.delay >= 0:
            stalled = max(req.delay - req.age, 0)
        else:
            stalled = int(np.ceil((time.perf_counter() - before) * self._hz)) if not ready else 0
        self._request = None
        age = req.age + stalled
        self._last_delay = age
        same = (req.episode == self._episode) & self._has_chunk
        idx = min(age, self.chunk_size - 1)
        self._chunk[same] = chunk[same]
        self._index[same] = idx
        self.inferences[same] += 1
        return stalled


def _copy_obs(obs_batch: Mapping[str, Any]) -> dict[str, Any]:
    """A private copy (vector envs may reuse their observation buffers)."""
    return {k: (np.array(v, copy=True) if isinstance(v, np.ndarray) else copy.copy(v)) for k, v in obs_batch.items()}
