"""Guided corrective replanning: an autograd :class:`~policylink.adapters.capabilities.Guidance` hook that, at
every denoising step, moves the sampler's output so that its one-step clean estimate ``a_hat`` descends a
differentiable cost (universal / classifier guidance through the clean estimate: Bansal et al. 2023, "Universal
Guidance for Diffusion Models"; the same vector-Jacobian pattern as RTC, :mod:`policylink.policies.common.rtc`).

VLA-Corrector's cost (arXiv 2607.01804, section "guided replanning") has two terms, both on ``a_hat`` in
ActionSpec units:

- monitor consistency: ``1 - cos(f(z_t, a_hat[:k]), dz_target)``, the monitor's predicted latent change of the
  new chunk against a target change (the executor passes the observed change ``z_t - z_{t-k}``);
- committed actions: ``sum_i w_i |a_hat_i - y_i|^2 / A``, consistency with actions already executed or committed
  during the inference delay (weights ``w`` ``(B, H)``, 0 = free).

At every step the clean estimate takes one gradient step ``a_hat - scale * d cost / d a_hat`` and the sampler's
output is replaced by the one whose clean estimate that is (:func:`guided_output`), for velocity, noise and
clean-chunk predictions alike.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from policylink.adapters.capabilities import Guidance, Prediction

CostFn = Callable[[torch.Tensor], torch.Tensor]
"""``cost(a_hat (B, H, A) in the sampler's normalised units) -> (B,)``, differentiable."""


def guided_output(
    sampler: Any, x_t: torch.Tensor, t: torch.Tensor, out: torch.Tensor, step: torch.Tensor
) -> torch.Tensor:
    """The sampler output whose clean estimate is ``a_hat + step`` (``step`` ``(B, H, A)``), inverting
    ``clean_estimate`` for the sampler's prediction: velocity ``out + step / (1 - t)``, clean chunk ``out + step``,
    noise ``out - step sqrt(abar) / sqrt(1 - abar)`` (DDIM paper eq. 12 solved for the noise).

    Raises:
        ValueError: an unknown ``sampler.prediction``.
    """
    pred = Prediction(sampler.prediction)
    out = out.detach()
    if pred == Prediction.SAMPLE:
        return out + step
    if pred == Prediction.VELOCITY:
        return out + step / (1.0 - t.to(out.dtype)).clamp_min(1e-3)[:, None, None]
    abar = sampler.scheduler.alphas_cumprod.to(x_t.device, x_t.dtype)[sampler.timestep(t).to(x_t.device)]
    return out - step * (abar.sqrt() / (1.0 - abar).clamp_min(1e-8).sqrt())[:, None, None]


def cost_guidance(cost: CostFn, scale: float) -> Guidance:
    """``Guidance(fn, autograd=True)`` descending ``cost`` through the clean estimate at every step.

    Raises:
        ValueError: ``scale`` is negative or not finite.
    """
    if not (scale >= 0 and torch.isfinite(torch.tensor(scale))):
        raise ValueError(f"guidance scale: expected a finite value >= 0, received {scale}")

    def fn(x_t: torch.Tensor, t: torch.Tensor, out: torch.Tensor, cond: Any, sampler: Any) -> torch.Tensor:
        a_hat = sampler.clean_estimate(x_t, t, out)
        (grad,) = torch.autograd.grad(cost(a_hat).sum(), a_hat)
        return guided_output(sampler, x_t, t, out, -scale * grad)

    return Guidance(fn, autograd=True)


def affine_inverse(normalize: Callable[[Any], torch.Tensor], action_dim: int) -> Callable[[torch.Tensor], torch.Tensor]:
    """Differentiable ``normalised -> units`` map of an affine per-dimension action normaliser ``normalize``
    (units ``(..., A)`` -> normalised tensor, e.g. ``GuidedSampler.normalize_actions``): ``n(x) = s x + b`` is
    probed at 0 and 1.

    Raises:
        ValueError: ``normalize`` is not affine per dimension (checked at 2) or has a zero slope.
    """
    zero = normalize(torch.zeros(1, action_dim)).reshape(-1).float()
    slope = normalize(torch.ones(1, action_dim)).reshape(-1).float() - zero
    if not torch.allclose(normalize(2 * torch.ones(1, action_dim)).reshape(-1).float(), zero + 2 * slope, atol=1e-4):
        raise ValueError("action normaliser: expected an affine per-dimension map, received a non-affine one")
    if (slope.abs() < 1e-12).any():
        raise ValueError("action normaliser: expected non-zero slopes, received a zero one")

    def to_units(a: torch.Tensor) -> torch.Tensor:
        return (a - zero.to(a.device)) / slope.to(a.device)

    return to_units


def corrective_cost(
    monitor: Any,
    z: torch.Tensor,
    dz_target: torch.Tensor,
    to_units: Callable[[torch.Tensor], torch.Tensor],
    committed: torch.Tensor | None = None,
    weights: torch.Tensor | None = None,
    committed_weight: float = 1.0,
) -> CostFn:
    """VLA-Corrector's replanning cost on ``a_hat`` (normalised) -> ``(B,)``.

    Args:
        monitor: a :class:`~policylink.policies.corrector.monitor.LatentMonitor` (``horizon`` = ``k``).
        z: ``(B, D)`` current latents; dz_target: ``(B, D)`` the target latent change.
        to_units: normalised -> units (see :func:`affine_inverse`).
        committed: ``(B, H, A)`` committed actions in units, with weights ``(B, H)`` in ``[0, 1]``; optional.
        committed_weight: factor on the committed-actions term.
    """
    k = monitor.horizon

    def cost(a_hat: torch.Tensor) -> torch.Tensor:
        units = to_units(a_hat)
        pred = monitor(z, units[:, :k])
        c = 1.0 - torch.nn.functional.cosine_similarity(pred, dz_target, dim=1, eps=1e-8)
        if committed is not None and weights is not None:
            sq = ((units - committed) ** 2).mean(-1)  # (B, H)
            c = c + committed_weight * (weights * sq).sum(-1)
        return c

    return cost


__all__ = ["CostFn", "affine_inverse", "corrective_cost", "cost_guidance", "guided_output"]
