"""Pointmap encoders: robot-centric pointmaps (``observation.pointmaps.<camera>``, base-frame XYZ per pixel),
alone or stacked channel-wise with the same camera's RGB frame, encoded into base-frame keypoints.

The trunk and the spatial-softmax attention are Diffusion Policy's (arXiv 2303.04137), but each keypoint is read
out as the attention-weighted mean of the (normalised) pointmap, i.e. a 3-D position in the robot base frame,
instead of the expected pixel coordinate: the feature then does not move when the camera does, as long as the
attention still lands on the same scene part (the premise of robot-centric pointmaps: actions and observations
share the robot's frame).

:class:`PointNetEncoder` (``encoder.pointmap_encoder: pointnet``) treats the pixels as a point set instead: one
MLP per point and a max over the points (PointNet, Qi et al. 2017, in the lightweight form of 3D Diffusion Policy,
Ze et al. 2024, arXiv 2403.03954), so the feature does not depend on where in the image a point lands at all --
a camera that turns about the scene permutes the pixels and leaves the feature unchanged up to the points it
brings into or out of view.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from policylink.adapters.pointmaps import POINTMAP_PREFIX, is_pointmap_key
from policylink.adapters.schema import IMAGE_PREFIX, FeatureSpec
from policylink.data.normalize import Normalizer
from policylink.policies.common.backbones import RandomCrop, resnet18_groupnorm, small_conv
from policylink.policies.common.encoder_config import POINTMAP_ENCODERS, VISION_BACKBONES, EncoderConfig


class PointmapEncoder(nn.Module):
    """Crop -> trunk -> per-keypoint attention -> attended XYZ -> linear+ReLU.

    Input: the normalised pointmap float32 ``(N, 3, H, W)`` and, when ``rgb_channels`` is 3, the frame
    ``(N, 3, H, W)`` in ``[0, 1]`` (stacked in front of the pointmap: a 6-channel trunk). Output: float32
    ``(N, 3K)`` (``K = num_keypoints``).

    Raises:
        ValueError: unknown ``backbone``, or ``rgb_channels`` not 0 or 3.
    """

    def __init__(
        self, image_hw: tuple[int, int], backbone: str, crop_ratio: float, num_keypoints: int, rgb_channels: int = 0
    ):
        super().__init__()
        if backbone not in VISION_BACKBONES:
            raise ValueError(f"vision_backbone: expected one of {VISION_BACKBONES}, received {backbone!r}")
        if rgb_channels not in (0, 3):
            raise ValueError(f"rgb_channels: expected 0 (pointmap alone) or 3 (stacked RGB), received {rgb_channels}")
        self.rgb_channels = rgb_channels
        channels = 3 + rgb_channels
        self.crop = RandomCrop(crop_ratio)
        self.trunk = _trunk(backbone, channels)
        with torch.no_grad():
            feat = self.trunk(torch.zeros(1, channels, *self.crop.output_size(*image_hw))).shape[1]
        self.keypoints = nn.Conv2d(feat, num_keypoints, kernel_size=1)
        self.out = nn.Sequential(nn.Linear(3 * num_keypoints, 3 * num_keypoints), nn.ReLU())
        self.out_dim = 3 * num_keypoints

    def forward(self, points: torch.Tensor, rgb: torch.Tensor | None = None) -> torch.Tensor:
        x = points if rgb is None else torch.cat([rgb * 2.0 - 1.0, points], dim=1)
        x = self.crop(x)  # one crop for the stacked channels: pixels stay aligned
        feats = self.trunk(x)
        n, _, h, w = feats.shape
        attn = torch.softmax(self.keypoints(feats).flatten(2), dim=-1)  # (N, K, h*w)
        xyz = F.adaptive_avg_pool2d(x[:, -3:], (h, w)).flatten(2).transpose(1, 2)  # (N, h*w, 3)
        return self.out((attn @ xyz).reshape(n, -1))


POINTNET_HIDDEN_DIMS = (64, 128)
"""Per-point MLP widths: 3D Diffusion Policy's (64, 128, 256) without its widest layer, which costs 4x the
others together on one CPU thread (~54k points per training batch of 32 x 2 frames at 32 x 32 px)."""
POINTNET_OUT_DIM = 64
"""Feature size of :class:`PointNetEncoder` (3D Diffusion Policy's)."""


class PointNetEncoder(nn.Module):
    """Crop -> per-pixel MLP (Linear, LayerNorm, ReLU per layer) -> max over pixels -> Linear -> LayerNorm.

    PointNet (Qi et al., CVPR 2017) in the form of 3D Diffusion Policy's encoder (Ze et al. 2024, arXiv
    2403.03954): every pixel is a point ``(x, y, z)`` (normalised base-frame metres), with its colour appended
    when ``rgb_channels`` is 3; the max over points makes the feature a function of the point *set*, invariant to
    any permutation of the pixels. Invalid pixels (zeros in metres, see :mod:`policylink.adapters.pointmaps`)
    enter as one fixed point, which cannot carry scene information. The crop (train: random, eval: centre) keeps
    the pixel grid of the other encoders, so a pointmap-and-RGB policy crops both alike.

    With a ``workspace`` box (DP3's crop of the cloud to the workspace), a point outside it is masked out of the
    max: its per-point feature enters as ``-inf``, so it cannot change the pooled feature; shapes stay static (no
    point is dropped from the tensor). A cloud with no point inside pools to zeros (a finite, fixed feature,
    not NaN). The box is given in metres and compared in normalised units: :meth:`bind_normalizer` maps it through
    the pointmap's per-channel affine (:func:`bind_workspaces` does it for a whole model); the mapped box is a
    buffer, so it is saved and loaded with the weights.

    Input: the normalised pointmap float32 ``(N, 3, H, W)`` and, when ``rgb_channels`` is 3, the frame
    ``(N, 3, H, W)`` in ``[0, 1]``. Output: float32 ``(N, POINTNET_OUT_DIM)``.

    Args:
        crop_ratio: the pixel crop (``1.0``: none).
        rgb_channels: 0 (pointmap alone) or 3 (stacked RGB).
        key: the pointmap feature this encoder reads (the normaliser key of :meth:`bind_normalizer`).
        workspace: ``(lower, upper)`` base-frame box in metres, 3 numbers each, or None (no mask).

    Raises:
        ValueError: ``rgb_channels`` not 0 or 3; a workspace bound that is not 3 numbers or not ``lower < upper``.
    """

    def __init__(
        self,
        crop_ratio: float,
        rgb_channels: int = 0,
        key: str = "",
        workspace: tuple[Sequence[float], Sequence[float]] | None = None,
    ):
        super().__init__()
        if rgb_channels not in (0, 3):
            raise ValueError(f"rgb_channels: expected 0 (pointmap alone) or 3 (stacked RGB), received {rgb_channels}")
        self.rgb_channels = rgb_channels
        self.key = key
        self.crop = RandomCrop(crop_ratio)
        layers: list[nn.Module] = []
        dims = (3 + rgb_channels, *POINTNET_HIDDEN_DIMS)
        for a, b in zip(dims[:-1], dims[1:]):
            layers += [nn.Linear(a, b), nn.LayerNorm(b), nn.ReLU()]
        self.point_mlp = nn.Sequential(*layers)
        self.out = nn.Sequential(nn.Linear(dims[-1], POINTNET_OUT_DIM), nn.LayerNorm(POINTNET_OUT_DIM))
        self.out_dim = POINTNET_OUT_DIM
        self.workspace = None if workspace is None else _check_box(workspace)
        if self.workspace is not None:  # no buffers without a box: the state dict of old checkpoints is unchanged
            self.register_buffer("workspace_lower", torch.tensor(self.workspace[0]))
            self.register_buffer("workspace_upper", torch.tensor(self.workspace[1]))

    def bind_normalizer(self, offset: Sequence[float], scale: Sequence[float]) -> None:
        """Map the workspace box (metres) to normalised units, ``(bound - offset) * scale`` per channel (the
        affine of :class:`~policylink.data.normalize.Normalizer`; ``offset = 0``, ``scale = 1`` for raw metres).

        Raises:
            ValueError: no workspace; ``offset`` / ``scale`` not 3 numbers; a scale that is not positive (the box
                would flip).
        """
        if self.workspace is None:
            raise ValueError(f"{self.key}: bind_normalizer needs a workspace box, received none")
        offset_t = torch.as_tensor(offset, dtype=torch.float64).reshape(-1)
        scale_t = torch.as_tensor(scale, dtype=torch.float64).reshape(-1)
        if offset_t.numel() != 3 or scale_t.numel() != 3 or not bool((scale_t > 0).all()):
            raise ValueError(
                f"{self.key}: normaliser affine: expected 3 offsets and 3 positive scales, received "
                f"offset {offset_t.tolist()} scale {scale_t.tolist()}"
            )
        for name, bound in (("workspace_lower", self.workspace[0]), ("workspace_upper", self.workspace[1])):
            value = (torch.tensor(bound, dtype=torch.float64) - offset_t) * scale_t
            getattr(self, name).copy_(value.to(torch.float32))

    def forward(self, points: torch.Tensor, rgb: torch.Tensor | None = None) -> torch.Tensor:
        x = points if rgb is None else torch.cat([rgb * 2.0 - 1.0, points], dim=1)
        x = self.crop(x)  # (N, C, h, w): one crop for the stacked channels
        flat = x.flatten(2).transpose(1, 2)  # (N, h*w, C), the point's XYZ in the last 3 channels
        per_point = self.point_mlp(flat)  # (N, h*w, 128)
        if self.workspace is None:
            return self.out(per_point.amax(dim=1))
        xyz = flat[..., -3:]
        inside = ((xyz >= self.workspace_lower) & (xyz <= self.workspace_upper)).all(dim=-1, keepdim=True)
        pooled = per_point.masked_fill(~inside, float("-inf")).amax(dim=1)  # (N, 128); -inf: no point inside
        return self.out(torch.where(inside.any(dim=1), pooled, torch.zeros_like(pooled)))


def _check_box(box: tuple[Sequence[float], Sequence[float]]) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """``(lower, upper)`` as float tuples. Raises ValueError: not 3 numbers each, or not ``lower < upper``."""
    lower, upper = (tuple(float(v) for v in b) for b in box)
    if len(lower) != 3 or len(upper) != 3 or not all(lo < hi for lo, hi in zip(lower, upper)):
        raise ValueError(f"workspace: expected ([x, y, z], [x, y, z]) with lower < upper, received {box!r}")
    return lower, upper


def bind_workspaces(model: nn.Module, normalizer: Normalizer | None) -> int:
    """Map the workspace box of every :class:`PointNetEncoder` in ``model`` that has one to the normalised units
    of its pointmap (``normalizer``'s affine of that key; None: raw metres). Call it when the model is built for
    training and whenever it is paired with its processor chain (the mapped box is also saved in the weights).

    Returns:
        How many encoders were bound.

    Raises:
        MissingStatsError: ``normalizer`` has no mode for an encoder's key.
    """
    bound = 0
    for enc in model.modules():
        if isinstance(enc, PointNetEncoder) and enc.workspace is not None:
            if normalizer is None:
                offset, scale = np.zeros(3), np.ones(3)
            else:  # the affine's two points: 0 m and 1 m per channel
                zero = normalizer.normalize_feature(enc.key, np.zeros((3, 1, 1), np.float64)).reshape(3)
                one = normalizer.normalize_feature(enc.key, np.ones((3, 1, 1), np.float64)).reshape(3)
                scale = one - zero
                offset = -zero / scale
            enc.bind_normalizer(offset, scale)
            bound += 1
    return bound


def _trunk(backbone: str, in_channels: int) -> nn.Module:
    """The image trunk with ``in_channels`` input channels (its first conv replaced when not 3)."""
    net = resnet18_groupnorm() if backbone == "resnet18" else small_conv()
    if in_channels != 3:
        first = net[0]
        net[0] = nn.Conv2d(
            in_channels, first.out_channels, first.kernel_size, first.stride, first.padding, bias=first.bias is not None
        )
    return net


def pointmap_encoders(features: Mapping[str, FeatureSpec], cfg: EncoderConfig) -> tuple[nn.ModuleDict, dict[str, str]]:
    """One :class:`PointmapEncoder` (or :class:`PointNetEncoder`, by ``cfg.pointmap_encoder``) per pointmap
    feature of ``features``; a camera that also has an ``observation.images.<camera>`` feature gets a stacked
    encoder (6 input channels). ``cfg.pointmap_crop`` False: no pixel crop for them; ``cfg.workspace()``: the
    PointNet's workspace box (bind it with :func:`bind_workspaces`).

    Returns:
        ``(encoders, stacked)``: encoders keyed by the feature key with ``.`` replaced by ``__``; ``stacked`` maps
        each stacked pointmap key to the image key it consumes (that image gets no encoder of its own).

    Raises:
        ValueError: a pointmap feature is not float ``(H, W, 3)``, or its stacked image has another ``H x W``;
            ``cfg.pointmap_encoder`` is not one of :data:`~policylink.policies.common.encoder_config.POINTMAP_ENCODERS`;
            a bad workspace box, or one with the ``keypoints`` encoder.
    """
    if cfg.pointmap_encoder not in POINTMAP_ENCODERS:
        raise ValueError(
            f"policy.encoder.pointmap_encoder: expected one of {POINTMAP_ENCODERS}, received {cfg.pointmap_encoder!r}"
        )
    workspace = cfg.workspace()
    if workspace is not None and cfg.pointmap_encoder != "pointnet":
        raise ValueError(
            "policy.encoder.workspace_lower/upper: a workspace box needs pointmap_encoder 'pointnet', received "
            f"{cfg.pointmap_encoder!r}"
        )
    encoders, stacked = nn.ModuleDict(), {}
    for key in sorted(k for k in features if is_pointmap_key(k)):
        f = features[key]
        if len(f.shape) != 3 or f.shape[-1] != 3 or not f.dtype.startswith("float"):
            raise ValueError(f"{key}: expected a float pointmap (H, W, 3), received dtype {f.dtype} shape {f.shape}")
        image_key = IMAGE_PREFIX + key[len(POINTMAP_PREFIX) :]
        if image_key in features:
            if features[image_key].shape[:2] != f.shape[:2]:
                raise ValueError(
                    f"{image_key}: expected the size of {key} {f.shape[:2]} to stack, received "
                    f"{features[image_key].shape}"
                )
            stacked[key] = image_key
        rgb = 3 if key in stacked else 0
        ratio = cfg.crop_ratio if cfg.pointmap_crop else 1.0
        if cfg.pointmap_encoder == "pointnet":
            encoders[key.replace(".", "__")] = PointNetEncoder(ratio, rgb, key, workspace)
        else:
            encoders[key.replace(".", "__")] = PointmapEncoder(
                f.shape[:2], cfg.vision_backbone, ratio, cfg.num_keypoints, rgb
            )
    return encoders, stacked


__all__ = ["POINTNET_OUT_DIM", "PointNetEncoder", "PointmapEncoder", "bind_workspaces", "pointmap_encoders"]
