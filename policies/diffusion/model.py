"""Diffusion Policy's generative head (Chi et al. 2023, arXiv 2303.04137): DDPM training with the
squared-cosine schedule, DDIM sampling, both through ``diffusers`` schedulers.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from policylink.adapters.schema import FeatureSpec
from policylink.policies.common.samplers import DDIMSampler
from policylink.policies.common.unet1d import ConditionalUnet1D
from policylink.policies.diffusion.config import DiffusionPolicyConfig
from policylink.policies.model import GenerativeChunkModel


class DiffusionModel(GenerativeChunkModel):
    """Noise-prediction U-Net trained with DDPM (Ho et al. 2020) and sampled with DDIM (Song et al. 2021).

    Training: ``k ~ U{0, K-1}``, ``x_k = sqrt(abar_k) a + sqrt(1 - abar_k) eps``, loss ``||net(x_k, k) - eps||^2``
    (or the clean chunk when ``prediction_type == "sample"``). Sampling:
    :class:`~policylink.policies.common.samplers.DDIMSampler` (``num_inference_steps`` DDIM steps, eta = 0,
    deterministic given the initial noise, predicted clean chunk clipped to ``[-1, 1]``).

    Raises:
        ValueError: ``diffusion.prediction_type`` is not ``"epsilon"`` or ``"sample"``.
    """

    def __init__(self, cfg: DiffusionPolicyConfig, features: Mapping[str, FeatureSpec], action_dim: int):
        super().__init__(cfg, features, action_dim)
        from diffusers import DDPMScheduler

        d = cfg.diffusion
        self.net = ConditionalUnet1D.from_config(cfg.unet, self.action_dim, self.latent_dim)
        common = dict(
            num_train_timesteps=d.num_train_timesteps,
            beta_schedule=d.beta_schedule,
            clip_sample=d.clip_sample,
            clip_sample_range=d.clip_sample_range,
            prediction_type=d.prediction_type,
        )
        self.sampler = DDIMSampler(self.net, **common, num_steps=d.num_inference_steps)
        self.train_scheduler = DDPMScheduler(**common)

    def draw_noise(
        self, batch_size: int, generator: torch.Generator | None = None, device: torch.device | str = "cpu"
    ) -> dict[str, torch.Tensor]:
        """``{"noise": N(0, I) (B, H, A), "t": int64 DDPM timesteps (B,) in [0, num_train_timesteps)}``."""
        noise = torch.randn(batch_size, self.horizon, self.action_dim, generator=generator)
        t = torch.randint(0, self.cfg.diffusion.num_train_timesteps, (batch_size,), generator=generator)
        return {"noise": noise.to(device), "t": t.to(device)}

    def loss_terms(
        self, cond: torch.Tensor, actions: torch.Tensor, noise: Mapping[str, torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        eps, t = noise["noise"], noise["t"]
        noisy = self.train_scheduler.add_noise(actions, eps, t)
        target = eps if self.cfg.diffusion.prediction_type == "epsilon" else actions
        return self.net(noisy, t, cond), target
