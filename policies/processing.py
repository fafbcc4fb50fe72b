"""The one observation/action transform shared by training and inference: raw windows -> normalised tensors,
normalised chunks -> action units, and the :class:`~policylink.data.normalize.Normalizer` built for a config.

It is :class:`policylink.data.sampler.SequenceDataset`'s item transform: the same
:func:`~policylink.data.sampler.feature_layout` per key, then ``Normalizer.normalize_feature``, so a policy sees
the same numbers at inference as it did in training.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from policylink.adapters.schema import ACTION_KEY, FeatureSpec
from policylink.data.normalize import Normalizer
from policylink.data.sampler import feature_layout


def normalizer_modes(
    features: Mapping[str, FeatureSpec], state_mode: str, action_mode: str, image_mode: str = "identity"
) -> dict[str, str]:
    """Normaliser mode per key: ``image_mode`` for images, ``state_mode`` for vectors, ``action_mode`` for
    ``action``."""
    modes = {k: (image_mode if f.is_image else state_mode) for k, f in features.items()}
    modes[ACTION_KEY] = action_mode
    return modes


def observation_tensors(
    obs: Mapping[str, Any],
    features: Mapping[str, FeatureSpec],
    normalizer: Normalizer,
    device: torch.device | str = "cpu",
) -> dict[str, torch.Tensor]:
    """Raw observation windows -> normalised float32 tensors on ``device``.

    Args:
        obs: key -> ``(B, T, *shape)`` numpy arrays or tensors in raw units (images uint8 ``(B, T, H, W, 3)``
            or float in ``[0, 1]``).
        features: the keys to convert (the policy's observation features).
        normalizer: the policy's normaliser (every key must be configured).

    Returns:
        key -> float32 ``(B, T, D)`` or, for images and pointmaps (``observation.pointmaps.*``, metres),
        ``(B, T, 3, H, W)``.

    Raises:
        KeyError: a feature is missing from ``obs``. ImageScaleError: a float image outside ``[0, 1]``.
        MissingStatsError: a key has no normaliser mode.
    """
    out = {}
    for key, feat in features.items():
        if key not in obs:
            raise KeyError(f"{key}: missing from the observation; received keys {sorted(obs)}")
        x = obs[key].detach().cpu().numpy() if isinstance(obs[key], torch.Tensor) else np.asarray(obs[key])
        x = feature_layout(key, x, feat.is_image)
        t = torch.from_numpy(np.ascontiguousarray(x)).to(device)
        out[key] = normalizer.normalize_feature(key, t)
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
