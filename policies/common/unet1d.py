"""Conditional 1-D temporal U-Net with FiLM conditioning (Chi et al. 2023, Diffusion Policy, arXiv 2303.04137).

One network serves both generative heads: the noise predictor of Diffusion Policy and the velocity field of
the flow-matching policy. It maps a noisy action chunk ``(B, H, A)``, a scalar time per sample and a global
conditioning vector (the observation latent) to an output chunk of the same shape.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from policylink.policies.common.conv_paths import SELECTOR, run_path
from policylink.policies.common.unet_config import UNetConfig, UNetPolicyConfig  # noqa: F401 (re-exported)


class SinusoidalTimeEmbedding(nn.Module):
    """Transformer-style sinusoidal embedding of a scalar time (Vaswani et al. 2017).

    Args:
        dim: embedding size (even).

    Input ``t``: float ``(B,)`` (diffusion timestep index or flow time scaled to ``[0, 1000]``).
    Output: float32 ``(B, dim)``.
    """

    def __init__(self, dim: int):
        super().__init__()
        if dim % 2:
            raise ValueError(f"time embedding dim: expected an even number, received {dim}")
        self.dim = dim

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        half = self.dim // 2
        freqs = torch.exp(torch.arange(half, device=t.device, dtype=torch.float32) * (-math.log(10000.0) / (half - 1)))
        args = t.float()[:, None] * freqs[None, :]
        return torch.cat([args.sin(), args.cos()], dim=-1)


class GemmConv1d(nn.Conv1d):
    """``nn.Conv1d`` that, when autograd is off, runs through the fastest execution path measured on this machine
    for its input shape, device and dtype (:mod:`policylink.policies.common.conv_paths`: PyTorch's conv,
    oneDNN with pre-reordered weights, one im2col GEMM, or one GEMM per kernel tap).

    Same parameters, same result up to float summation order (every path is tested against ``conv1d``). The
    first call with a new ``(B, C_in, H)`` times the candidate paths (a few ms per shape; shapes are shared by
    all layers); later calls look the choice up. Training (autograd on) uses the standard convolution. Only
    ``groups=1`` and ``dilation=1`` with integer zero padding take the measured paths (others fall back).
    Input ``(B, C_in, H)`` -> ``(B, C_out, H_out)``, the input's dtype and device.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if (
            torch.is_grad_enabled()
            or self.groups != 1
            or self.dilation[0] != 1
            or isinstance(self.padding, str)
            or self.padding_mode != "zeros"
            or x.dim() != 3
        ):
            return super().forward(x)
        return run_path(SELECTOR.choose(self, x), self, x)


