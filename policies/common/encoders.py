"""Observation encoders: an image encoder (a trunk of :mod:`~policylink.policies.common.backbones`, spatial
softmax), an MLP for state vectors, and :class:`ObservationEncoder` combining them (and the pointmap encoders)
per PolicySpec feature into one conditioning vector (Chi et al. 2023, Diffusion Policy, arXiv 2303.04137).

Images enter as float32 ``(..., 3, H, W)`` in ``[0, 1]`` (the ``policylink.adapters.images.to_float_chw``
convention); state features enter already normalised (float32 ``(..., D)``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from policylink.adapters.pointmaps import is_pointmap_key
from policylink.adapters.schema import FeatureSpec
from policylink.policies.common.backbones import RandomCrop, SpatialSoftmax, resnet18_groupnorm, small_conv
from policylink.policies.common.conv_paths import use_measured_convs
from policylink.policies.common.encoder_config import VISION_BACKBONES, EncoderConfig
from policylink.policies.common.pointmap_encoder import pointmap_encoders


class ImageEncoder(nn.Module):
    """Crop -> trunk -> spatial softmax -> linear+ReLU: ``(N, 3, H, W)`` in ``[0, 1]`` -> ``(N, 2K)``.

    Raises:
        ValueError: unknown ``backbone`` (expected one of :data:`VISION_BACKBONES`).
    """

    def __init__(self, image_hw: tuple[int, int], backbone: str, crop_ratio: float, num_keypoints: int):
        super().__init__()
        if backbone not in VISION_BACKBONES:
            raise ValueError(f"vision_backbone: expected one of {VISION_BACKBONES}, received {backbone!r}")
        self.crop = RandomCrop(crop_ratio)
        self.trunk = use_measured_convs(resnet18_groupnorm() if backbone == "resnet18" else small_conv())
        with torch.no_grad():
            probe = torch.zeros(1, 3, *self.crop.output_size(*image_hw))
            channels = self.trunk(probe).shape[1]
        self.pool = SpatialSoftmax(channels, num_keypoints)
        self.out = nn.Sequential(nn.Linear(2 * num_keypoints, 2 * num_keypoints), nn.ReLU())
        self.out_dim = 2 * num_keypoints

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = self.crop(images) * 2.0 - 1.0
        return self.out(self.pool(self.trunk(x)))

    def forward_pixels(self, frames: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
        """The same features from raw frames, uint8 ``(N, H, W, 3)`` -> ``(N, 2K)``: crop the bytes, then one
        per-channel affine ``u * scale + shift`` (``scale``, ``shift`` float32 ``(3,)``) that folds the
        ``/ 255``, the normaliser and this encoder's ``* 2 - 1`` (see
        :func:`policylink.policies.common.frame_features.pixel_affine`). Equal to :meth:`forward` of the
        normalised float frames up to float rounding."""
        x = self.crop(frames.permute(0, 3, 1, 2)).contiguous()  # uint8 (N, 3, h, w), 1 byte a pixel to copy
        x = torch.addcmul(shift.view(1, 3, 1, 1), x.float(), scale.view(1, 3, 1, 1))
        return self.out(self.pool(self.trunk(x)))


class StateMLP(nn.Module):
    """MLP (Linear + Mish) over a normalised state ``(..., D)`` -> ``(..., out_dim)``; identity if no layers."""

    def __init__(self, in_dim: int, hidden_dims: list[int], out_dim: int):
        super().__init__()
        if not hidden_dims:
            self.net: nn.Module = nn.Identity()
            self.out_dim = in_dim
            return
        layers: list[nn.Module] = []
        dims = [in_dim, *hidden_dims]
        for a, b in zip(dims[:-1], dims[1:]):
            layers += [nn.Linear(a, b), nn.Mish()]
        layers.append(nn.Linear(dims[-1], out_dim))
        self.net = nn.Sequential(*layers)
        self.out_dim = out_dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class ObservationEncoder(nn.Module):
    """Encode a window of observations into one conditioning vector.

    Image features (``FeatureSpec.is_image``) go through an :class:`ImageEncoder` (shared across cameras or
    one per camera); pointmaps (``observation.pointmaps.<camera>``, normalised ``(B, T, 3, H, W)``) through a
    :class:`~policylink.policies.common.pointmap_encoder.PointmapEncoder`, stacked with the same camera's image
    when both are features; every other numeric feature through a :class:`StateMLP`. Per step, the features are
    concatenated in sorted key order; the ``T = n_obs_steps`` steps are then flattened (Diffusion Policy's
    global conditioning).

    Args:
        features: the PolicySpec's observation features (text features are not supported here).
        n_obs_steps: ``T``.
        cfg: :class:`EncoderConfig`.

    Forward: ``obs[key]`` float32 ``(B, T, 3, H, W)`` in ``[0, 1]`` for images, ``(B, T, D)`` normalised for
    vectors -> float32 ``(B, out_dim)`` with ``out_dim = T * step_dim``.

    Raises:
        ValueError: a feature is text (``task``) or has an unsupported shape; no feature at all.
    """

    def __init__(self, features: Mapping[str, FeatureSpec], n_obs_steps: int, cfg: EncoderConfig):
        super().__init__()
        self.pointmap_encoders, self.stacked_images = pointmap_encoders(features, cfg)
        self.pointmap_keys = sorted(k for k in features if is_pointmap_key(k))
        self.image_keys = sorted(k for k, f in features.items() if f.is_image and k not in self.stacked_images.values())
        self.vector_keys = sorted(k for k, f in features.items() if not f.is_image and k not in self.pointmap_keys)
        for key in self.vector_keys:
            f = features[key]
            if f.is_string or len(f.shape) != 1:
                raise ValueError(
                    f"{key}: expected an image (H, W, 3) uint8 or a vector (D,) feature, received "
                    f"dtype {f.dtype} shape {f.shape}"
                )
        if not self.image_keys and not self.vector_keys and not self.pointmap_keys:
            raise ValueError("observation_features: expected at least one feature, received none")
        self.n_obs_steps = n_obs_steps
        self.image_encoders = camera_encoders(self.image_keys, features, cfg)
        self.state_encoders = nn.ModuleDict(
            {
                module_name(k): StateMLP(features[k].shape[0], list(cfg.state_hidden_dims), cfg.state_out_dim)
                for k in self.vector_keys
            }
        )
        self.shared = cfg.share_vision_encoder
        step_dim = sum(e.out_dim for e in self.state_encoders.values())
        step_dim += len(self.image_keys) * (2 * cfg.num_keypoints)
        step_dim += sum(e.out_dim for e in self.pointmap_encoders.values())
        self.step_dim = step_dim
        self.out_dim = n_obs_steps * step_dim

    def forward(self, obs: Mapping[str, torch.Tensor]) -> torch.Tensor:
        parts = []
        for key in sorted(self.image_keys + self.vector_keys + self.pointmap_keys):
            x = obs[key]
            b, t = x.shape[:2]
            if key in self.pointmap_keys:
                rgb = obs[self.stacked_images[key]].flatten(0, 1) if key in self.stacked_images else None
                parts.append(self.pointmap_encoders[module_name(key)](x.flatten(0, 1), rgb).reshape(b, t, -1))
            elif key in self.image_keys:
                enc = self.image_encoders["shared" if self.shared else module_name(key)]
                parts.append(enc(x.flatten(0, 1)).reshape(b, t, -1))
            else:
                parts.append(self.state_encoders[module_name(key)](x))
        return torch.cat(parts, dim=-1).flatten(1)

    def image_encoder(self, key: str) -> ImageEncoder:
        """The :class:`ImageEncoder` of image feature ``key`` (the shared one when ``share_vision_encoder``)."""
        return self.image_encoders["shared" if self.shared else module_name(key)]

    def combine(self, image_features: Mapping[str, torch.Tensor], obs: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """:meth:`forward` from per-frame image features already computed, ``{key: (B, T, 2K)}`` for every image
        key, and normalised vector windows ``obs[key]`` ``(B, T, D)`` -> ``(B, out_dim)`` (same order and
        concatenation). Encoders with pointmaps have no such split.

        Raises:
            ValueError: the encoder has pointmap features.
        """
        if self.pointmap_keys:
            raise ValueError(f"combine: pointmap features {self.pointmap_keys} are encoded with their images")
        parts = [
            image_features[k] if k in self.image_keys else self.state_encoders[module_name(k)](obs[k])
            for k in sorted(self.image_keys + self.vector_keys)
        ]
        return torch.cat(parts, dim=-1).flatten(1)


def camera_encoders(image_keys: Sequence[str], features: Mapping[str, Any], cfg: Any) -> nn.ModuleDict:
    """One :class:`ImageEncoder` per camera in ``image_keys`` (module name from the key), or a single ``"shared"``
    one when ``cfg.share_vision_encoder`` (sized by the first camera); ``cfg``: an encoder config
    (``vision_backbone``, ``crop_ratio``, ``num_keypoints``, ``share_vision_encoder``). Each outputs
    ``(N, 2 * num_keypoints)`` keypoints."""
    encoders = nn.ModuleDict()
    for i, key in enumerate(image_keys):
        if cfg.share_vision_encoder and i > 0:
            break
        h, w, _ = features[key].shape
        name = "shared" if cfg.share_vision_encoder else module_name(key)
        encoders[name] = ImageEncoder((h, w), cfg.vision_backbone, cfg.crop_ratio, cfg.num_keypoints)
    return encoders


def module_name(key: str) -> str:
    """The ``nn.ModuleDict`` name of feature ``key`` (dots are not allowed there): ``.`` -> ``__``."""
    return key.replace(".", "__")
