"""The data side of a training run: its PolicySpec read from the episode store, the store/env checks, and the
train / validation datasets (with the policy's processor chain and its normaliser).

Observation features, ActionSpec and control frequency come from the store's ``info`` (written by the recorder and
by the LeRobot importer), so a store recorded on a real robot or imported from LeRobot trains with no registered
env. When the run names an env, its EnvSpec fills in what the store does not record (a diffusion_policy replay
buffer records nothing), and a store recorded on another env is rejected.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from policylink.adapters.obs_modes import obs_mode_env_kwargs
from policylink.adapters.registry import make_env
from policylink.adapters.schema import ACTION_KEY, ActionSpec, ControlMode, EnvSpec, FeatureSpec, PolicySpec, SpecError
from policylink.data.buffer import EpisodeStore, StoreError
from policylink.data.normalize import Normalizer
from policylink.data.sampler import SequenceDataset, split_episodes
from policylink.data.stats import compute_stats
from policylink.policies.processing import normalizer_modes, processors_for, window_horizon
from policylink.train.losses import BatchFields

if TYPE_CHECKING:
    from policylink.train.config import DatasetConfig, TrainConfig


def training_data(
    cfg: TrainConfig, fields: BatchFields, warn: bool = True
) -> tuple[PolicySpec, SequenceDataset, SequenceDataset | None]:
    """The run's PolicySpec (from the store, :func:`policy_spec_for`) and the train / validation datasets (``None``
    without held-out episodes), with the batch ``fields`` the loss reads; the datasets run the policy's processor
    chain (``train_ds.processors``, saved with the checkpoint; its normaliser, ``train_ds.processors.normalizer``,
    holds the statistics of the training episodes). ``warn`` prints a warning when ``val_every`` is set but no
    episode is held out.

    Raises:
        ValueError: ``dataset.path`` is not an episode store or holds no episode, the store does not match
            ``dataset.env`` (:func:`check_store_matches`) or yields no training window, or the spec cannot be built.
        StoreInfoError: the store lacks info the spec needs and nothing supplies it (names it).
    """
    env_spec = env_spec_for(cfg.dataset)
    store = open_training_store(cfg.dataset.path)
    if store.n_episodes == 0:
        raise ValueError(
            f"dataset.path: expected a store with at least one episode, received {cfg.dataset.path!r} with 0 episodes"
        )
    check_store_matches(store, cfg, env_spec)
    train_eps, val_eps = split_episodes(store.n_episodes, cfg.dataset.val_fraction, cfg.dataset.split_seed)
    p = cfg.policy
    keys = list(p.observation_keys)
    stats = compute_stats(store, keys=[*keys, ACTION_KEY], episodes=train_eps)
    spec = policy_spec_for(cfg, store, env_spec, (stats[ACTION_KEY]["min"], stats[ACTION_KEY]["max"]))
    normalizer = Normalizer(
        stats, normalizer_modes(spec.observation_features, p.state_norm_mode, p.action_norm_mode, p.image_norm_mode)
    )
    processors = processors_for(p, spec.observation_features, normalizer)
    # Default padding: every step of every episode anchors a window (episodes can be shorter than H).
    window = dict(
        horizon=window_horizon(p.n_obs_steps, p.chunk_size),
        obs_keys=keys,
        processors=processors,
        step_fields=fields.step_keys(),
        episode_fields=fields.episode,
        **processors.window_args(),  # frame stack; policy.memory sega trains on chains of consecutive windows
    )
    train_ds = SequenceDataset(store, episodes=train_eps, **window)
    if len(train_ds) == 0:
        raise ValueError(
            f"dataset {cfg.dataset.path!r}: expected training windows, received none "
            f"({len(train_eps)} training episodes)"
        )
    val_ds = SequenceDataset(store, episodes=val_eps, **window) if len(val_eps) else None
    if val_ds is None and cfg.val_every > 0 and warn:
        print(
            f"WARNING: val_every={cfg.val_every} but no episode is held out (dataset.val_fraction="
            f"{cfg.dataset.val_fraction}, {store.n_episodes} episodes): no validation loss will be logged",
            file=sys.stderr,
        )
    return spec, train_ds, val_ds


def open_training_store(path: str) -> EpisodeStore:
    """``dataset.path`` opened read-only: an episode store, or a LeRobot v3 dataset folder (``meta/info.json``),
    read through :func:`policylink.data.lerobot.open_lerobot` (no import step).

    Raises:
        ValueError: ``path`` is neither (names ``dataset.path`` and both expected layouts).
    """
    from policylink.data.lerobot import is_lerobot_dataset, open_lerobot

    if is_lerobot_dataset(path):
        return open_lerobot(path)
    try:
        return EpisodeStore(path, "r")
    except StoreError as e:
        raise ValueError(
            f"dataset.path: expected an episode store or a LeRobot v3 dataset folder (meta/info.json), received "
            f"{path!r}: {e}"
        ) from None


def check_store_matches(store: EpisodeStore, cfg: TrainConfig, env_spec: EnvSpec | None) -> None:
    """Check that the demos in ``store`` were recorded on ``cfg.dataset.env`` with that env's observation shapes
    and action size (from the store's ``info``; a foreign store without it is not checked). Nothing to check
    without an env.

    Raises:
        ValueError: names the field (``dataset.env``, an observation key, ``action``), expected and received.
    """
    if env_spec is None:
        return
    info = store.info
    recorded_env = info.get("env")
    if recorded_env is not None and recorded_env != cfg.dataset.env:
        raise ValueError(
            f"dataset.env: the store {cfg.dataset.path!r} was recorded on env {recorded_env!r}, received "
            f"dataset.env={cfg.dataset.env!r}"
        )
    features = info.get("features") or {}
    for key in cfg.policy.observation_keys:
        feature = env_spec.observation_features.get(key)
        recorded = (features.get(key) or {}).get("shape")
        if feature is not None and recorded is not None and tuple(recorded) != tuple(feature.shape):
            raise ValueError(
                f"{key}: env {cfg.dataset.env!r} with obs_mode={cfg.dataset.obs_mode!r} gives shape "
                f"{tuple(feature.shape)}, the store {cfg.dataset.path!r} holds {tuple(recorded)} (record it with "
                f"the same obs_mode / image_size, or set dataset.obs_mode / dataset.image_size to match)"
            )
    recorded_action = (info.get("action") or {}).get("names")
    if recorded_action is not None and len(recorded_action) != env_spec.action.dim:
        raise ValueError(
            f"action: env {cfg.dataset.env!r} has {env_spec.action.dim} action dimensions, the store holds "
            f"{len(recorded_action)} ({recorded_action})"
        )


def env_spec_for(dataset: DatasetConfig) -> EnvSpec | None:
    """The EnvSpec of ``dataset.env`` with its ``obs_mode`` / ``image_size``, or None when no env is named."""
    if not dataset.env:
        return None
    env = make_env(dataset.env, **obs_mode_env_kwargs(dataset.obs_mode, dataset.image_size))
    try:
        return env.env_spec
    finally:
        env.close()


def policy_spec_for(
    cfg: TrainConfig,
    store: EpisodeStore,
    env_spec: EnvSpec | None = None,
    action_range: tuple[np.ndarray, np.ndarray] | None = None,
) -> PolicySpec:
    """The PolicySpec of a run, from the store (:func:`store_features`, :func:`store_action_spec`,
    :func:`store_control_frequency`): its features for
    ``policy.observation_keys``, its ActionSpec and control rate; the env (when named) fills in what the store
    does not record, and ``dataset.control_mode`` + ``action_range`` (the stored actions' per-dimension
    ``(min, max)``) build an ActionSpec for a store that records none.

    Raises:
        ValueError: an observation key the env does not provide or the store does not hold (named, with what
            they provide), a recorded shape that differs from the stored array's.
        StoreInfoError: the store lacks the action spec or the control rate and nothing supplies it (names it).
    """
    p = cfg.policy
    if env_spec is not None:
        missing = [k for k in p.observation_keys if k not in env_spec.observation_features]
        if missing:
            raise ValueError(
                f"policy.observation_keys: {missing} not provided by env {cfg.dataset.env!r} with "
                f"obs_mode={cfg.dataset.obs_mode!r}; it provides {sorted(env_spec.observation_features)}"
            )
    return PolicySpec(
        store_features(store, p.observation_keys, env_spec),
        store_action_spec(store, env_spec, cfg.dataset.control_mode, action_range),
        n_obs_steps=p.n_obs_steps,
        chunk_size=p.chunk_size,
        n_action_steps=p.n_action_steps,
        control_frequency=store_control_frequency(store, env_spec),
    )


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


__all__ = [
    "StoreInfoError",
    "check_store_matches",
    "env_spec_for",
    "open_training_store",
    "policy_spec_for",
    "store_action_spec",
    "store_control_frequency",
    "store_features",
    "training_data",
]
