"""Corrective action-chunk execution (VLA-Corrector, arXiv 2607.01804): long chunks run open-loop while a latent
monitor finds them reliable; a persistent deviation truncates the stale chunk (its dropped actions are never
executed) and triggers one replan from the current observation, guided toward consistency with the observed
latent change (plain replanning with ``guidance_scale: 0`` or for a policy that cannot take guidance, such as a
served one). The policy's weights never change.

Per step ``t`` and row: ``z_t = policy.embed()`` (reusing the latent of a chunk just planned), the score
``E_t = 1 - cos(f(z_{t-k}, a_{t-k:t}), z_t - z_{t-k})`` (or the monitor's residual score) once ``k`` steps of the
episode exist, then the :class:`~policylink.policies.corrector.calibration.PersistenceDetector` at the chunk offset
of the action about to run. With ``short_horizon`` the horizon is event-triggered: a trigger caps the row's chunks
at ``short_horizon`` actions until ``short_dwell`` steps pass without an alarm (``short_start``: also for the first
steps of every episode). Histories are per row and cleared by ``reset``, so nothing crosses an episode boundary.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from policylink.adapters.capabilities import Embedder, GuidedSampler
from policylink.adapters.policy import PolicyAdapter
from policylink.runtime.executors.base import ExecutorConfig, ExecutorConfigError
from policylink.runtime.executors.receding import RecedingHorizonExecutor
from policylink.runtime.rollout import EpisodeResult, EpisodeSubscriber


class CorrectiveExecutor(RecedingHorizonExecutor):
    """Receding horizon (``n_action_steps``, default the whole chunk ``H``) plus monitor-triggered truncation and
    guided replanning. Everything is checked at construction (before any episode runs).

    Args:
        policy: an :class:`~policylink.adapters.capabilities.Embedder` policy (guided replanning also needs a
            :class:`~policylink.adapters.capabilities.GuidedSampler`).
        config: ``kind: corrective``; ``config.corrective`` (:class:`~policylink.policies.corrector.config.
            CorrectiveConfig`) names the monitor folder.
        monitor, thresholds: an already loaded monitor and its calibration (tests, benchmarks); default loaded
            from ``config.corrective.monitor``.

    Attributes (per row, cleared by ``reset``): ``triggers`` int64 ``(B,)``; ``truncation_offsets`` (list per row
    of the chunk offsets at which chunks were cut); ``trace`` (list per row of ``(step, score, threshold,
    fired)``); ``short_left`` / ``short_steps`` int64 ``(B,)`` (steps left in / executed in the short-horizon
    phase); and for the whole run ``monitor_s`` / ``policy_s`` (seconds in the monitor / in policy calls),
    ``monitor_steps`` / ``policy_calls`` and ``policy_rows`` (rows planned, summed over the calls: a step scores
    all ``B`` rows, a call plans only the rows that need a chunk).

    Raises:
        ExecutorConfigError: no monitor, a policy that is not an Embedder, mismatched latent or action width,
            thresholds that do not cover the chunk, or a bad detector config.
    """

    def __init__(self, policy: PolicyAdapter, config: ExecutorConfig, monitor: Any = None, thresholds: Any = None):
        cfg = config.corrective
        if config.n_action_steps is None:  # corrective execution runs whole chunks unless told otherwise
            from dataclasses import replace

            config = replace(config, n_action_steps=int(policy.spec.chunk_size))
        super().__init__(policy, config)
        if not isinstance(policy, Embedder):
            raise ExecutorConfigError(f"executor.kind: 'corrective' needs a policy with the embedder capability "
                                      f"(observation latents), received {type(policy).__name__}")  # fmt: skip
        if monitor is None:
            if cfg.monitor is None:
                raise ExecutorConfigError("executor.corrective.monitor: expected a monitor folder (policylink "
                                          "finetune monitor), received None")  # fmt: skip
            from policylink.policies.corrector.monitor import load_monitor

            try:
                monitor, thresholds = load_monitor(cfg.monitor)
            except FileNotFoundError as e:
                raise ExecutorConfigError(str(e)) from None
        self._check(policy, monitor, thresholds, cfg)
        self._device = getattr(policy, "device", "cpu")  # a served policy runs its monitor here, on the CPU
        self.monitor, self.thresholds, self.settings = monitor.to(self._device), thresholds, cfg
        self.k = int(monitor.horizon)
        self._to_units = None
        if cfg.guidance_scale > 0 and isinstance(policy, GuidedSampler):
            from policylink.policies.corrector.guidance import affine_inverse

            self._to_units = affine_inverse(policy.normalize_actions, policy.spec.action.dim)
        self.monitor_s = self.policy_s = 0.0
        self.monitor_steps = self.policy_calls = self.policy_rows = 0

    def _check(self, policy: Any, monitor: Any, thresholds: Any, cfg: Any) -> None:
        problems = [
            f"executor.corrective.monitor: expected {name} {want} (the policy's), received {got} (a monitor of "
            f"another policy?)"
            for name, want, got in (("latent_dim", policy.latent_dim, monitor.latent_dim),
                                    ("action_dim", policy.spec.action.dim, monitor.action_dim))
            if got != want
        ]  # fmt: skip
        if cfg.detector.rule == "conformal":
            if thresholds is None:
                problems.append("executor.corrective.detector.rule: 'conformal' needs a calibrated monitor "
                                "(calibration.json), received none")  # fmt: skip
            elif len(thresholds.thresholds) != self.chunk_size:
                problems.append(f"monitor calibration: expected {self.chunk_size} per-offset thresholds (chunk_size), "
                                f"received {len(thresholds.thresholds)}")  # fmt: skip
            elif abs(thresholds.ewma - cfg.detector.ewma) > 1e-12:
                problems.append(f"executor.corrective.detector.ewma: expected {thresholds.ewma} (the calibration's), "
                                f"received {cfg.detector.ewma}")  # fmt: skip
        if problems:
            raise ExecutorConfigError("; ".join(problems))
        from policylink.policies.corrector.monitor import probe_mismatch

        rel = probe_mismatch(policy, getattr(monitor, "policy_probe", None))
        if rel is not None:
            warnings.warn(
                f"executor.corrective.monitor: trained on another policy's latents (a fixed probe observation's "
                f"latent differs by {100 * rel:.0f}%): its scores and thresholds do not fit this policy; train one "
                "on its rollouts (policylink finetune monitor)",
                stacklevel=3,
            )

    # -- per-row state --------------------------------------------------------------------------------------

    def _allocate(self, batch_size: int) -> None:
        from policylink.policies.corrector.calibration import PersistenceDetector

        d, a = self.monitor.latent_dim, self.policy.spec.action.dim
        self._z = np.zeros((batch_size, self.k, d), np.float32)  # z_{t-k} .. z_{t-1}
        self._a = np.zeros((batch_size, self.k, a), np.float32)  # a_{t-k} .. a_{t-1}
        self._t = np.zeros(batch_size, np.int64)  # steps executed in the episode
        self.detector = PersistenceDetector(self.settings.detector, batch_size, self.thresholds)
        self.triggers = np.zeros(batch_size, np.int64)
        self.short_left = np.full(batch_size, self._short_start(), np.int64)  # steps left in the short phase
        self.short_steps = np.zeros(batch_size, np.int64)  # steps executed in it this episode
        self.truncation_offsets: list[list[int]] = [[] for _ in range(batch_size)]
        self.trace: list[list[tuple[int, float, float, bool]]] = [[] for _ in range(batch_size)]

    def _reset_rows(self, ids: np.ndarray) -> None:
        self._t[ids] = 0
        self._z[ids] = 0.0
        self._a[ids] = 0.0
        self.detector.reset(ids)
        self.triggers[ids] = 0
        self.short_left[ids] = self._short_start()
        self.short_steps[ids] = 0
        for i in ids.tolist():
            self.truncation_offsets[i] = []
            self.trace[i] = []

    # -- the step -------------------------------------------------------------------------------------------

    def act(self, obs_batch: Mapping[str, Any]) -> np.ndarray:
        """Plan rows whose chunk ran out, score every row, truncate and replan the rows that fire, then return
        float32 ``(B, A)``: each row's next action."""
        self._begin_step(obs_batch)
        need = np.flatnonzero(self.queue.needs_plan())
        if need.size:
            self._timed_plan(need)
        fresh = np.zeros(self.batch_size, bool)
        fresh[need] = True
        t0 = time.perf_counter()
        z = np.asarray(self.policy.embed(), np.float32)
        scores, dz_obs, dz_pred = self._scores(z)
        offsets = self.queue.offset.copy()
        active = self._t >= self.k
        fired, thr = self.detector.update(scores, offsets, active)
        fired &= ~fresh & (not self.settings.monitor_only)
        self._short_phase(fired, active & (self.detector.smoothed > thr))
        self.monitor_s += time.perf_counter() - t0
        self.monitor_steps += 1
        for i in np.flatnonzero(active).tolist():
            self.trace[i].append((int(self._t[i]), float(self.detector.smoothed[i]), float(thr[i]), bool(fired[i])))
        rows = np.flatnonzero(fired)
        if rows.size:
            self.triggers[rows] += 1
            for i in rows.tolist():
                self.truncation_offsets[i].append(int(offsets[i]))
            self.truncate(rows)
            target = dz_pred if self.settings.guidance_target == "predicted" else dz_obs
            self._timed_plan(rows, self._guidance(rows, z, target))
        action = self.queue.pop()
        self._z = np.roll(self._z, -1, axis=1)
        self._a = np.roll(self._a, -1, axis=1)
        self._z[:, -1], self._a[:, -1] = z, action
        self._t += 1
        return self._end_step(action)

    def _short_start(self) -> int:
        """Steps of the short phase every episode starts with (``short_start``; 0 without a short horizon)."""
        s = self.settings
        return 0 if s.short_horizon is None or s.monitor_only else int(s.short_start)

    def _short_phase(self, fired: np.ndarray, alarm: np.ndarray) -> None:
        """Event-triggered horizon (``short_horizon``): a trigger starts a row's short phase of ``short_dwell``
        steps, an alarm step inside it restarts the count (never shortening a longer ``short_start`` phase), and a
        row in it never runs a chunk past ``offset + short_horizon``; bool ``(B,)`` masks of rows that fired and
        rows whose smoothed score is over its threshold."""
        n = self.settings.short_horizon
        if n is None or self.settings.monitor_only:
            return
        inside = self.short_left > 0
        self.short_steps += inside
        left = self.short_left - inside
        self.short_left = np.where(fired | (inside & alarm), np.maximum(left, int(self.settings.short_dwell)), left)
        cap = self.short_left > 0
        self.queue.limit[cap] = np.minimum(self.queue.limit[cap], self.queue.offset[cap] + int(n))

    def _install(self, ids: np.ndarray, chunk: np.ndarray, offset: int) -> None:
        super()._install(ids, chunk, offset)
        n = self.settings.short_horizon
        if n is not None:  # rows in their short phase (allocated before any install)
            cap = ids[self.short_left[ids] > 0]
            self.queue.limit[cap] = np.minimum(self.queue.limit[cap], offset + int(n))

    def _timed_plan(self, ids: np.ndarray, guidance: Any = None) -> None:
        t0 = time.perf_counter()
        self._plan_rows(ids, guidance=guidance)
        self.policy_s += time.perf_counter() - t0
        self.policy_calls += 1
        self.policy_rows += len(ids)

    def _scores(self, z: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Raw scores float64 ``(B,)`` (0 for rows with fewer than ``k`` steps), observed and predicted latent
        changes ``(B, D)`` over the last ``k`` steps."""
        import torch

        from policylink.policies.corrector.monitor import monitor_deviation

        dz_obs = z - self._z[:, 0]
        with torch.no_grad():
            z0, acts = (torch.as_tensor(x, device=self._device) for x in (self._z[:, 0], self._a))
            p = self.monitor(z0, acts).cpu().numpy()
        return np.where(self._t >= self.k, monitor_deviation(self.monitor, p, dz_obs), 0.0), dz_obs, p

    def _guidance(self, rows: np.ndarray, z: np.ndarray, dz_target: np.ndarray) -> Any:
        """The corrective guidance for rows ``rows`` toward latent changes ``dz_target`` ``(B, D)`` (None for
        plain replanning)."""
        if self._to_units is None:
            return None
        import torch

        from policylink.policies.corrector.guidance import corrective_cost, cost_guidance

        zt = torch.as_tensor(z[rows], device=self._device)
        target = torch.as_tensor(dz_target[rows], device=self._device)
        cost = corrective_cost(self.monitor, zt, target, self._to_units)
        return cost_guidance(cost, self.settings.guidance_scale)

    def monitor_cost_ratio(self) -> float:
        """Mean monitor seconds per control step (all ``B`` rows) over mean seconds per policy call (its rows:
        ``policy_rows / policy_calls`` on average); NaN before any call."""
        if not (self.monitor_steps and self.policy_calls):
            return float("nan")
        return (self.monitor_s / self.monitor_steps) / (self.policy_s / self.policy_calls)


class CorrectiveLog(EpisodeSubscriber):
    """Collects each finished episode's corrective log from a :class:`CorrectiveExecutor`: ``{episode index:
    {"triggers", "truncation_offsets", "calls", "trace"}}`` in :attr:`episodes` (read in ``on_episode_end``,
    before the loop resets the row)."""

    def __init__(self) -> None:
        self.episodes: dict[int, dict[str, Any]] = {}
        self._ex: CorrectiveExecutor | None = None

    def on_start(self, vec_env: Any, source: Any) -> None:
        """Keep the executor (it must be a :class:`CorrectiveExecutor`)."""
        if not isinstance(source, CorrectiveExecutor):
            raise TypeError(f"CorrectiveLog: expected a CorrectiveExecutor, received {type(source).__name__}")
        self._ex = source

    def on_episode_end(self, slot: int, result: EpisodeResult) -> None:
        """Copy the row's counters and trace."""
        ex = self._ex
        self.episodes[result.index] = {
            "triggers": int(ex.triggers[slot]),
            "truncation_offsets": list(ex.truncation_offsets[slot]),
            "calls": int(ex.inferences[slot]),
            "short_steps": int(ex.short_steps[slot]),
            "trace": list(ex.trace[slot]),
        }

    def summary(self, ids: Sequence[int] | None = None) -> dict[str, float]:
        """Means over episodes: ``triggers_per_episode``, ``calls_per_episode``, ``short_steps_per_episode``,
        ``alarm_rate`` (steps whose
        smoothed score exceeded the threshold / scored steps)."""
        eps = [self.episodes[i] for i in (ids if ids is not None else sorted(self.episodes))]
        steps = sum(len(e["trace"]) for e in eps)
        over = sum(sum(s > th for _, s, th, _ in e["trace"]) for e in eps)
        n = max(len(eps), 1)
        return {
            "triggers_per_episode": sum(e["triggers"] for e in eps) / n,
            "calls_per_episode": sum(e["calls"] for e in eps) / n,
            "short_steps_per_episode": sum(e["short_steps"] for e in eps) / n,
            "alarm_rate": over / max(steps, 1),
        }


__all__ = ["CorrectiveExecutor", "CorrectiveLog"]
