"""Advantage-weighted flow matching with a chunk critic: Q-VGM's same-critic baseline (issue 14). Each training
window's flow-matching loss is weighted by ``w = min(exp(A / beta), w_max)`` (AWR, Peng et al. 2019, arXiv
1910.00177; :func:`~policylink.policies.finetune.advantage.awr_weights`) with the chunk advantage ``A = mean_e
Q_e(s, A_{0:H}) - V(s)`` of the window's executed chunk under the IQL critic, divided by its standard deviation
over the batch (so ``beta`` is scale-free, as in the store-labelled AWR of ``policylink finetune advantage``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import torch

from policylink.policies.critics import ChunkCritic, critic_state
from policylink.policies.finetune.advantage import awr_weights
from policylink.policies.model import ChunkModel


class CriticAWRLoss:
    """The loss (draws + ``(model, batch, step)``, like :class:`~policylink.policies.finetune.qvgm.QVGMLoss`).

    Args:
        critic: a trained :class:`ChunkCritic` (frozen here).
        reference: the frozen model whose encoder gives the critic's latents.
        beta: AWR temperature on batch-standardised advantages (> 0).
        max_weight: weight cap ``w_max`` (> 0).

    Raises:
        ValueError: ``beta <= 0`` or ``max_weight <= 0``.

    The batch is the trainer's (``obs``, ``action`` ``(B, H, A)`` normalised, ``valid`` bool ``(B, H)``) plus
    ``noise`` from :meth:`draw`. Padded steps (``valid`` False) are left out of the flow-matching error.
    """

    metrics: ClassVar[tuple[str, ...]] = ("bc_loss", "mean_weight", "max_weight")

    def __init__(self, critic: ChunkCritic, reference: ChunkModel, beta: float = 1.0, max_weight: float = 20.0):
        awr_weights(torch.zeros(1), beta, max_weight)  # validates beta / max_weight early
        self.critic = critic.eval().requires_grad_(False)
        self.reference = reference.eval().requires_grad_(False)
        self.beta, self.max_weight = float(beta), float(max_weight)

    def draw(
        self, model: ChunkModel, batch_size: int, generator: torch.Generator, device: torch.device | str = "cpu"
    ) -> dict[str, torch.Tensor]:
        """The model's training noise (``model.draw_noise``)."""
        return model.draw_noise(batch_size, generator, device)

    def weights(self, obs: Mapping[str, torch.Tensor], action: torch.Tensor) -> torch.Tensor:
        """AWR weights ``(B,)`` of the chunks ``action`` ``(B, >=H, A)`` at observations ``obs`` (no gradient)."""
        with torch.no_grad():
            s = critic_state(self.reference.embed(obs), obs)
            adv = self.critic.actor_q(s, action) - self.critic.value(s)
            adv = adv / adv.std().clamp_min(1e-6) if adv.numel() > 1 else adv
            return awr_weights(adv, self.beta, self.max_weight)

    def __call__(self, model: ChunkModel, batch: Mapping[str, Any], step: int) -> tuple[torch.Tensor, dict]:
        """``mean_i w_i * mean_{h,a} err_{i,h,a}``; metrics: the unweighted flow-matching loss, the mean and max
        weight."""
        cond = model.condition(model.embed(batch["obs"]))
        per = model.per_sample_loss(cond, batch["action"], batch["noise"], batch.get("valid"))
        w = self.weights(batch["obs"], batch["action"]).to(per.device)
        metrics = {"bc_loss": float(per.detach().mean()), "mean_weight": float(w.mean()), "max_weight": float(w.max())}
        return (w * per).mean(), metrics


__all__ = ["CriticAWRLoss"]
