"""Streaming per-feature statistics (mean, std, min, max, q01, q99, count) over an episode store or arrays.

Means and variances accumulate in float64 and merge with Chan et al.'s parallel update ("Updating Formulae
and a Pairwise Algorithm for Computing Sample Variances", 1979), so large offsets (10000, 10001, 10002 in
float32 -> std 0.8165) keep their precision. Quantiles are those of the pooled data over every episode,
never an average of per-episode quantiles. uint8 images are counted in exact per-channel 256-bin histograms
and reported in the scale they are applied in: float ``[0, 1]``, channel-first shape ``(3, 1, 1)`` (as
LeRobot's ``stats.json``). The :class:`~policylink.data.normalize.Normalizer` is re-exported here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from policylink.adapters.pointmaps import is_pointmap_key, pointmap_valid
from policylink.data.normalize import MissingStatsError, Normalizer, NormMode

if TYPE_CHECKING:
    from policylink.data.buffer import EpisodeStore

QUANTILES = {"q01": 0.01, "q99": 0.99}
DEFAULT_MAX_QUANTILE_SAMPLES = 1_000_000
_SKIP_KEYS = ("done",)


class RunningStats:
    """Streaming statistics of a float feature with per-step shape ``shape`` (reduced over steps only).

    ``update`` takes ``(N, *shape)`` arrays; mean/M2 accumulate in float64 and merge with Chan's formula.
    For quantiles a uniform sample of at most ``max_samples`` rows is kept (bottom-k of random keys, which
    merges exactly); below that cap the quantiles are exact.

    Args:
        shape: per-step feature shape, e.g. ``(D,)``.
        max_samples: cap on rows kept for the q01/q99 estimate.
        seed: seed of the subsampling keys (only used past the cap).
    """

    def __init__(self, shape: Sequence[int], max_samples: int = DEFAULT_MAX_QUANTILE_SAMPLES, seed: int = 0):
        self.shape = tuple(int(s) for s in shape)
        self.count = 0
        self.mean = np.zeros(self.shape, np.float64)
        self.m2 = np.zeros(self.shape, np.float64)
        self.min = np.full(self.shape, np.inf)
        self.max = np.full(self.shape, -np.inf)
        self.max_samples = int(max_samples)
        self._rng = np.random.default_rng(seed)
        self._samples = np.zeros((0, *self.shape), np.float64)
        self._keys = np.zeros(0, np.float64)

    def update(self, x: np.ndarray) -> None:
        """Add rows ``x`` ``(N, *shape)`` (any real dtype). Raises ValueError on a shape mismatch."""
        x = np.asarray(x, dtype=np.float64)
        if tuple(x.shape[1:]) != self.shape:
            raise ValueError(f"RunningStats.update: expected rows of shape {self.shape}, received {x.shape[1:]}")
        if x.shape[0] == 0:
            return
        other = RunningStats(self.shape, self.max_samples)
        other.count = x.shape[0]
        other.mean = x.mean(axis=0)
        other.m2 = ((x - other.mean) ** 2).sum(axis=0)
        other.min, other.max = x.min(axis=0), x.max(axis=0)
        other._samples, other._keys = x, self._rng.random(x.shape[0])
        self.merge(other)

    def merge(self, other: RunningStats) -> None:
        """Fold ``other`` (same shape) into ``self`` (Chan et al. pairwise update; pooled quantile sample)."""
        if other.shape != self.shape:
            raise ValueError(f"RunningStats.merge: expected shape {self.shape}, received {other.shape}")
        if other.count == 0:
            return
        n_a, n_b = self.count, other.count
        n = n_a + n_b
        delta = other.mean - self.mean
        self.mean = self.mean + delta * (n_b / n)
        self.m2 = self.m2 + other.m2 + delta**2 * (n_a * n_b / n)
        self.count = n
        self.min, self.max = np.minimum(self.min, other.min), np.maximum(self.max, other.max)
        samples = np.concatenate([self._samples, other._samples])
        keys = np.concatenate([self._keys, other._keys])
        if len(keys) > self.max_samples:
            keep = np.argpartition(keys, self.max_samples)[: self.max_samples]
            samples, keys = samples[keep], keys[keep]
        self._samples, self._keys = samples, keys

    def result(self) -> dict[str, np.ndarray]:
        """``{"mean","std","min","max","q01","q99"}`` float64 arrays of ``shape`` and ``"count"`` int64 ``(1,)``.

        ``std`` is the population standard deviation (ddof 0). Raises ValueError when nothing was added.
        """
        if self.count == 0:
            raise ValueError("RunningStats.result: no data was added")
        out = {
            "mean": self.mean.copy(),
            "std": np.sqrt(np.maximum(self.m2 / self.count, 0.0)),
            "min": self.min.copy(),
            "max": self.max.copy(),
        }
        for name, q in QUANTILES.items():
            out[name] = np.quantile(self._samples, q, axis=0)
        out["count"] = np.array([self.count], np.int64)
        return out


class ImageStats:
    """Exact per-channel statistics of uint8 RGB frames ``(N, H, W, 3)``, in float ``[0, 1]`` scale.

    Each channel keeps a 256-bin histogram, so mean, std, min, max and quantiles (numpy's default linear
    interpolation) are exact for any number of frames and merge by addition.
    """

    def __init__(self, channels: int = 3):
        self.hist = np.zeros((channels, 256), np.int64)
        self.frames = 0

    def update(self, frames: np.ndarray) -> None:
        """Add uint8 frames ``(N, H, W, C)``. Raises ValueError for another dtype or channel count."""
        frames = np.asarray(frames)
        c = self.hist.shape[0]
        if frames.dtype != np.uint8 or frames.ndim != 4 or frames.shape[-1] != c:
            raise ValueError(
                f"ImageStats.update: expected uint8 (N, H, W, {c}), received {frames.dtype} {frames.shape}"
            )
        flat = frames.reshape(-1, c)
        for ch in range(c):
            self.hist[ch] += np.bincount(flat[:, ch], minlength=256)
        self.frames += frames.shape[0]

    def merge(self, other: ImageStats) -> None:
        """Add ``other``'s histograms."""
        self.hist += other.hist
        self.frames += other.frames

    def result(self) -> dict[str, np.ndarray]:
        """Stats of shape ``(C, 1, 1)`` in ``[0, 1]`` scale (``count`` = frames, int64 ``(1,)``)."""
        if self.frames == 0:
            raise ValueError("ImageStats.result: no frames were added")
        values = np.arange(256, dtype=np.float64) / 255.0
        n = self.hist.sum(axis=1)
        mean = (self.hist * values).sum(axis=1) / n
        var = (self.hist * (values[None, :] - mean[:, None]) ** 2).sum(axis=1) / n
        nz = self.hist > 0
        out = {
            "mean": mean,
            "std": np.sqrt(var),
            "min": values[np.argmax(nz, axis=1)],
            "max": values[255 - np.argmax(nz[:, ::-1], axis=1)],
        }
        for name, q in QUANTILES.items():
            out[name] = np.array([_hist_quantile(h, values, q) for h in self.hist])
        out = {k: v.reshape(-1, 1, 1) for k, v in out.items()}
        out["count"] = np.array([self.frames], np.int64)
        return out