class Conv1dBlock(nn.Module):
    """Conv1d -> GroupNorm -> Mish on ``(B, C_in, H)`` -> ``(B, C_out, H)`` (same length)."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, n_groups: int):
        super().__init__()
        self.block = nn.Sequential(
            GemmConv1d(in_channels, out_channels, kernel_size, padding=kernel_size // 2),
            nn.GroupNorm(n_groups, out_channels),
            nn.Mish(),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(x)


class ConditionalResidualBlock1D(nn.Module):
    """Two conv blocks with FiLM (per-channel scale and bias from ``cond``) between them, plus a residual.

    Input ``x`` ``(B, C_in, H)``, ``cond`` ``(B, cond_dim)``; output ``(B, C_out, H)``.
    FiLM: ``h = scale(cond) * h + bias(cond)`` (Perez et al. 2018), as in Diffusion Policy's U-Net.
    """

    def __init__(self, in_channels: int, out_channels: int, cond_dim: int, kernel_size: int, n_groups: int):
        super().__init__()
        self.blocks = nn.ModuleList(
            [
                Conv1dBlock(in_channels, out_channels, kernel_size, n_groups),
                Conv1dBlock(out_channels, out_channels, kernel_size, n_groups),
            ]
        )
        self.out_channels = out_channels
        self.cond_encoder = nn.Sequential(nn.Mish(), nn.Linear(cond_dim, 2 * out_channels))
        self.residual_conv = GemmConv1d(in_channels, out_channels, 1) if in_channels != out_channels else nn.Identity()

    def forward(self, x: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        out = self.blocks[0](x)
        scale, bias = self.cond_encoder(cond).unsqueeze(-1).chunk(2, dim=1)
        out = scale * out + bias
        out = self.blocks[1](out)
        return out + self.residual_conv(x)


class ConditionalUnet1D(nn.Module):
    """The temporal U-Net of Diffusion Policy: conv residual blocks with FiLM, down/up-sampling over time.

    Args:
        action_dim: ``A``, channels of the input/output chunk.
        global_cond_dim: size of the observation conditioning vector.
        down_dims: channels per level (the chunk length halves between levels, so ``H`` must be divisible by
            ``2 ** (len(down_dims) - 1)``).
        kernel_size: temporal kernel size (odd).
        n_groups: GroupNorm groups (must divide every entry of ``down_dims``).
        time_embed_dim: size of the sinusoidal time embedding.

    Forward: ``sample`` float32 ``(B, H, A)``, ``t`` float ``(B,)``, ``global_cond`` ``(B, global_cond_dim)``
    -> float32 ``(B, H, A)``.

    Raises:
        ValueError: ``n_groups`` does not divide a level's channels, or ``kernel_size`` is even.
    """

    def __init__(
        self,
        action_dim: int,
        global_cond_dim: int,
        down_dims: tuple[int, ...] = (256, 512, 1024),
        kernel_size: int = 5,
        n_groups: int = 8,
        time_embed_dim: int = 128,
    ):
        super().__init__()
        down_dims = tuple(int(d) for d in down_dims)
        bad = [d for d in down_dims if d % n_groups]
        if bad:
            raise ValueError(f"down_dims: expected multiples of n_groups={n_groups}, received {list(down_dims)}")
        if kernel_size % 2 == 0:
            raise ValueError(f"kernel_size: expected an odd number, received {kernel_size}")
        self.time_embed = nn.Sequential(
            SinusoidalTimeEmbedding(time_embed_dim),
            nn.Linear(time_embed_dim, time_embed_dim * 4),
            nn.Mish(),
            nn.Linear(time_embed_dim * 4, time_embed_dim),
        )
        cond_dim = time_embed_dim + global_cond_dim
        dims = (action_dim, *down_dims)

        def block(i: int, o: int) -> ConditionalResidualBlock1D:
            return ConditionalResidualBlock1D(i, o, cond_dim, kernel_size, n_groups)

        self.down = nn.ModuleList()
        n = len(down_dims)
        for level, (c_in, c_out) in enumerate(zip(dims[:-1], dims[1:])):
            last = level == n - 1
            self.down.append(
                nn.ModuleList(
                    [
                        block(c_in, c_out),
                        block(c_out, c_out),
                        GemmConv1d(c_out, c_out, 3, stride=2, padding=1) if not last else nn.Identity(),
                    ]
                )
            )
        mid = down_dims[-1]
        self.mid = nn.ModuleList([block(mid, mid), block(mid, mid)])
        self.up = nn.ModuleList()
        for c_out, c_in in reversed(list(zip(down_dims[:-1], down_dims[1:]))):
            self.up.append(
                nn.ModuleList(
                    [
                        block(c_in * 2, c_out),
                        block(c_out, c_out),
                        nn.ConvTranspose1d(c_out, c_out, 4, stride=2, padding=1),
                    ]
                )
            )
        self.final = nn.Sequential(
            Conv1dBlock(down_dims[0], down_dims[0], kernel_size, n_groups), GemmConv1d(down_dims[0], action_dim, 1)
        )

    @classmethod
    def from_config(cls, cfg: UNetConfig, action_dim: int, global_cond_dim: int) -> ConditionalUnet1D:
        """The U-Net of ``cfg`` for ``action_dim`` channels and a ``global_cond_dim`` conditioning vector."""
        return cls(action_dim, global_cond_dim, tuple(cfg.down_dims), cfg.kernel_size, cfg.n_groups, cfg.time_embed_dim)

    def forward(self, sample: torch.Tensor, t: torch.Tensor, global_cond: torch.Tensor) -> torch.Tensor:
        x = sample.transpose(1, 2)  # (B, A, H)
        cond = torch.cat([self.time_embed(t.expand(sample.shape[0])), global_cond], dim=-1)
        skips = []
        for res1, res2, downsample in self.down:
            x = res2(res1(x, cond), cond)
            skips.append(x)
            x = downsample(x)
        for res in self.mid:
            x = res(x, cond)
        # Up level k pairs with the skip of down level n-1-k; the first level's skip is unused, as in the
        # reference implementation (the final conv block works at full length instead).
        for (res1, res2, upsample), skip in zip(self.up, reversed(skips[1:])):
            x = torch.cat([x, skip], dim=1)
            x = upsample(res2(res1(x, cond), cond))
        return self.final(x).transpose(1, 2)
