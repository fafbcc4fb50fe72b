"""The one observation/action transform shared by training and inference: a policy's processor chain
(:class:`~policylink.data.processors.Processors`, built from its config by :func:`processors_for`; the one thing a
policy is built with), raw windows -> model tensors through it (:func:`observation_tensors`), normalised chunks <->
action units through its ``normalize`` step, and the normaliser modes of a config.

The training sampler (:class:`policylink.data.sampler.SequenceDataset`) runs the same chain object on its windows,
so a policy sees the same numbers at inference as it did in training, bit for bit.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from policylink.adapters.pointmaps import POINTMAP_PREFIX, is_pointmap_key
from policylink.adapters.schema import ACTION_KEY, IMAGE_PREFIX, TASK_KEY, FeatureSpec
from policylink.data.normalize import Normalizer
from policylink.data.processors import Processors
from policylink.policies.temporal_config import chain_windows


def normalizer_modes(
    features: Mapping[str, FeatureSpec], state_mode: str, action_mode: str, image_mode: str = "identity"
) -> dict[str, str]:
    """Normaliser mode per key: ``image_mode`` for images, ``state_mode`` for vectors, ``action_mode`` for
    ``action``."""
    modes = {k: (image_mode if f.is_image else state_mode) for k, f in features.items()}
    modes[ACTION_KEY] = action_mode
    return modes


def processors_for(cfg: Any, features: Mapping[str, FeatureSpec], normalizer: Normalizer | None) -> Processors:
    """The processor chain of a policy config (:class:`~policylink.policies.config.PolicyConfig`) over its
    observation ``features``: frame stack (``n_obs_steps``; a ``sega`` memory's training chain), layout (images by
    their spec: HWC uint8), normalisation with ``normalizer`` (None: none), and the steps its model runs: ``crop``
    (image and pointmap keys, ``encoder.crop_ratio`` < 1: random in training, centred at inference; pointmaps and
    the images stacked with them not when ``encoder.pointmap_crop`` is False) and ``tokenize``
    (a config with a ``language`` section: the instruction ``task`` through its encoder).

    Raises:
        ProcessorError: ``normalizer`` lacks a key's mode.
    """
    keys = [k for k in cfg.observation_keys if k in features]
    images = [k for k in keys if features[k].is_image]
    model_steps: list[dict[str, Any]] = []
    ratio = float(cfg.encoder.crop_ratio)
    pixel_keys = [k for k in keys if len(features[k].shape) == 3]
    if not getattr(cfg.encoder, "pointmap_crop", True):  # pointmaps, and the images stacked with them, uncropped
        uncropped = {k for k in keys if is_pointmap_key(k)}
        uncropped |= {IMAGE_PREFIX + k[len(POINTMAP_PREFIX) :] for k in uncropped}
        pixel_keys = [k for k in pixel_keys if k not in uncropped]
    if pixel_keys and ratio < 1.0:
        model_steps.append({"step": "crop", "keys": pixel_keys, "ratio": ratio, "train": "random", "eval": "center"})
    language = getattr(cfg, "language", None)
    if language is not None:
        model_steps.append({"step": "tokenize", "key": TASK_KEY, "encoder": language.encoder,
                            "max_tokens": int(language.max_tokens)})  # fmt: skip
    stack = chain_windows(cfg)
    return Processors.for_keys(
        keys, normalizer, n_obs_steps=cfg.n_obs_steps, chain_windows=stack.get("chain_windows", 1),
        chain_stride=stack.get("chain_stride", 1), images=images, model_steps=model_steps,
    )  # fmt: skip


def observation_tensors(
    obs: Mapping[str, Any],
    features: Mapping[str, FeatureSpec],
    processors: Processors,
    device: torch.device | str = "cpu",
) -> dict[str, torch.Tensor]:
    """Raw observation windows -> the policy's model inputs on ``device``, through ``processors``
    (:meth:`~policylink.data.processors.Processors.process`, the training sampler's transform).

    Args:
        obs: key -> ``(B, T, *shape)`` numpy arrays or tensors in raw units (images uint8 ``(B, T, H, W, 3)``
            or float in ``[0, 1]``).
        features: the keys to convert (the policy's observation features).
        processors: the policy's processor chain.

    Returns:
        key -> float32 ``(B, T, D)`` or, for images and pointmaps (``observation.pointmaps.*``, metres),
        ``(B, T, 3, H, W)``.

    Raises:
        KeyError: a feature is missing from ``obs``. ImageScaleError: a float image outside ``[0, 1]``.
        MissingStatsError: a key has no normaliser mode.
    """
    out = {}
    for key in features:
        if key not in obs:
            raise KeyError(f"{key}: missing from the observation; received keys {sorted(obs)}")
        x = obs[key].detach().cpu().numpy() if isinstance(obs[key], torch.Tensor) else obs[key]
        out[key] = torch.from_numpy(np.ascontiguousarray(processors.process(key, x))).to(device)
    return out


def chain_of(
    processors: Any, normalizer: Normalizer | None, cfg: Any, features: Mapping[str, FeatureSpec], where: str
) -> Processors:
    """The processor chain a policy is built with: ``processors`` as given, or, from the deprecated ``normalizer``
    (keyword alias for one release; also a :class:`~policylink.data.normalize.Normalizer` passed where the chain
    goes, the old positional argument), the chain of ``cfg`` over ``features`` with it (:func:`processors_for`),
    with a DeprecationWarning.

    Raises:
        ValueError: both a chain and a normaliser. TypeError: neither (names ``where`` and what it received).
    """
    if isinstance(processors, Normalizer) and normalizer is None:
        processors, normalizer = None, processors
    if normalizer is None:
        if not isinstance(processors, Processors):
            raise TypeError(f"{where}: processors: expected a Processors chain (policies.processing.processors_for), "
                            f"received {type(processors).__name__}")  # fmt: skip
        return processors
    if processors is not None:
        raise ValueError(f"{where}: normalizer is a deprecated alias of processors; received both, give processors")
    warnings.warn(f"{where}(normalizer=...) is deprecated (removed in the next release): pass processors="
                  "processors_for(cfg, features, normalizer) (policylink.policies.processing)", DeprecationWarning,
                  stacklevel=3)  # fmt: skip
    return processors_for(cfg, features, normalizer)


def actions_to_units(chunk: torch.Tensor, processors: Processors) -> np.ndarray:
    """Normalised chunk ``(B, H, A)`` -> float32 numpy ``(B, H, A)`` in the ActionSpec's units (the inverse of the
    chain's ``normalize`` step for ``action``; as it is without one)."""
    norm, x = processors.normalizer, chunk.float()
    return np.ascontiguousarray((x if norm is None else norm.unnormalize_feature(ACTION_KEY, x)).cpu().numpy(),
                                dtype=np.float32)  # fmt: skip


def actions_to_normalized(
    actions: np.ndarray | torch.Tensor, processors: Processors, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """Actions ``(..., A)`` in units -> normalised float32 tensor on ``device`` (the chain's ``normalize`` step for
    ``action``; inverse of :func:`actions_to_units`)."""
    t = actions if isinstance(actions, torch.Tensor) else torch.from_numpy(np.asarray(actions, np.float32))
    t, norm = t.float().to(device), processors.normalizer
    return t if norm is None else norm.normalize_feature(ACTION_KEY, t)


def window_horizon(n_obs_steps: int, chunk_size: int) -> int:
    """Action steps a training window must hold so that its chunk starts at the newest observation.

    Dataset windows start at the oldest observation ``w = t - (n_obs_steps - 1)``; a chunk (index 0 = now,
    the PolicyAdapter convention) is its last ``chunk_size`` actions: ``chunk_size + n_obs_steps - 1`` in all.
    """
    return chunk_size + n_obs_steps - 1


def chunk_from_window(actions: torch.Tensor, n_obs_steps: int) -> torch.Tensor:
    """The chunk ``(..., chunk_size, A)`` (index 0 = the newest observation's step) of window actions
    ``(..., chunk_size + n_obs_steps - 1, A)``."""
    return actions[..., n_obs_steps - 1 :, :]
