"""The PolicySpec of a training run, read from its episode store: observation features, ActionSpec and control
frequency come from the store's ``info`` (written by the recorder and by the LeRobot importer), so a store
recorded on a real robot or imported from LeRobot trains with no registered env. When the run names an env,
its EnvSpec fills in what the store does not record (a diffusion_policy replay buffer records nothing).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from policylink.adapters.schema import ACTION_KEY, ActionSpec, ControlMode, EnvSpec, FeatureSpec, SpecError
from policylink.data.buffer import EpisodeStore


class StoreInfoError(ValueError):
    """The store does not record something the PolicySpec needs and no env or config field supplies it; the
    message names the missing ``info`` entry and the config field that would supply it."""


def store_features(store: EpisodeStore, keys: Sequence[str], env_spec: EnvSpec | None = None) -> dict[str, FeatureSpec]:
    """FeatureSpecs of observation ``keys``: the store's ``info["features"]`` entry, else the env's, else the
    stored array's dtype and per-step shape (no names, no unit).

    Raises:
        ValueError: a key is not in the store (names what it holds), or the chosen spec's shape or dtype differs
            from the stored array's.
    """
    recorded = store.info.get("features") or {}
    out: dict[str, FeatureSpec] = {}
    for key in keys:
        if key not in store.keys:
            raise ValueError(
                f"{key}: expected in the store {str(store.path)!r} (policy.observation_keys), it holds "
                f"{sorted(k for k in store.keys if k.startswith('observation.'))}"
            )
        shape, dtype = tuple(store.feature_shape(key)), str(store.feature_dtype(key))
        if recorded.get(key) is not None:
            feature, source = FeatureSpec.from_dict(recorded[key]), "the store's info"
        elif env_spec is not None and key in env_spec.observation_features:
            feature, source = env_spec.observation_features[key], f"env {env_spec.name!r}"
        else:
            feature, source = FeatureSpec(dtype=dtype, shape=shape), "the array"
        if (feature.shape, feature.dtype) != (shape, dtype):
            raise ValueError(
                f"{key}: {source} gives {feature.dtype} {feature.shape}, the store {str(store.path)!r} holds "
                f"{dtype} {shape}"
            )
        out[key] = feature
    return out


def store_action_spec(
    store: EpisodeStore,
    env_spec: EnvSpec | None = None,
    control_mode: str = "",
    action_range: tuple[np.ndarray, np.ndarray] | None = None,
) -> ActionSpec:
    """The ActionSpec of the stored actions.

    In order: the store's complete ``info["action"]`` (the recorder writes it); the env's; or, with
    ``control_mode`` set, one built from the stored action names (``info["action"]["names"]`` or
    ``info["features"]["action"]["names"]``, else ``a0, a1, ...``), limits ``action_range`` (per-dimension
    ``(min, max)`` of the stored actions, float ``(A,)`` each; a constant dimension gets the next float above)
    and unknown units (``""``, so a compatibility check against an env names them).

    Raises:
        StoreInfoError: none of the three is available (names the missing info and ``dataset.env`` /
            ``dataset.control_mode``).
        ValueError: the ActionSpec's dimension differs from the stored actions', or ``control_mode`` is not a
            :class:`~policylink.adapters.schema.ControlMode`.
    """
    info = store.info
    recorded: Mapping[str, Any] = info.get("action") or {}
    dim = int(np.prod(store.feature_shape(ACTION_KEY)))
    try:
        spec = ActionSpec.from_dict(recorded) if recorded else None
    except (KeyError, SpecError):  # partial (e.g. names only)
        spec = None
    if spec is None and env_spec is not None:
        spec = env_spec.action
    if spec is None and control_mode:
        spec = _action_spec_from_data(info, dim, control_mode, action_range)
    if spec is None:
        have = sorted(recorded) or "nothing"
        raise StoreInfoError(
            f"action: the store {str(store.path)!r} records no complete ActionSpec in its info (info['action'] has "
            f"{have}; expected {sorted(ActionSpec.__dataclass_fields__)}) and dataset.env is empty; name the env the "
            f"demos come from (dataset.env) or set dataset.control_mode (one of {[m.value for m in ControlMode]}) "
            "to build one from the stored action names and range"
        )
    if spec.dim != dim:
        raise ValueError(f"action: the ActionSpec has {spec.dim} dimensions, the store holds {dim}")
    return spec


def store_control_frequency(store: EpisodeStore, env_spec: EnvSpec | None = None) -> float:
    """Control rate of the stored episodes, Hz: ``info["fps"]``, else the env's.

    Raises:
        StoreInfoError: neither is known (names ``info['fps']`` and ``dataset.env``).
    """
    fps = store.info.get("fps")
    if fps is not None and float(fps) > 0:
        return float(fps)
    if env_spec is not None:
        return float(env_spec.control_frequency)
    raise StoreInfoError(
        f"fps: the store {str(store.path)!r} does not record its control frequency (info['fps'], received "
        f"{fps!r}) and dataset.env is empty; name the env the demos come from (dataset.env) or record it with "
        "EpisodeStore.update_info(fps=HZ)"
    )


def _action_spec_from_data(
    info: Mapping[str, Any], dim: int, control_mode: str, action_range: tuple[np.ndarray, np.ndarray] | None
) -> ActionSpec:
    if control_mode not in {m.value for m in ControlMode}:
        raise ValueError(
            f"dataset.control_mode: expected one of {[m.value for m in ControlMode]}, received {control_mode!r}"
        )
    names = (info.get("action") or {}).get("names") or ((info.get("features") or {}).get(ACTION_KEY) or {}).get("names")
    if names is None or len(names) != dim:
        names = [f"a{i}" for i in range(dim)]
    if action_range is None:
        raise ValueError("action_range: expected the stored actions' (min, max) to build an ActionSpec, received None")
    low = np.asarray(action_range[0], np.float64).reshape(dim)
    high = np.maximum(np.asarray(action_range[1], np.float64).reshape(dim), np.nextafter(low, np.inf))
    return ActionSpec(
        names=tuple(str(n) for n in names),
        control_mode=ControlMode(control_mode),
        units=("",) * dim,
        low=tuple(float(x) for x in low),
        high=tuple(float(x) for x in high),
    )


__all__ = ["StoreInfoError", "store_action_spec", "store_control_frequency", "store_features"]
