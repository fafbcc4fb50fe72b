"""Per-feature affine normalizer with an exact inverse, one code path for numpy arrays and torch tensors.

Every mode is ``y = (x - offset) * scale`` with per-dimension ``offset``/``scale`` computed once from the
stats (float64, stored float32), and ``x = y / scale + offset`` back:

- ``mean_std``: offset = mean, scale = 1 / std.
- ``min_max``: [min, max] -> [-1, 1]: offset = (max + min) / 2, scale = 2 / (max - min).
- ``quantile``: [q01, q99] -> [-1, 1], as ``min_max`` with the quantiles (values outside map past +-1).
- ``identity``: offset 0, scale 1.

A constant dimension (spread below ``eps``) gets scale 1, so it maps to a finite ``x - offset`` (0 for the
constant itself) in both directions, and a warning names it at fit time. Masked dimensions (``mask`` False,
e.g. a gripper kept in raw units) get offset 0 / scale 1 and pass through bit-exactly both ways.
``state_dict()`` holds plain arrays only (``<key>/offset``, ``<key>/scale``, ``<key>/mode``), for safetensors.
torch is never imported at module level: tensors are recognised by duck typing and handled lazily.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from enum import StrEnum
from typing import Any

import numpy as np


class NormMode(StrEnum):
    """Normalization mode of one feature."""

    MEAN_STD = "mean_std"
    MIN_MAX = "min_max"
    QUANTILE = "quantile"
    IDENTITY = "identity"


_MODE_CODES = {m: i for i, m in enumerate(NormMode)}
_STATS_NEEDED = {
    NormMode.MEAN_STD: ("mean", "std"),
    NormMode.MIN_MAX: ("min", "max"),
    NormMode.QUANTILE: ("q01", "q99"),
    NormMode.IDENTITY: (),
}


class MissingStatsError(KeyError):
    """A feature was requested for normalization but has no statistics (it never passes through silently)."""

    def __str__(self) -> str:
        return str(self.args[0])


class ConstantFeatureWarning(UserWarning):
    """A normalized dimension is constant in the data; it is mapped with scale 1 (finite output)."""


class Normalizer:
    """Normalize / unnormalize features of a batch.

    Args:
        stats: key -> stat name -> array (as :func:`policylink.data.stats.compute_stats` returns); image
            stats have shape ``(3, 1, 1)`` and apply to float CHW ``(..., 3, H, W)`` in ``[0, 1]``.
        modes: key -> :class:`NormMode` (or its string) for every feature to normalize.
        masks: optional key -> bool array of the stats' shape; False dims are left untouched.
        eps: spread below which a dimension counts as constant.

    Raises:
        MissingStatsError: a mode other than ``identity`` names a key (or stat) absent from ``stats``.
        ValueError: unknown mode, or a mask whose shape differs from the stats'.
    """

    def __init__(
        self,
        stats: Mapping[str, Mapping[str, Any]],
        modes: Mapping[str, NormMode | str],
        masks: Mapping[str, Any] | None = None,
        eps: float = 1e-6,
    ):
        masks = dict(masks or {})
        self._params: dict[str, tuple[np.ndarray, np.ndarray, NormMode]] = {}
        self._torch_cache: dict[tuple[str, Any, Any], tuple[Any, Any]] = {}
        unknown_masks = sorted(set(masks) - set(modes))
        if unknown_masks:
            raise ValueError(f"masks: keys {unknown_masks} have no mode; modes are given for {sorted(modes)}")
        for key, mode in modes.items():
            try:
                mode = NormMode(mode)
            except ValueError:
                raise ValueError(
                    f"modes[{key!r}]: expected one of {[m.value for m in NormMode]}, received {mode!r}"
                ) from None
            offset, scale = _affine(key, stats, mode, eps)
            if key in masks:
                m = np.asarray(masks[key], dtype=bool)
                if m.shape != offset.shape:
                    raise ValueError(f"masks[{key!r}]: expected shape {offset.shape}, received {m.shape}")
                offset, scale = np.where(m, offset, 0.0), np.where(m, scale, 1.0)
            self._params[key] = (offset.astype(np.float32), scale.astype(np.float32), mode)

    # ------------------------------------------------------------------ api

    @property
    def keys(self) -> list[str]:
        """Features this normalizer transforms."""
        return list(self._params)

    def mode(self, key: str) -> NormMode:
        """Mode of ``key``. Raises MissingStatsError."""
        return self._get(key)[2]

    def normalize_feature(self, key: str, x: Any) -> Any:
        """``(x - offset) * scale`` for a float numpy array or torch tensor ``(..., *shape)``; same type back.

        Raises:
            MissingStatsError: ``key`` is not configured. TypeError: ``x`` is not floating point.
        """
        offset, scale = self._like(key, x)
        return (x - offset) * scale

    def unnormalize_feature(self, key: str, y: Any) -> Any:
        """Exact inverse of :meth:`normalize_feature`: ``y / scale + offset``."""
        offset, scale = self._like(key, y)
        return y / scale + offset

    def normalize(self, batch: Mapping[str, Any]) -> dict[str, Any]:
        """Normalize every configured key of ``batch``; other entries are returned unchanged only when they are
        not floating point (text, masks, indices).

        Raises:
            MissingStatsError: a floating-point entry has no configured mode (configure it, e.g. as
                ``identity``, rather than letting it pass through).
        """
        return self._map(batch, self.normalize_feature)

    def state_dict(self) -> dict[str, np.ndarray]:
        """Plain arrays: ``<key>/offset``, ``<key>/scale`` (float32, stats shape), ``<key>/mode`` (int64 ``(1,)``)."""
        out = {}
        for key, (offset, scale, mode) in self._params.items():
            out[f"{key}/offset"], out[f"{key}/scale"] = offset.copy(), scale.copy()
            out[f"{key}/mode"] = np.array([_MODE_CODES[mode]], np.int64)
        return out

    @classmethod
    def from_state_dict(cls, state: Mapping[str, Any]) -> Normalizer:
        """Rebuild from :meth:`state_dict` output (numpy arrays or torch tensors). Raises KeyError naming a
        missing entry."""
        modes = list(NormMode)
        self = cls({}, {})
        for name in state:
            if not name.endswith("/mode"):
                continue
            key = name[: -len("/mode")]
            for part in ("offset", "scale"):
                if f"{key}/{part}" not in state:
                    raise KeyError(f"state_dict: missing {key}/{part} (present: {sorted(state)})")
            self._params[key] = (
                _to_numpy(state[f"{key}/offset"]).astype(np.float32),
                _to_numpy(state[f"{key}/scale"]).astype(np.float32),
                modes[int(_to_numpy(state[name]).reshape(-1)[0])],
            )
        return self

    def __repr__(self) -> str:
        return "Normalizer(" + ", ".join(f"{k}={m.value}" for k, (_, _, m) in sorted(self._params.items())) + ")"

    # ------------------------------------------------------------------ helpers

    def _get(self, key: str) -> tuple[np.ndarray, np.ndarray, NormMode]:
        if key not in self._params:
            raise MissingStatsError(f"feature {key!r}: no normalization stats/mode; configured: {self.keys}")
        return self._params[key]

    def _like(self, key: str, x: Any) -> tuple[Any, Any]:
        offset, scale, _ = self._get(key)
        if isinstance(x, np.ndarray):
            if x.dtype.kind != "f":
                raise TypeError(f"{key}: expected a floating-point array, received dtype {x.dtype}")
            return offset.astype(x.dtype, copy=False), scale.astype(x.dtype, copy=False)
        if not _is_tensor(x):
            raise TypeError(f"{key}: expected a numpy array or torch tensor, received {type(x).__name__}")
        if not x.is_floating_point():
            raise TypeError(f"{key}: expected a floating-point tensor, received dtype {x.dtype}")
        cache_key = (key, x.device, x.dtype)
        if cache_key not in self._torch_cache:
            import torch

            self._torch_cache[cache_key] = (
                torch.as_tensor(offset).to(x.device, x.dtype),
                torch.as_tensor(scale).to(x.device, x.dtype),
            )
        return self._torch_cache[cache_key]

    def _map(self, batch: Mapping[str, Any], fn: Any) -> dict[str, Any]:
        out = {}
        for key, value in batch.items():
            if key in self._params:
                out[key] = fn(key, value)
            elif _is_float(value):
                raise MissingStatsError(
                    f"feature {key!r}: floating-point entry without a normalization mode; "
                    f"configured: {self.keys} (use mode 'identity' to keep it raw)"
                )
            else:
                out[key] = value
        return out


def _affine(
    key: str, stats: Mapping[str, Mapping[str, Any]], mode: NormMode, eps: float
) -> tuple[np.ndarray, np.ndarray]:
    needed = _STATS_NEEDED[mode]
    if mode is NormMode.IDENTITY:
        shape = np.asarray(stats[key]["mean"]).shape if key in stats and "mean" in stats[key] else ()
        return np.zeros(shape), np.ones(shape)
    if key not in stats:
        raise MissingStatsError(
            f"feature {key!r}: mode {mode.value!r} needs stats {needed}, but the stats "
            f"only have features {sorted(stats)}"
        )
    missing = [s for s in needed if s not in stats[key]]
    if missing:
        raise MissingStatsError(
            f"feature {key!r}: mode {mode.value!r} needs stats {list(needed)}, missing "
            f"{missing} (have {sorted(stats[key])})"
        )
    a, b = (np.asarray(_to_numpy(stats[key][s]), np.float64) for s in needed)
    if mode is NormMode.MEAN_STD:
        offset, spread = a, b
    else:
        offset, spread = (a + b) / 2.0, (b - a) / 2.0
    constant = spread < eps
    if np.any(constant):
        warnings.warn(
            f"feature {key!r} ({mode.value}): dims {np.flatnonzero(constant).tolist()} are constant "
            f"(spread < {eps}); they are shifted by the offset with scale 1",
            ConstantFeatureWarning,
            stacklevel=3,
        )
    return offset, 1.0 / np.where(constant, 1.0, spread)


def _is_tensor(x: Any) -> bool:
    return type(x).__module__.startswith("torch") and hasattr(x, "is_floating_point")


def _is_float(x: Any) -> bool:
    if isinstance(x, np.ndarray):
        return x.dtype.kind == "f"
    return _is_tensor(x) and bool(x.is_floating_point())


def _to_numpy(x: Any) -> np.ndarray:
    if _is_tensor(x):
        return x.detach().cpu().numpy()
    return np.asarray(x)


__all__ = ["ConstantFeatureWarning", "MissingStatsError", "NormMode", "Normalizer"]
