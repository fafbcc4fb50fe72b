"""Flow-matching generative head (Lipman et al. 2023; Liu et al. 2023) with the standard time convention of
DESIGN section 4: ``x_t = t*a + (1-t)*eps``, target velocity ``u = a - eps``, Euler integration from ``t = 0``.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from policylink.adapters.schema import FeatureSpec
from policylink.policies.common.samplers import FlowEulerSampler
from policylink.policies.common.unet1d import ConditionalUnet1D
from policylink.policies.flow.config import FlowPolicyConfig
from policylink.policies.model import GenerativeChunkModel

_BETA_ALPHA = 1.5  # pi0's Beta(1.5, 1) on tau = 1 - t


class FlowModel(GenerativeChunkModel):
    """Velocity field ``v(x_t, t, obs)`` on the shared U-Net, trained by conditional flow matching.

    Training: ``t ~ U[0, 1]`` (or ``t = 1 - s``, ``s ~ Beta(1.5, 1)``), ``x_t = t a + (1 - t) eps``, loss
    ``||v - (a - eps)||^2``. Sampling: :class:`~policylink.policies.common.samplers.FlowEulerSampler` (``K`` Euler
    steps ``x <- x + v / K`` from ``x_0 = eps``; clean estimate ``a_hat = x_t + (1 - t) v``). The network sees
    ``t * flow.time_scale``.

    Args:
        cfg, features, action_dim: as :class:`~policylink.policies.model.ChunkModel`.
        encoder: the observation encoder (default: the shared window encoder).
        net: the velocity network ``net(x_t, t * time_scale, cond) -> (B, H, A)`` (default: the U-Net of
            ``cfg.unet``); built after ``encoder`` when given as a callable ``net(model) -> nn.Module``, so that it
            can size itself from the encoder (the VLA's action expert).
    """

    def __init__(
        self,
        cfg: FlowPolicyConfig,
        features: Mapping[str, FeatureSpec],
        action_dim: int,
        encoder: nn.Module | None = None,
        net=None,
    ):
        super().__init__(cfg, features, action_dim, encoder)
        if net is None:
            self.net = ConditionalUnet1D.from_config(cfg.unet, self.action_dim, self.latent_dim)
        else:
            self.net = net(self) if not isinstance(net, nn.Module) else net
        self.sampler = FlowEulerSampler(self.net, cfg.flow.num_steps, cfg.flow.time_scale)

    def draw_noise(
        self, batch_size: int, generator: torch.Generator | None = None, device: torch.device | str = "cpu"
    ) -> dict[str, torch.Tensor]:
        """``{"noise": N(0, I) (B, H, A), "t": float32 (B,) in [0, 1]}``."""
        noise = torch.randn(batch_size, self.horizon, self.action_dim, generator=generator)
        u = torch.rand(batch_size, generator=generator)
        if self.cfg.flow.time_sampling == "beta":
            # Beta(alpha, 1) has CDF s ** alpha, so s = u ** (1 / alpha) by inverse-CDF sampling.
            u = 1.0 - u ** (1.0 / _BETA_ALPHA)
        return {"noise": noise.to(device), "t": u.to(device)}

    def velocity(self, x_t: torch.Tensor, t: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        """``v(x_t, t)`` ``(B, H, A)`` for ``t`` float ``(B,)`` in ``[0, 1]`` and conditioning ``(B, D)``."""
        return self.sampler.denoise(x_t, t, cond)

    def clean_estimate(self, x_t: torch.Tensor, t: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """``a_hat = x_t + (1 - t) v`` (``t`` ``(B,)``): the sampler's one clean-estimate function."""
        return self.sampler.clean_estimate(x_t, t, v)

    def loss_terms(
        self, cond: torch.Tensor, actions: torch.Tensor, noise: Mapping[str, torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        eps, t = noise["noise"], noise["t"]
        tt = t[:, None, None]
        x_t = tt * actions + (1.0 - tt) * eps
        return self.velocity(x_t, t, cond), actions - eps
