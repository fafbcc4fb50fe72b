"""Calibrated detection of a drifting action chunk (VLA-Corrector, arXiv 2607.01804, with split conformal
thresholds): a per-step deviation score, smoothed by an EWMA, is compared with a threshold per chunk offset; a
trigger needs ``m`` exceedances in the last ``W`` steps (persistence), then a cool-down and hysteresis keep the
detector from firing again on the same event.

Thresholds are split conformal quantiles (Vovk et al. 2005; Angelopoulos & Bates 2021, "A Gentle Introduction
to Conformal Prediction", section 1): with ``n`` held-out scores of successful rollouts at an offset, the
``ceil((n + 1)(1 - alpha))``-th smallest is exceeded by a fresh exchangeable score with probability at most
``alpha`` (the per-step false-alarm rate). The paper's robust rule ``max(floor, median + k MAD)`` over a window
of the row's own past scores is offered as ``rule: mad`` (no such guarantee). numpy only.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

RULES = ("conformal", "mad")


@dataclass(frozen=True)
class DetectorConfig:
    """Detection rule of the corrective executor.

    Attributes:
        rule: ``"conformal"`` (per-offset thresholds from held-out successful rollouts) or ``"mad"`` (the paper's
            ``max(mad_floor, median + mad_k * MAD)`` over the row's last ``mad_window`` smoothed scores).
        alpha: nominal per-step false-alarm rate of the conformal thresholds, in ``(0, 1)`` (default 5%).
        ewma: weight of the newest score in the exponential moving average ``s_t = ewma * E_t + (1 - ewma)
            s_{t-1}`` (the paper uses 0.35); 1 = no smoothing.
        persistence_m, window: fire when at least ``m`` of the last ``W`` steps exceeded the threshold.
        cooldown: steps after a trigger during which the row cannot fire again.
        hysteresis: after a trigger the row re-arms only once its smoothed score fell below ``hysteresis *
            threshold`` (in ``(0, 1]``).
        jump: fire at once when the smoothed score exceeds ``jump * threshold`` (the paper's sharp-jump rule);
            ``None`` disables it (so an isolated spike never fires).
        mad_window, mad_k, mad_floor: the robust rule's window (steps), MAD multiplier and threshold floor.

    Raises:
        ValueError: a field out of range (the message names it).
    """

    rule: str = "conformal"
    alpha: float = 0.05
    ewma: float = 0.35
    persistence_m: int = 3
    window: int = 4
    cooldown: int = 4
    hysteresis: float = 0.8
    jump: float | None = None
    mad_window: int = 50
    mad_k: float = 3.0
    mad_floor: float = 0.1

    def __post_init__(self) -> None:
        checks = [
            ("rule", self.rule in RULES, f"one of {list(RULES)}"),
            ("alpha", 0.0 < self.alpha < 1.0, "a rate in (0, 1)"),
            ("ewma", 0.0 < self.ewma <= 1.0, "a weight in (0, 1]"),
            ("window", int(self.window) >= 1, "an integer >= 1"),
            ("persistence_m", 1 <= int(self.persistence_m) <= int(self.window), f"1 <= m <= window ({self.window})"),
            ("cooldown", int(self.cooldown) >= 0, "an integer >= 0"),
            ("hysteresis", 0.0 < self.hysteresis <= 1.0, "a factor in (0, 1]"),
            ("jump", self.jump is None or self.jump > 1.0, "None or a factor > 1"),
            ("mad_window", int(self.mad_window) >= 3, "an integer >= 3"),
            ("mad_k", self.mad_k > 0, "a value > 0"),
            ("mad_floor", self.mad_floor >= 0, "a value >= 0"),
        ]
        for name, ok, expected in checks:
            if not ok:
                raise ValueError(f"corrective.detector.{name}: expected {expected}, received {getattr(self, name)!r}")


def cosine_deviation(pred: np.ndarray, observed: np.ndarray, eps: float = 1e-8) -> np.ndarray:
    """The paper's deviation ``E = 1 - cos(dz_pred, dz_obs)`` row-wise: float64 ``(B,)`` in ``[0, 2]`` for
    ``(B, D)`` inputs (``cos`` uses ``max(|p| |o|, eps)`` in the denominator, as ``torch.cosine_similarity``)."""
    p, o = np.asarray(pred, np.float64), np.asarray(observed, np.float64)
    denom = np.maximum(np.linalg.norm(p, axis=-1) * np.linalg.norm(o, axis=-1), eps)
    return 1.0 - (p * o).sum(-1) / denom


def ewma(scores: np.ndarray, weight: float) -> np.ndarray:
    """EWMA of one episode's scores ``(T,)`` (float64), started at the first score: ``s_0 = E_0``,
    ``s_t = weight E_t + (1 - weight) s_{t-1}``; the same smoothing the detector applies online."""
    x = np.asarray(scores, np.float64).reshape(-1)
    out = np.empty_like(x)
    for i, e in enumerate(x):
        out[i] = e if i == 0 else weight * e + (1.0 - weight) * out[i - 1]
    return out


def conformal_quantile(scores: np.ndarray, alpha: float) -> float:
    """Split conformal threshold: the ``ceil((n + 1)(1 - alpha))``-th smallest of ``n`` calibration scores
    (``inf`` when that rank exceeds ``n``: too few scores for the rate). A fresh exchangeable score exceeds it
    with probability ``<= alpha``.

    Raises:
        ValueError: ``alpha`` outside ``(0, 1)`` or no scores.
    """
    s = np.sort(np.asarray(scores, np.float64).reshape(-1))
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha: expected a rate in (0, 1), received {alpha}")
    if s.size == 0:
        raise ValueError("conformal_quantile: expected at least one calibration score, received none")
    rank = math.ceil((s.size + 1) * (1.0 - alpha))
    return float("inf") if rank > s.size else float(s[rank - 1])


@dataclass
class ConformalThresholds:
    """Per chunk-offset thresholds ``(H,)`` on the smoothed score.

    Attributes:
        thresholds: float64 ``(H,)``; offset ``i`` = index in the executing chunk of the action about to run.
        alpha: the nominal false-alarm rate they were fitted for.
        counts: int ``(H,)`` calibration scores at each offset (offsets with fewer than ``min_count`` use the
            pooled threshold of all offsets).
        ewma: the smoothing weight the scores were smoothed with (the detector must use the same).
    """

    thresholds: np.ndarray
    alpha: float
    counts: np.ndarray
    ewma: float

    @classmethod
    def fit(
        cls,
        episodes: Sequence[tuple[np.ndarray, np.ndarray]],
        chunk_size: int,
        alpha: float = 0.05,
        ewma_weight: float = 0.35,
        min_count: int = 20,
    ) -> ConformalThresholds:
        """Fit from held-out successful episodes, each ``(raw scores (T,), offsets (T,) int)``; scores are
        smoothed per episode with :func:`ewma`, then a conformal quantile is taken per offset.

        Raises:
            ValueError: no scores, an offset outside ``[0, chunk_size)``, or mismatched lengths.
        """
        smoothed, offs = [], []
        for i, (s, o) in enumerate(episodes):
            s, o = np.asarray(s, np.float64).reshape(-1), np.asarray(o, np.int64).reshape(-1)
            if s.shape != o.shape:
                raise ValueError(f"calibration episode {i}: expected scores and offsets of equal length, "
                                 f"received {s.shape} and {o.shape}")  # fmt: skip
            if o.size and (o.min() < 0 or o.max() >= chunk_size):
                raise ValueError(f"calibration episode {i}: expected offsets in [0, {chunk_size}), received "
                                 f"[{o.min()}, {o.max()}]")  # fmt: skip
            smoothed.append(ewma(s, ewma_weight))
            offs.append(o)
        scores, offsets = np.concatenate(smoothed or [np.zeros(0)]), np.concatenate(offs or [np.zeros(0, np.int64)])
        pooled = conformal_quantile(scores, alpha)
        counts = np.bincount(offsets, minlength=chunk_size)
        thr = np.array([
            conformal_quantile(scores[offsets == i], alpha) if counts[i] >= min_count else pooled
            for i in range(chunk_size)
        ])  # fmt: skip
        return cls(thr, float(alpha), counts, float(ewma_weight))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (``inf`` thresholds as the string ``"inf"``)."""
        thr = [("inf" if math.isinf(v) else float(v)) for v in self.thresholds]
        return {"thresholds": thr, "alpha": self.alpha, "counts": self.counts.tolist(), "ewma": self.ewma}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ConformalThresholds:
        """Inverse of :meth:`to_dict`."""
        thr = np.array([float(v) for v in d["thresholds"]], np.float64)
        return cls(thr, float(d["alpha"]), np.asarray(d["counts"], np.int64), float(d["ewma"]))


def alarm_rate(episodes: Sequence[tuple[np.ndarray, np.ndarray]], thresholds: ConformalThresholds) -> float:
    """Per-step alarm rate: the fraction of steps whose smoothed score exceeds its offset's threshold, over
    episodes ``(raw scores (T,), offsets (T,))`` (the calibration's nominal case on held-out successes)."""
    hits = total = 0
    for s, o in episodes:
        sm = ewma(s, thresholds.ewma)
        hits += int((sm > thresholds.thresholds[np.asarray(o, np.int64)]).sum())
        total += sm.size
    return hits / max(total, 1)


class PersistenceDetector:
    """Online detector over ``B`` rows: EWMA, threshold (conformal per offset or robust MAD), ``m``-of-``W``
    persistence, cool-down and hysteresis (VLA-Corrector's trigger rule, arXiv 2607.01804).

    Args:
        config: the :class:`DetectorConfig`.
        batch_size: ``B``.
        thresholds: required for ``rule: conformal``; its ``ewma`` must equal ``config.ewma``.

    Raises:
        ValueError: conformal rule without thresholds, or a smoothing mismatch.
    """

    def __init__(self, config: DetectorConfig, batch_size: int, thresholds: ConformalThresholds | None = None):
        if config.rule == "conformal":
            if thresholds is None:
                raise ValueError("corrective.detector.rule: 'conformal' needs calibrated thresholds, received None")
            if not math.isclose(thresholds.ewma, config.ewma):
                raise ValueError(f"corrective.detector.ewma: expected {thresholds.ewma} (the calibration's "
                                 f"smoothing), received {config.ewma}")  # fmt: skip
        self.config, self.thresholds, self.batch_size = config, thresholds, int(batch_size)
        b, c = self.batch_size, config
        self.smoothed = np.zeros(b)
        self._started = np.zeros(b, bool)
        self._hits = np.zeros((b, int(c.window)), bool)
        self._cool = np.zeros(b, np.int64)
        self._armed = np.ones(b, bool)
        self._history = np.full((b, int(c.mad_window)), np.nan)

    def reset(self, ids: Sequence[int] | np.ndarray | None = None) -> None:
        """Forget the state of rows ``ids`` (``None`` = all): new episodes."""
        ids = np.arange(self.batch_size) if ids is None else np.asarray(ids, np.int64)
        self.smoothed[ids] = 0.0
        self._started[ids] = False
        self._hits[ids] = False
        self._cool[ids] = 0
        self._armed[ids] = True
        self._history[ids] = np.nan

    def threshold(self, offsets: np.ndarray) -> np.ndarray:
        """Current thresholds float64 ``(B,)`` for chunk offsets int ``(B,)`` (clipped into the table)."""
        if self.config.rule == "conformal":
            thr = self.thresholds.thresholds
            return thr[np.clip(np.asarray(offsets, np.int64), 0, len(thr) - 1)]
        c = self.config
        with warnings.catch_warnings():  # rows without history: all-NaN medians, masked below
            warnings.simplefilter("ignore", RuntimeWarning)
            med = np.nanmedian(np.where(np.isnan(self._history).all(1, keepdims=True), 0.0, self._history), axis=1)
            mad = np.nanmedian(np.abs(self._history - med[:, None]), axis=1)
        enough = (~np.isnan(self._history)).sum(1) >= 3
        return np.where(enough, np.maximum(c.mad_floor, med + c.mad_k * np.nan_to_num(mad)), np.inf)

    def update(self, scores: np.ndarray, offsets: np.ndarray, active: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """One step: smooth the raw scores ``(B,)`` of ``active`` rows (bool ``(B,)``; inactive rows are left
        as they are) and decide.

        Returns:
            ``(fired bool (B,), thresholds float64 (B,))``. A row that fires has its window cleared, starts its
            cool-down and is disarmed until its score falls below ``hysteresis * threshold``.
        """
        c, act = self.config, np.asarray(active, bool)
        raw = np.nan_to_num(np.asarray(scores, np.float64), nan=0.0)
        new = np.where(self._started, c.ewma * raw + (1.0 - c.ewma) * self.smoothed, raw)
        self.smoothed = np.where(act, new, self.smoothed)
        self._started |= act
        thr = self.threshold(offsets)
        over = act & (self.smoothed > thr)
        self._hits[act] = np.roll(self._hits[act], -1, axis=1)
        self._hits[act, -1] = over[act]
        self._armed |= act & (self.smoothed < c.hysteresis * thr)
        self._cool = np.where(act, np.maximum(self._cool - 1, 0), self._cool)
        persistent = self._hits.sum(1) >= c.persistence_m
        jumped = over & (c.jump is not None) & (self.smoothed > (c.jump or np.inf) * thr)
        fired = act & self._armed & (self._cool == 0) & (persistent | jumped)
        self._hits[fired] = False
        self._cool[fired] = int(c.cooldown)
        self._armed[fired] = False
        if c.rule == "mad":  # the window holds past scores: the current one joins after the decision
            self._history[act] = np.roll(self._history[act], -1, axis=1)
            self._history[act, -1] = self.smoothed[act]
        return fired, thr


__all__ = [
    "ConformalThresholds",
    "DetectorConfig",
    "PersistenceDetector",
    "alarm_rate",
    "conformal_quantile",
    "cosine_deviation",
    "ewma",
]
