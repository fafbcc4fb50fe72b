"""Asynchronous chunk execution: the next chunk is inferred on a background inference worker while the current
one executes, aligned by the measured delay, optionally with real-time chunking (Black, Galliker, Levine 2025,
arXiv 2506.07339)."""

from __future__ import annotations

import copy
import math
import time
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any

import numpy as np

from policylink.adapters.capabilities import ChunkPrefix, Guidance, GuidanceFn, PrefixConditioned
from policylink.adapters.policy import PolicyAdapter
from policylink.runtime.executors.base import ChunkExecutor, ExecutorConfig, request_chunk
from policylink.runtime.executors.rtc import inpaint_weights, rtc_weights

DELAY_BUFFER = 10
"""Measured delays kept for the RTC prefix, replies: the prefix covers the largest of them (RTC's conservative
``d = max(Q)`` over a buffer ``Q`` of recent delays, Black et al. 2025, Algorithm 1)."""


@dataclass
class _Request:
    future: Future  # -> (chunk (B', H, A), guided)
    rows: np.ndarray  # (B',) the rows planned
    epoch: np.ndarray  # (B',) queue epochs at the trigger; rows whose epoch changed discard the result
    delay: int  # simulated delay in steps (sim mode); -1 when measured
    sent_t: float  # the executor's clock at the trigger, seconds
    age: int = 0  # actions executed since the trigger


class PolicyStoppedAnswering(TimeoutError):
    """A chunk request went unanswered for longer than the reply timeout set by
    :meth:`AsyncExecutor.watch_replies` (the policy or its server died or hangs); the executor hands out no
    further action.

    Attributes:
        waited_s: how long the request has gone unanswered, seconds.
        timeout_s: the reply timeout, seconds.
        since_reply_s: time since the policy's last reply (the planned actions executed meanwhile), seconds.
    """

    def __init__(self, waited_s: float, timeout_s: float, since_reply_s: float):
        self.waited_s, self.timeout_s, self.since_reply_s = waited_s, timeout_s, since_reply_s
        super().__init__(
            f"the policy stopped answering: no reply to a chunk request for {1e3 * waited_s:.0f} ms (limit "
            f"{1e3 * timeout_s:.0f} ms); its last reply came {1e3 * since_reply_s:.0f} ms ago"
        )


