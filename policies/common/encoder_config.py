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
        workspace_lower: the lower corner ``[x, y, z]`` (metres, robot base frame) of a workspace box (empty with
            ``workspace_upper`` empty: no box, the default). With a box, a ``pointnet`` encoder leaves the points
            outside it out of its max over points (3D Diffusion Policy crops its point cloud to the workspace, Ze et
            al. 2024, arXiv 2403.03954), so the table and background a moved camera brings into view do not reach
            the feature.
        workspace_upper: the upper corner ``[x, y, z]`` (metres, robot base frame) of that box; above
            ``workspace_lower`` on every axis.
        pointmap_crop: False skips the ``crop_ratio`` pixel crop for pointmaps (and the image stacked with one):
            a calibrated pointmap's points are already in the base frame, and which pixels the crop drops changes
            with the camera pose.
    """

    vision_backbone: str = "resnet18"
    crop_ratio: float = 0.9
    num_keypoints: int = 32
    share_vision_encoder: bool = True
    state_hidden_dims: list[int] = field(default_factory=list)
    state_out_dim: int = 64
    pointmap_encoder: str = "keypoints"
    workspace_lower: list[float] = field(default_factory=list)
    workspace_upper: list[float] = field(default_factory=list)
    pointmap_crop: bool = True

    def workspace(self) -> tuple[tuple[float, ...], tuple[float, ...]] | None:
        """The workspace box ``(lower, upper)`` in metres, or None when both bounds are empty.

        Raises:
            ValueError: only one bound given, a bound that is not 3 numbers, or ``lower >= upper`` on an axis
                (names the field, expected and received value).
        """
        lower, upper = list(self.workspace_lower), list(self.workspace_upper)
        if not lower and not upper:
            return None
        for name, bound in (("workspace_lower", lower), ("workspace_upper", upper)):
            if len(bound) != 3 or not all(isinstance(v, (int, float)) for v in bound):
                raise ValueError(f"policy.encoder.{name}: expected [x, y, z] in metres, received {bound!r}")
        if not all(lo < hi for lo, hi in zip(lower, upper)):
            raise ValueError(
                f"policy.encoder.workspace_upper: expected above workspace_lower {lower} on every axis, "
                f"received {upper}"
            )
        return tuple(float(v) for v in lower), tuple(float(v) for v in upper)


__all__ = ["POINTMAP_ENCODERS", "VISION_BACKBONES", "EncoderConfig"]
