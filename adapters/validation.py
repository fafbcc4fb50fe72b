"""Runtime checks of values against the contract of :mod:`policylink.adapters.schema`.

One concept: does *this* observation or action conform? :func:`validate_observation` checks a (batched)
observation against a spec's features, :func:`batch_size_of` reads the batch size ``B`` they share, and
:func:`coerce_action` applies the env ``step`` contract to one action (``STEP_BEFORE_RESET`` is that contract's
message for a step before any reset). The specs themselves, and per-feature ``check`` methods, live in
:mod:`policylink.adapters.schema`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from policylink.adapters.schema import (
    TASK_KEY,
    ActionError,
    ActionSpec,
    EnvSpec,
    FeatureSpec,
    ObservationError,
    PolicySpec,
)

STEP_BEFORE_RESET = "step() before reset(): call reset() first"


def coerce_action(spec: ActionSpec, action: Any) -> np.ndarray:
    """The env ``step`` contract for one action, shared by :class:`RemoteEnv` and the simulators.

    Array-likes (lists, float64 arrays...) are converted with ``np.asarray(action, dtype=np.float32)``, checked
    to have shape ``(A,)`` and finite values, then clipped to the spec's ``[low, high]`` limits (actions outside
    the limits are clipped, not refused).

    Args:
        spec: the env's ActionSpec (``A = spec.dim``).
        action: an array-like of ``A`` numbers in the spec's units.

    Returns:
        float32 ``(A,)``, a new array within the limits.

    Raises:
        ActionError: ``action`` is None or not numeric, has another shape, or holds NaN/inf (the message names
            the dimension, the expected and the received value).
    """
    if action is None:
        raise ActionError([f"action: expected {_expected(spec)}, received None"])
    try:
        a = np.asarray(action, dtype=np.float32)
    except (TypeError, ValueError) as e:
        raise ActionError([f"action: expected {_expected(spec)}, received {type(action).__name__} ({e})"]) from None
    low, high = _limits(spec)
    if a.shape != low.shape:
        raise ActionError([f"action: expected shape ({spec.dim},) {tuple(spec.names)}, received shape {a.shape}"])
    if not np.isfinite(a).all():
        raise ActionError(
            [
                f"action[{i}] ({spec.names[i]}): expected a finite value, received {float(a[i])}"
                for i in np.flatnonzero(~np.isfinite(a))
            ]
        )
    return np.minimum(np.maximum(a, low), high)  # np.clip's values, without its Python-level dispatch


def _expected(spec: ActionSpec) -> str:
    return f"an array-like of {spec.dim} floats {tuple(spec.names)}"


_LIMITS: dict[int, tuple[ActionSpec, np.ndarray, np.ndarray]] = {}  # id(spec) -> (spec, low, high)


def _limits(spec: ActionSpec) -> tuple[np.ndarray, np.ndarray]:
    """The spec's float32 ``(A,)`` limits, made once per spec (:func:`coerce_action` runs on every env step, two or
    three times a step through the env transport; the entry holds the spec, so its id is not reused while cached;
    at most 256 entries)."""
    entry = _LIMITS.get(id(spec))
    if entry is None or entry[0] is not spec:
        if len(_LIMITS) >= 256:
            _LIMITS.clear()
        low, high = spec.low_array, spec.high_array
        low.flags.writeable = high.flags.writeable = False
        entry = _LIMITS[id(spec)] = (spec, low, high)
    return entry[1], entry[2]


def validate_observation(
    features: Mapping[str, FeatureSpec] | PolicySpec | EnvSpec, obs: Mapping[str, Any], batch_dims: int = 0
) -> Mapping[str, Any]:
    """Check that ``obs`` carries every feature with the right dtype and shape.

    Extra keys are allowed (an env may provide more than a policy reads).

    Args:
        features: a features mapping, or a spec whose ``observation_features`` are used.
        obs: the observation; arrays shaped ``(*batch, *feature.shape)``.
        batch_dims: number of leading batch dims (0 for one step of one env, 1 for ``(B, ...)``).

    Returns:
        ``obs`` unchanged.

    Raises:
        ObservationError: listing every missing key and every dtype/shape mismatch.
    """
    if isinstance(features, (PolicySpec, EnvSpec)):
        features = features.observation_features
    if not isinstance(obs, Mapping):
        raise ObservationError(
            [f"observation: expected a mapping of feature key -> value, received {type(obs).__name__}"]
        )
    problems = []
    for key, feat in features.items():
        if key not in obs:
            problems.append(f"{key}: missing (expected {feat.dtype} {feat.shape}); received keys {sorted(obs)}")
            continue
        problems += feat.check(key, obs[key], batch_dims)
    if problems:
        raise ObservationError(problems)
    return obs


def batch_size_of(obs_batch: Mapping[str, Any], keys: Iterable[str] | None = None) -> int:
    """``B``, the leading dim shared by the features ``keys`` of a batch (default: every key; ``task`` counts by
    its length). Keys absent from the batch are skipped (:func:`validate_observation` reports those).

    Raises:
        ObservationError: no feature to count, a value without a leading dim, or leading dims that disagree
            (every size is listed).
    """
    names = list(obs_batch) if keys is None else [k for k in keys if k in obs_batch]
    sizes: dict[str, int] = {}
    for key in names:
        value = obs_batch[key]
        shape = (len(value),) if key == TASK_KEY and isinstance(value, (list, tuple)) else np.shape(value)
        if not shape:
            raise ObservationError([f"{key}: expected a leading batch dim B, received a scalar or bare str"])
        sizes[key] = int(shape[0])
    if not sizes:
        raise ObservationError(["observation: expected at least one batched feature, received none"])
    if len(set(sizes.values())) != 1:
        raise ObservationError([f"batch size: expected the same leading dim for every feature, received {sizes}"])
    return next(iter(sizes.values()))