class AsyncExecutor(ChunkExecutor):
    """Inference every ``s = n_action_steps`` steps per row, overlapped with execution.

    Timeline of one episode row: at a trigger step ``T`` the policy is asked for a chunk conditioned on the
    observation of step ``T`` (its index 0 is step ``T``). Meanwhile the current chunk keeps executing. When
    the result is ready after ``d`` executed steps (the *measured* delay: ``d`` = actions executed since
    ``T``), the row switches to the new chunk at index ``d``: the ``d`` actions whose time has passed are
    dropped, never executed late. The row's next trigger is ``s`` steps after ``T`` and at most one periodic
    inference per row is in flight; rows due at the same step share one batched request for those rows only.
    With latency simulation (``config.latency``) a result counts as ready exactly ``d`` sampled steps after its
    trigger (waiting for the worker if needed), so runs are reproducible; without it, it is ready when the
    worker has finished. If a row runs out of actions before its result is ready, the executor waits and counts
    the wait in every row's ``stall_steps`` (the batch waits together). A row without a chunk (a new episode,
    or after :meth:`truncate`) gets a blocking inference for that row, queued behind the requests in flight; a
    result planned before the row was reset, truncated or re-planned is discarded for that row.

    One inference worker (a single thread) makes every policy call, in order: observations, resets, periodic
    and blocking requests and :meth:`replan`, so no call races another and the policy sees the same sequence
    whatever the worker's timing.

    Real-time chunking: when the policy is :class:`~policylink.adapters.capabilities.PrefixConditioned` and
    ``config.rtc`` is set, each periodic request carries a :class:`~policylink.adapters.capabilities.ChunkPrefix`
    (the current chunk's unread actions, weights ``rtc_weights(H, d, s)`` times their validity, ``beta =
    config.rtc_max_guidance``), ``d`` being the sampled delay or the largest of the last :data:`DELAY_BUFFER`
    measured ones (a prefix shorter than the real delay leaves an executed action out of it; a longer one only
    repeats what the current chunk would execute anyway); with
    ``config.rtc_method`` ``"inpaint"`` or ``"condition"`` the weights are ``inpaint_weights(H, d)`` (the ``d``
    actions executed while the chunk is computed are reproduced exactly, at the cost of a plain inference).

    Reply timeout (deployment, off by default): after :meth:`watch_replies`, a chunk request unanswered for longer
    than the timeout raises :class:`PolicyStoppedAnswering` from :meth:`act` instead of executing more of the old
    chunk (the robot then holds). After the policy's last reply the rows execute their chunk up to the next
    trigger (``s - d`` steps) and then at most the timeout while that request goes unanswered.

    Raises:
        ExecutorConfigError: simulated delays with ``max_delay > s`` or ``s + max_delay > H`` (RTC's
            ``d <= s <= H - d``).
    """

    def __init__(self, policy: PolicyAdapter, config: ExecutorConfig):
        super().__init__(policy, config)
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="policylink-infer")
        self._rtc = bool(config.rtc) and isinstance(policy, PrefixConditioned)
        self._hz = float(policy.spec.control_frequency)
        self._ops: list[tuple[str, Any]] = []  # policy calls deferred to the worker, applied in order
        self._requests: list[_Request] = []  # periodic requests in flight, in submission order
        self._delays: deque[int] = deque(maxlen=DELAY_BUFFER)  # measured delays of the latest replies, steps
        self._reply_timeout: float | None = None
        self._clock: Callable[[], float] = time.monotonic
        self._last_reply_t: float | None = None
        self._stopped = False  # a request went unanswered: close() does not wait for it

    @property
    def uses_rtc(self) -> bool:
        """True when periodic chunks are requested with a real-time-chunking prefix."""
        return self._rtc

    def watch_replies(self, timeout_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        """Stop at a chunk request unanswered for more than ``timeout_s`` seconds of ``clock`` (see the class).

        Raises:
            ValueError: ``timeout_s`` is not a finite number > 0.
        """
        if not (math.isfinite(timeout_s) and timeout_s > 0):
            raise ValueError(f"reply timeout_s: expected a finite number of seconds > 0, received {timeout_s}")
        self._reply_timeout, self._clock = float(timeout_s), clock

    def act(self, obs_batch: Mapping[str, Any]) -> np.ndarray:
        """Return float32 ``(B, A)``: each episode's action for this step (never blocks on a ready chunk).

        Raises:
            PolicyStoppedAnswering: with :meth:`watch_replies`, a request is unanswered for longer than the timeout.
        """
        self._begin_step(obs_batch)
        fresh = np.flatnonzero(~self.queue.valid)
        if fresh.size:  # first chunk of an episode (or after truncate): blocking, from index 0
            self._plan_rows(fresh)
        self._collect()  # a chunk that arrives now frees the row for its next trigger (d = s)
        self._trigger()
        self._collect()  # d = 0: ready at once
        self._check_replies()
        self.stall_steps += self._wait_exhausted()
        action = self.queue.pop()
        self._since_trigger += 1
        for req in self._requests:
            req.age += 1
        return self._end_step(action)

    def close(self) -> None:
        """Wait for the inference in flight and stop the worker (without waiting after
        :class:`PolicyStoppedAnswering`: the unanswered call is left to finish or time out on its own)."""
        self._worker.shutdown(wait=not self._stopped, cancel_futures=self._stopped)

    # -- every policy call goes through the worker ---------------------------------------------------------------

    def _observe(self, obs_batch: Mapping[str, Any]) -> None:
        self._ops.append(("obs", _copy_obs(obs_batch)))

    def _policy_reset(self, env_ids: list[int] | None) -> None:
        if env_ids is None:
            self._ops = []  # observations of the old batch are moot
        self._ops.append(("reset", env_ids))

    def _infer(
        self, ids: np.ndarray, guidance: Guidance | GuidanceFn | None = None, prefix: ChunkPrefix | None = None
    ) -> tuple[np.ndarray, bool]:
        out = self._submit(request_chunk, self.policy, self._policy_ids(ids), guidance, prefix).result()
        self._last_reply_t = self._clock()
        return out

    def _submit(self, fn: Callable[..., Any], *args: Any) -> Future:
        ops, self._ops = self._ops, []
        return self._worker.submit(self._work, ops, fn, args)

    def _work(self, ops: list[tuple[str, Any]], fn: Callable[..., Any], args: tuple) -> Any:
        for kind, arg in ops:
            if kind == "obs":
                self.policy.update_observation(arg)
            else:
                self.policy.reset(arg)
        return fn(*args)

    # -- per-row state ---------------------------------------------------------------------------------------

    def _install(self, ids: np.ndarray, chunk: np.ndarray, offset: int) -> None:
        self.queue.install(ids, chunk, offset=offset, limit=self.chunk_size)
        self._since_trigger[ids] = offset

    def _allocate(self, batch_size: int) -> None:
        self._since_trigger = np.zeros(batch_size, np.int64)
        self._in_flight = np.zeros(batch_size, bool)

    def _reset_all(self) -> None:
        self._requests = []  # results of the old batch are never read; the worker runs them before anything new

    def _trigger(self) -> None:
        """Submit one periodic request for the rows that are due (``s`` steps since their last trigger)."""
        due = self.queue.valid & ~self._in_flight & (self._since_trigger >= self.n_action_steps)
        ids = np.flatnonzero(due)
        if not ids.size:
            return
        delay = self._latency()
        prefix = self._prefix(ids, delay) if self._rtc else None
        future = self._submit(request_chunk, self.policy, self._policy_ids(ids), None, prefix)
        sim = self.config.latency.simulated
        self._requests.append(_Request(future, ids, self.queue.epoch[ids].copy(), delay if sim else -1, self._clock()))
        self._in_flight[ids] = True
        self._since_trigger[ids] = 0

    def _prefix(self, ids: np.ndarray, delay: int) -> ChunkPrefix:
        """RTC's prefix for rows ``ids``: their unread actions in the new chunk's frame (index 0 = now), weighted
        by ``rtc_weights(H, d, s)`` (``rtc_method="guidance"``) or ``inpaint_weights(H, d)`` (``"inpaint"``,
        ``"condition"``) times their validity; ``d`` is the sampled delay or the last measured one."""
        d = delay if self.config.latency.simulated else max(self._delays, default=0)
        d = min(d, self.chunk_size - self.n_action_steps)
        committed, valid = self.queue.remaining(ids)
        method = self.config.rtc_method
        if method == "guidance":
            w = rtc_weights(self.chunk_size, d, self.n_action_steps)
        else:  # inpaint, condition: exactly the d actions executed while the chunk is computed
            w = inpaint_weights(self.chunk_size, d)
        weights = (w[None] * valid).astype(np.float32)
        return ChunkPrefix(committed.astype(np.float32), weights, self.config.rtc_max_guidance, method)

    def _collect(self, wait_rows: np.ndarray | None = None) -> int:
        """Install every ready request, waiting for those that serve ``wait_rows``; returns the stall steps that
        waiting cost (time that also ages the requests still in flight)."""
        stalled, pending = 0, []
        for req in self._requests:
            req.age += stalled
            ready = req.age >= req.delay if req.delay >= 0 else req.future.done()
            if ready or (wait_rows is not None and np.isin(req.rows, wait_rows).any()):
                stalled += self._finish(req, ready)
            else:
                pending.append(req)
        self._requests = pending
        return stalled

    def _finish(self, req: _Request, ready: bool) -> int:
        """Install ``req``'s chunk in its rows that have not changed since the trigger; returns the wait."""
        before = time.perf_counter()
        self._await(req)
        chunk, _ = req.future.result()
        self._last_reply_t = self._clock()
        if req.delay >= 0:
            stalled = max(req.delay - req.age, 0)
        else:
            stalled = 0 if ready else int(np.ceil((time.perf_counter() - before) * self._hz))
        age = req.age + stalled
        self._delays.append(age)
        self._in_flight[req.rows] = False
        same = self.queue.epoch[req.rows] == req.epoch
        rows = req.rows[same]
        if rows.size:
            self.queue.install(rows, chunk[same], offset=min(age, self.chunk_size - 1), limit=self.chunk_size)
            self.inferences[rows] += 1
        return stalled

    def _check_replies(self) -> None:
        """Raise :class:`PolicyStoppedAnswering` when a request in flight is older than the reply timeout."""
        if self._reply_timeout is None:
            return
        for req in self._requests:
            if not req.future.done() and self._clock() - req.sent_t > self._reply_timeout:
                raise self._stopped_answering(req)

    def _await(self, req: _Request) -> None:
        """Wait for ``req``'s reply, at most until its reply timeout (none without :meth:`watch_replies`)."""
        if self._reply_timeout is None or req.future.done():
            return
        left = self._reply_timeout - (self._clock() - req.sent_t)
        done, _ = wait([req.future], timeout=max(left, 0.0))
        if not done:
            raise self._stopped_answering(req)

    def _stopped_answering(self, req: _Request) -> PolicyStoppedAnswering:
        self._stopped = True
        now = self._clock()
        last = req.sent_t if self._last_reply_t is None else self._last_reply_t
        return PolicyStoppedAnswering(now - req.sent_t, self._reply_timeout, now - last)

    def _wait_exhausted(self) -> int:
        """Wait for the requests of rows that ran out of actions; returns the stall steps."""
        out = np.flatnonzero(self.queue.offset >= self.chunk_size)
        if not out.size:
            return 0
        waited = self._collect(wait_rows=out)
        still = np.flatnonzero(self.queue.offset >= self.chunk_size)
        if still.size:  # nothing in flight for them: repeat the last action
            self.queue.hold_last(still)
        return waited


def _copy_obs(obs_batch: Mapping[str, Any]) -> dict[str, Any]:
    """A private copy (vector envs may reuse their observation buffers)."""
    return {k: (np.array(v, copy=True) if isinstance(v, np.ndarray) else copy.copy(v)) for k, v in obs_batch.items()}
