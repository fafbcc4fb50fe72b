"""The observation-encoder settings (:class:`EncoderConfig`), torch-free so that parsing a config or printing
``--help`` never imports torch; the encoders themselves live in :mod:`policylink.policies.common.encoders`."""

from __future__ import annotations

from dataclasses import dataclass, field

VISION_BACKBONES = ("resnet18", "small_conv")
POINTMAP_ENCODERS = ("keypoints", "pointnet")


@dataclass
class EncoderConfig:
    """Observation-encoder settings.

    Attributes:
        vision_backbone: ``"resnet18"`` (torchvision, ``weights=None``, GroupNorm) or ``"small_conv"`` (3 conv
            layers; fast CPU configs).
        crop_ratio: random-crop (train) / centre-crop (eval) side as a fraction of the image side, in
            ``(0, 1]``; ``1.0`` disables cropping. Diffusion Policy crops 96 px frames to 84 px (0.875-0.9).
        num_keypoints: spatial-softmax keypoints per image (feature size ``2 * num_keypoints``).
        share_vision_encoder: one image encoder for every camera (True) or one per camera.
        state_hidden_dims: hidden sizes of the state MLP; empty passes the normalised state through unchanged
            (Diffusion Policy's low-dim variant).
        state_out_dim: output size of the state MLP (ignored when ``state_hidden_dims`` is empty).
        pointmap_encoder: ``"keypoints"`` (conv trunk + spatial-softmax attention read out as base-frame XYZ) or
            ``"pointnet"`` (per-pixel MLP + max-pool over the pixels: DP3's encoder, invariant to where in the
            image a scene point lands, so to a camera that moves about the scene).
    """

    vision_backbone: str = "resnet18"
    crop_ratio: float = 0.9
    num_keypoints: int = 32
    share_vision_encoder: bool = True
    state_hidden_dims: list[int] = field(default_factory=list)
    state_out_dim: int = 64
    pointmap_encoder: str = "keypoints"


__all__ = ["POINTMAP_ENCODERS", "VISION_BACKBONES", "EncoderConfig"]