class PointmapStats:
    """Per-channel statistics of float pointmaps ``(N, H, W, 3)`` (x, y, z in metres) over valid pixels only
    (:func:`~policylink.adapters.pointmaps.pointmap_valid`: all-zero fill pixels are skipped), reported
    channel-first ``(3, 1, 1)`` like images, so one affine per coordinate applies to ``(..., 3, H, W)`` tensors
    wherever a pixel is (a per-pixel statistic would tie the normalisation to one camera placement).
    """

    def __init__(self, max_samples: int = DEFAULT_MAX_QUANTILE_SAMPLES):
        self._stats = RunningStats((3,), max_samples)

    def update(self, points: np.ndarray) -> None:
        """Add pointmaps ``(N, H, W, 3)``. Raises ValueError for another layout."""
        points = np.asarray(points)
        if points.ndim != 4 or points.shape[-1] != 3:
            raise ValueError(f"PointmapStats.update: expected (N, H, W, 3) pointmaps, received {points.shape}")
        rows = points.reshape(-1, 3)
        self._stats.update(rows[pointmap_valid(rows)])

    def result(self) -> dict[str, np.ndarray]:
        """Stats of shape ``(3, 1, 1)`` in metres (``count`` = valid pixels, int64 ``(1,)``)."""
        out = {k: (v if k == "count" else v.reshape(3, 1, 1)) for k, v in self._stats.result().items()}
        return out


