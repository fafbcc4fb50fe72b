"""The lean observation path of image policies at inference (issue 19): raw uint8 frames go through one
per-channel affine (the ``/ 255``, the normaliser and the encoder's ``* 2 - 1`` folded together), and each
frame of a row's history window is encoded once, its features kept while the frame stays in the window.

Without it, every policy call converts the whole window (``B x T`` frames) to float, normalises it, rescales
it and runs the vision trunk on every frame again: with ``n_obs_steps = 2`` and a new chunk every step (async
/ real-time chunking, ``n_action_steps = 1``), every frame is encoded twice.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from policylink.adapters.schema import FeatureSpec
from policylink.data.normalize import Normalizer
from policylink.data.processors import Processors
from policylink.policies.processing import observation_tensors


def pixel_affine(normalizer: Normalizer, key: str, device: torch.device | str) -> tuple[torch.Tensor, torch.Tensor]:
    """``(scale, shift)`` float32 ``(3,)`` such that ``u * scale + shift`` of a uint8 pixel ``u`` equals
    ``normalize(u / 255) * 2 - 1`` (the image encoder's input), per channel.

    Raises:
        ValueError: the normaliser's statistics of ``key`` are not per channel (e.g. per pixel): no fold.
        MissingStatsError: ``key`` is not configured.
    """
    probe = torch.stack([torch.zeros(3, 1, 1), torch.ones(3, 1, 1)])  # normalise(0) and normalise(1)
    out = normalizer.normalize_feature(key, probe)
    if tuple(out.shape) != (2, 3, 1, 1):
        raise ValueError(f"{key}: expected per-channel image statistics (3, 1, 1), received a {tuple(out.shape)} map")
    offset, slope = out[0].flatten(), (out[1] - out[0]).flatten()  # normalise(x) = offset + slope * x
    scale, shift = 2.0 * slope / 255.0, 2.0 * offset - 1.0
    return scale.to(device, torch.float32), shift.to(device, torch.float32)


class FrameFeatureCache:
    """Per-row, per-slot image features of the history windows, following the windows as they roll.

    Every ``append`` gives each row's newest frame a new id: a fresh row (first observation after a reset)
    holds it in all ``T`` slots (the window repeats the first frame), other rows drop their oldest slot. The
    cached features roll the same way, so a frame's features stay valid while it is in the window; ``reset``
    forgets rows. :meth:`window_features` encodes only the frames whose features are missing, each once (a
    fresh row's repeated first frame too).

    Args:
        n_obs_steps: ``T``.
    """

    def __init__(self, n_obs_steps: int):
        self.t = int(n_obs_steps)
        self._slot_ids: np.ndarray | None = None  # (B, T) int64 frame id per window slot
        self._feat_ids: dict[str, np.ndarray] = {}  # key -> (B, T) frame id of the cached features (-1: none)
        self._feats: dict[str, torch.Tensor] = {}  # key -> (B, T, F)
        self._next_id = 0
        self.encoded_frames = 0  # frames run through an encoder (for benchmarks and tests)

    def reset(self, env_ids: np.ndarray | None = None) -> None:
        """Forget rows ``env_ids`` (``None``: everything, including ``B``)."""
        if env_ids is None:
            self._slot_ids, self._feat_ids, self._feats = None, {}, {}
            return
        for ids in self._feat_ids.values():
            ids[env_ids] = -1

    def append(self, fresh: np.ndarray) -> None:
        """One observation per row was appended to the windows; ``fresh`` bool ``(B,)`` marks the rows whose
        window restarted (filled with this frame)."""
        b = len(fresh)
        if self._slot_ids is None or len(self._slot_ids) != b:
            self.reset()
            self._slot_ids = np.full((b, self.t), -1, dtype=np.int64)
            fresh = np.ones(b, dtype=bool)
        new = self._next_id + np.arange(b)
        self._next_id += b
        old = ~fresh
        self._slot_ids[old] = np.roll(self._slot_ids[old], -1, axis=1)
        self._slot_ids[old, -1] = new[old]
        self._slot_ids[fresh] = new[fresh][:, None]
        rows = torch.as_tensor(np.flatnonzero(old))
        for key, ids in self._feat_ids.items():
            ids[old] = np.roll(ids[old], -1, axis=1)
            ids[:, -1] = -1
            ids[fresh] = -1
            feats = self._feats[key]
            feats[rows.to(feats.device)] = torch.roll(feats[rows.to(feats.device)], -1, dims=1)

    def window_features(self, key: str, rows: np.ndarray, window: np.ndarray, encode) -> torch.Tensor:
        """Features ``(B', T, F)`` of rows ``rows`` (unique ids) whose windows are ``window`` ``(B', T, ...)``;
        ``encode(frames (N, ...)) -> (N, F)`` runs on the missing frames only, each distinct frame once.

        Raises:
            RuntimeError: no ``append`` yet.
        """
        if self._slot_ids is None:
            raise RuntimeError("FrameFeatureCache: window_features before any append()")
        want = self._slot_ids[rows]  # (B', T)
        have = self._feat_ids.get(key)
        need = np.ones_like(want, dtype=bool) if have is None else have[rows] != want
        if need.any():
            r, s = np.nonzero(need)
            uniq, first, inverse = np.unique(want[r, s], return_index=True, return_inverse=True)
            feats = encode(window[r[first], s[first]])  # (U, F)
            self.encoded_frames += len(uniq)
            if have is None:
                have = self._feat_ids[key] = np.full_like(self._slot_ids, -1)
                self._feats[key] = feats.new_zeros(*self._slot_ids.shape, feats.shape[1])
            store = self._feats[key]
            rr = torch.as_tensor(rows[r], device=store.device)
            store[rr, torch.as_tensor(s, device=store.device)] = feats[torch.as_tensor(inverse, device=feats.device)]
            have[rows[r], s] = want[r, s]
        return self._feats[key][torch.as_tensor(rows, device=self._feats[key].device)]


def lean_latents(
    encoder: Any,
    obs: Mapping[str, Any],
    features: Mapping[str, FeatureSpec],
    processors: Processors,
    device: torch.device,
    cache: FrameFeatureCache | None = None,
    rows: np.ndarray | None = None,
) -> torch.Tensor | None:
    """Observation latents ``(B, D)`` through the lean path, or None where it does not apply (an encoder other
    than :class:`~policylink.policies.common.encoders.ObservationEncoder`, pointmaps, float or non-numpy frames,
    per-pixel image statistics): the caller then takes the full path.

    Args:
        encoder: the model's observation encoder.
        obs: raw windows ``(B, T, ...)`` (images uint8 ``(B, T, H, W, 3)``).
        features: the model's observation features.
        processors: the policy's processor chain (its normaliser is folded into the pixel affine; its vectors go
            through :func:`~policylink.policies.processing.observation_tensors`).
        cache, rows: the rows' :class:`FrameFeatureCache` and their ids (``obs`` are those rows' windows); without
            them every frame is encoded.
    """
    from policylink.policies.common.encoders import ObservationEncoder

    if type(encoder) is not ObservationEncoder or encoder.pointmap_keys or not encoder.image_keys:
        return None
    frames = {k: obs[k] for k in encoder.image_keys}
    if not all(isinstance(f, np.ndarray) and f.dtype == np.uint8 and f.ndim == 5 for f in frames.values()):
        return None
    normalizer = processors.normalizer
    if normalizer is None:
        return None
    try:
        affines = {k: pixel_affine(normalizer, k, device) for k in encoder.image_keys}
    except ValueError:
        return None
    image_features = {}
    for key, window in frames.items():
        enc, (scale, shift) = encoder.image_encoder(key), affines[key]

        def encode(f: np.ndarray, enc=enc, scale=scale, shift=shift) -> torch.Tensor:
            return enc.forward_pixels(torch.from_numpy(np.ascontiguousarray(f)).to(device), scale, shift)

        if cache is not None and rows is not None:
            image_features[key] = cache.window_features(key, rows, window, encode)
        else:
            b, t = window.shape[:2]
            image_features[key] = encode(window.reshape(b * t, *window.shape[2:])).reshape(b, t, -1)
    vectors = {k: features[k] for k in encoder.vector_keys}
    return encoder.combine(image_features, observation_tensors(obs, vectors, processors, device))
