"""The one observation/action transform shared by training and inference: a policy's processor chain
(:class:`~policylink.data.processors.Processors`, built from its config by :func:`processors_for`), raw windows ->
model tensors through it (:func:`observation_tensors`), normalised chunks -> action units, and the normaliser
modes of a config.

The training sampler (:class:`policylink.data.sampler.SequenceDataset`) runs the same chain object on its windows,
so a policy sees the same numbers at inference as it did in training, bit for bit.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from policylink.adapters.schema import ACTION_KEY, TASK_KEY, FeatureSpec
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
    (image and pointmap keys, ``encoder.crop_ratio`` < 1: random in training, centred at inference) and ``tokenize``
    (a config with a ``language`` section: the instruction ``task`` through its encoder).

    Raises:
        ProcessorError: ``normalizer`` lacks a key's mode.
    """
    keys = [k for k in cfg.observation_keys if k in features]
    images = [k for k in keys if features[k].is_image]
    model_steps: list[dict[str, Any]] = []
    ratio = float(cfg.encoder.crop_ratio)
    pixel_keys = [k for k in keys if len(features[k].shape) == 3]
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


def actions_to_units(chunk: torch.Tensor, normalizer: Normalizer) -> np.ndarray:
    """Normalised chunk ``(B, H, A)`` -> float32 numpy ``(B, H, A)`` in the ActionSpec's units."""
    return np.ascontiguousarray(
        normalizer.unnormalize_feature(ACTION_KEY, chunk.float()).cpu().numpy(), dtype=np.float32
    )


def actions_to_normalized(
    actions: np.ndarray | torch.Tensor, normalizer: Normalizer, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """Actions ``(..., A)`` in units -> normalised float32 tensor on ``device`` (inverse of
    :func:`actions_to_units`)."""
    t = actions if isinstance(actions, torch.Tensor) else torch.from_numpy(np.asarray(actions, np.float32))
    return normalizer.normalize_feature(ACTION_KEY, t.float().to(device))


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