def is_image_array(x: Any) -> bool:
    """True for uint8 ``(N, H, W, 3)`` arrays (image features over time)."""
    return np.dtype(x.dtype) == np.uint8 and len(x.shape) == 4 and x.shape[-1] == 3


def compute_stats(
    store: EpisodeStore,
    keys: Sequence[str] | None = None,
    episodes: Sequence[int] | None = None,
    *,
    max_quantile_samples: int = DEFAULT_MAX_QUANTILE_SAMPLES,
    progress: bool = False,
) -> dict[str, dict[str, np.ndarray]]:
    """Statistics of each feature of ``store``, streamed episode by episode.

    Args:
        store: an open :class:`~policylink.data.buffer.EpisodeStore`.
        keys: features to describe (default: every key except ``done``).
        episodes: episode indices to include (default: all), e.g. the training split.
        max_quantile_samples: cap on rows kept for q01/q99 of float features.
        progress: show a tqdm bar over episodes.

    Returns:
        key -> {"mean","std","min","max","q01","q99": float64 arrays, "count": int64 ``(1,)``}; low-dim
        features have their per-step shape ``(D,)``, uint8 images ``(3, 1, 1)`` in ``[0, 1]`` scale, pointmaps
        (``observation.pointmaps.*``) ``(3, 1, 1)`` in metres over valid pixels.

    Raises:
        KeyError: a key is not in the store. ValueError: no episode selected.
    """
    keys = [k for k in store.keys if k not in _SKIP_KEYS] if keys is None else list(keys)
    episodes = range(store.n_episodes) if episodes is None else list(episodes)
    if len(episodes) == 0:
        raise ValueError("compute_stats: expected at least one episode, received none")
    acc = {k: _accumulator(k, store.array(k), max_quantile_samples) for k in keys}
    it = episodes
    if progress:
        from tqdm import tqdm

        it = tqdm(episodes, desc="stats", unit="ep")
    for i in it:
        ep = store.get_episode(i, keys)
        for k in keys:
            acc[k].update(_rows(ep[k]))
    return {k: a.result() for k, a in acc.items()}


def stats_from_arrays(
    arrays: Mapping[str, np.ndarray], *, max_quantile_samples: int = DEFAULT_MAX_QUANTILE_SAMPLES
) -> dict[str, dict[str, np.ndarray]]:
    """Statistics of in-memory arrays ``key -> (N, *shape)`` (same output as :func:`compute_stats`)."""
    out = {}
    for k, x in arrays.items():
        acc = _accumulator(k, x, max_quantile_samples)
        acc.update(_rows(np.asarray(x)))
        out[k] = acc.result()
    return out


def _accumulator(key: str, arr: Any, max_samples: int) -> RunningStats | ImageStats | PointmapStats:
    if is_image_array(arr):
        return ImageStats(arr.shape[-1])
    if is_pointmap_key(key):
        return PointmapStats(max_samples)
    if np.dtype(arr.dtype).kind not in "biuf":
        raise ValueError(f"{key}: expected a numeric feature for statistics, received dtype {arr.dtype}")
    return RunningStats(arr.shape[1:], max_samples)


def _rows(x: np.ndarray) -> np.ndarray:
    return x if is_image_array(x) or np.asarray(x).ndim == 4 else np.asarray(x, dtype=np.float64)


def _hist_quantile(hist: np.ndarray, values: np.ndarray, q: float) -> float:
    """numpy's default (linear) quantile of the multiset given by ``hist`` counts of ``values``."""
    n = int(hist.sum())
    h = (n - 1) * q
    lo, hi = int(np.floor(h)), int(np.ceil(h))
    cdf = np.cumsum(hist)
    v_lo = values[np.searchsorted(cdf, lo, side="right")]
    v_hi = values[np.searchsorted(cdf, hi, side="right")]
    return float(v_lo + (h - lo) * (v_hi - v_lo))


__all__ = [
    "QUANTILES",
    "ImageStats",
    "MissingStatsError",
    "NormMode",
    "Normalizer",
    "PointmapStats",
    "RunningStats",
    "compute_stats",
    "stats_from_arrays",
]
