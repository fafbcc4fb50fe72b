"""Image trunks and the parts shared by every image-like encoder (camera frames, pointmaps): ResNet-18 with
GroupNorm, a small conv net, spatial-softmax keypoints and train-time random crops (Chi et al. 2023, Diffusion
Policy, arXiv 2303.04137). :mod:`~policylink.policies.common.encoders` and
:mod:`~policylink.policies.common.pointmap_encoder` build on them.
"""

from __future__ import annotations

import torch
import torchvision
from torch import nn

from policylink.policies.common.conv_paths import fast_inference


class SpatialSoftmax(nn.Module):
    """Spatial soft-argmax keypoints (Levine et al. 2016; Finn et al. 2016), as used by Diffusion Policy.

    A 1x1 conv maps ``(N, C, h, w)`` features to ``K`` heat maps; each map's softmax over pixels gives an
    expected ``(x, y)`` position in ``[-1, 1]``. Output: float32 ``(N, 2K)`` (x, y interleaved per keypoint).
    """

    def __init__(self, in_channels: int, num_keypoints: int):
        super().__init__()
        self.keypoints = nn.Conv2d(in_channels, num_keypoints, kernel_size=1)
        self.num_keypoints = num_keypoints

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        n, c, h, w = features.shape
        if fast_inference():  # trunk mode "fast": the 1x1 conv as one batched GEMM (other summation order)
            weight = self.keypoints.weight.view(self.num_keypoints, c)
            maps = torch.matmul(weight, features.reshape(n, c, h * w))
            if self.keypoints.bias is not None:
                maps = maps.add_(self.keypoints.bias.view(1, -1, 1))
        else:
            maps = self.keypoints(features).flatten(2)  # (N, K, h*w)
        attn = torch.softmax(maps, dim=-1)
        ys, xs = torch.meshgrid(
            torch.linspace(-1.0, 1.0, h, device=features.device),
            torch.linspace(-1.0, 1.0, w, device=features.device),
            indexing="ij",
        )
        grid = torch.stack([xs.reshape(-1), ys.reshape(-1)], dim=-1)  # (h*w, 2)
        return (attn @ grid).reshape(n, 2 * self.num_keypoints)


def mish_closed_form(x: torch.Tensor) -> torch.Tensor:
    """Mish (Misra 2019, arXiv 1908.08681), ``x tanh(softplus(x))``, through ``tanh(log s) = 1 - 2 / (s^2 + 1)``
    with ``s = 1 + e^x``: ``x - 2x / ((1 + e^x)^2 + 1)``, one ``exp``, three in-place passes and one ``addcdiv``
    instead of PyTorch's ``exp`` -> ``log1p`` -> ``tanh`` kernel (1.35 ms against 0.47 ms on a 10x32x29x29 tensor,
    one Xeon thread). Large ``x``: ``e^x`` overflows to ``inf`` and the result is ``x`` (as Mish's, to float32);
    very negative ``x``: 0. Float tensor of any shape -> same shape and dtype; differs from
    ``torch.nn.functional.mish`` by float rounding (absolute error ~1 ulp of ``x``; ``+inf`` gives NaN)."""
    s = torch.exp(x)
    s.add_(1.0).mul_(s).add_(1.0)
    return torch.addcdiv(x, x, s, value=-2.0)


class TrunkMish(nn.Mish):
    """``nn.Mish`` (no parameters; same state dict) that evaluates :func:`mish_closed_form` when
    :func:`~policylink.policies.common.conv_paths.fast_inference` holds (trunk mode ``"fast"``, autograd off)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return mish_closed_form(x) if fast_inference() else super().forward(x)


def resnet18_groupnorm() -> nn.Module:
    """torchvision ResNet-18 trunk (no pooling/fc), random init, every BatchNorm replaced by GroupNorm.

    GroupNorm with ``C // 16`` groups (Diffusion Policy): batch-independent, so EMA and DDP behave.
    Input ``(N, 3, H, W)``; output ``(N, 512, ceil(H/32), ceil(W/32))``.
    """
    net = torchvision.models.resnet18(weights=None, norm_layer=lambda c: nn.GroupNorm(c // 16, c))
    return nn.Sequential(*list(net.children())[:-2])


def small_conv() -> nn.Module:
    """A 3-layer conv trunk for fast CPU training: ``(N, 3, H, W)`` -> ``(N, 64, ~H/4, ~W/4)`` (Mish as
    :class:`TrunkMish`)."""
    return nn.Sequential(
        nn.Conv2d(3, 32, 5, stride=2, padding=2),
        nn.GroupNorm(8, 32),
        TrunkMish(),
        nn.Conv2d(32, 64, 3, stride=2, padding=1),
        nn.GroupNorm(8, 64),
        TrunkMish(),
        nn.Conv2d(64, 64, 3, stride=1, padding=1),
        nn.GroupNorm(8, 64),
        TrunkMish(),
    )


class RandomCrop(nn.Module):
    """Random crop per image in training mode, centre crop in eval mode (Diffusion Policy's augmentation).

    Input float ``(N, C, H, W)``; output ``(N, C, round(ratio*H), round(ratio*W))``. Each of the ``N`` images
    gets its own offset, drawn from ``generator`` (or torch's global RNG).
    """

    def __init__(self, ratio: float):
        super().__init__()
        if not 0.0 < ratio <= 1.0:
            raise ValueError(f"crop_ratio: expected a value in (0, 1], received {ratio}")
        self.ratio = float(ratio)

    def output_size(self, h: int, w: int) -> tuple[int, int]:
        """Crop size ``(h', w')`` for an ``h x w`` input."""
        return max(1, round(self.ratio * h)), max(1, round(self.ratio * w))

    def forward(self, x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        n, _, h, w = x.shape
        ch, cw = self.output_size(h, w)
        if (ch, cw) == (h, w):
            return x
        if not self.training:
            top, left = (h - ch) // 2, (w - cw) // 2
            return x[:, :, top : top + ch, left : left + cw]
        top = torch.randint(0, h - ch + 1, (n,), generator=generator).to(x.device)
        left = torch.randint(0, w - cw + 1, (n,), generator=generator).to(x.device)
        rows = (top[:, None] + torch.arange(ch, device=x.device))[:, :, None]  # (N, ch, 1)
        cols = (left[:, None] + torch.arange(cw, device=x.device))[:, None, :]  # (N, 1, cw)
        batch = torch.arange(n, device=x.device)[:, None, None]
        # (N, C, ch, cw), contiguous NCHW: a channels-last view would run the whole trunk channels-last (measured
        # 0.88x LeRobot's image step on CPU, benchmarks/results/train_throughput.md)
        return x.permute(0, 2, 3, 1)[batch, rows, cols].permute(0, 3, 1, 2).contiguous()


__all__ = ["RandomCrop", "SpatialSoftmax", "TrunkMish", "mish_closed_form", "resnet18_groupnorm", "small_conv"]
