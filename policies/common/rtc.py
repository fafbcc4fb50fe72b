"""Real-time chunking (Black, Galliker, Levine 2025, "Real-Time Execution of Action Chunking Flow Policies",
arXiv 2506.07339): while the next chunk is generated, guide the flow sampler so that it agrees with the actions
of the previous chunk that are already committed (inference-time inpainting with a soft mask).

:func:`rtc_weights`, :func:`inpaint_weights` and :func:`guidance_scale` are numpy only (the runtime's executors
import them without torch). Two policy-side corrections, both :class:`~policylink.adapters.capabilities.Guidance`
hooks of a velocity sampler, chosen by :data:`PREFIX_METHODS`:

- ``"guidance"``: :func:`rtc_guidance`, the paper's correction, a vector-Jacobian product through the sampler's
  clean estimate (eq. 2-4, as LeRobot's ``policies/rtc`` computes it): about twice the cost of a plain sample.
- ``"inpaint"``: :func:`inpaint_guidance`, replacement inpainting of the clean estimate (the "hard masking"
  baseline of the paper's section 4, after the inpainting of Diffuser, Janner et al. 2022, and RePaint, Lugmayr et
  al. 2022): no gradient, the cost of a plain sample, and the committed prefix is reproduced exactly.
- ``"condition"``: :func:`condition_noise` and :func:`condition_guidance`, the committed prefix given clean for
  the whole sampling, for a policy trained that way (training-time action conditioning, Black, Ren, Equi, Levine
  2025, arXiv 2512.05964; loss ``prefix_conditioned``, :mod:`policylink.train.prefix`): the cost of a plain sample.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from policylink.adapters.capabilities import PREFIX_METHODS, Guidance


def rtc_weights(chunk_size: int, delay: int, execution_horizon: int) -> np.ndarray:
    """RTC's prefix weights ``W`` (paper eq. 5), float64 ``(H,)``.

    ``W_i = 1`` for ``i < d`` (actions executed before the new chunk arrives: frozen),
    ``W_i = c_i (e^{c_i} - 1) / (e - 1)`` with ``c_i = (H - s - i) / (H - s - d + 1)`` for ``d <= i < H - s``
    (the rest of the previous chunk: exponentially decaying), and ``W_i = 0`` for ``i >= H - s`` (new actions).

    Args:
        chunk_size: ``H``, steps.
        delay: ``d``, the inference delay in steps.
        execution_horizon: ``s``, the steps executed between inference starts.

    Raises:
        ValueError: ``d < 0``, ``s < 1`` or ``d + s > H`` (the previous chunk would run out).
    """
    h, d, s = int(chunk_size), int(delay), int(execution_horizon)
    if d < 0 or s < 1 or d + s > h:
        raise ValueError(
            f"rtc: expected 0 <= delay and 1 <= execution_horizon with delay + execution_horizon "
            f"<= chunk_size, received delay={d}, execution_horizon={s}, chunk_size={h}"
        )
    i = np.arange(h, dtype=np.float64)
    c = (h - s - i) / (h - s - d + 1)
    w = np.where(i < d, 1.0, c * np.expm1(c) / (math.e - 1.0))
    return np.where(i >= h - s, 0.0, w)


def inpaint_weights(chunk_size: int, delay: int) -> np.ndarray:
    """Hard prefix mask for :func:`inpaint_guidance`, float64 ``(H,)``: ``1`` for ``i < d`` (the actions executed
    before the new chunk arrives), ``0`` after (the new chunk's own actions, reactive to the new observation).

    Raises:
        ValueError: not ``0 <= d <= H``.
    """
    h, d = int(chunk_size), int(delay)
    if not 0 <= d <= h:
        raise ValueError(f"inpaint: expected 0 <= delay <= chunk_size, received delay={d}, chunk_size={h}")
    return (np.arange(h) < d).astype(np.float64)


def guidance_scale(t: np.ndarray | float, max_guidance: float) -> np.ndarray:
    """RTC's guidance weight ``min(beta, (1 - t) / (t r_t^2))`` with ``r_t^2 = (1 - t)^2 / (t^2 + (1 - t)^2)``.

    ``t`` is flow time in ``[0, 1]`` (0 = noise, 1 = clean); at ``t = 0`` the weight is ``beta``.
    """
    t = np.asarray(t, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        r2 = (1.0 - t) ** 2 / (t**2 + (1.0 - t) ** 2)
        raw = (1.0 - t) / (t * r2)
    return np.where(t <= 0.0, max_guidance, np.minimum(max_guidance, np.nan_to_num(raw, nan=0.0, posinf=1e30)))


def rtc_guidance(target: Any, weights: Any, max_guidance: float = 5.0) -> Guidance:
    """RTC's pseudo-inverse guidance as an autograd hook for a velocity sampler.

    ``v' = v + min(beta, (1-t)/(t r_t^2)) * (d a_hat / d x_t)^T [W * (Y - a_hat)]`` with ``a_hat =
    sampler.clean_estimate(x_t, t, v)`` (``x_t + (1 - t) v``), the vector-Jacobian product taken with
    ``torch.autograd.grad`` through the network (paper eq. 2-4): the frozen prefix (``W = 1``) is pulled onto the
    committed actions, the free suffix (``W = 0``) only moves through the network's coupling.

    Args:
        target: torch float ``(B, H, A)``: the committed actions ``Y`` in the sampler's (normalised) units.
        weights: torch float ``(B, H)`` or ``(H,)``: per-step weights ``W`` (:func:`rtc_weights` times validity).
        max_guidance: ``beta`` (> 0).

    Returns:
        ``Guidance(fn, autograd=True)`` with ``fn(x_t, t, v, cond, sampler) -> v'`` (torch ``(B, H, A)``).

    Raises:
        ValueError: ``max_guidance <= 0``.
    """
    import torch

    if not max_guidance > 0:
        raise ValueError(f"max_guidance: expected > 0, received {max_guidance}")
    w = weights if weights.dim() == 2 else weights[None].expand(target.shape[0], -1)
    w = w[..., None].to(target.dtype)

    def fn(x_t: torch.Tensor, t: torch.Tensor, v: torch.Tensor, cond: Any, sampler: Any) -> torch.Tensor:
        a_hat = sampler.clean_estimate(x_t, t, v)
        err = (w.to(a_hat.device) * (target.to(a_hat.device) - a_hat)).detach()
        (vjp,) = torch.autograd.grad(a_hat, x_t, grad_outputs=err)
        scale = torch.as_tensor(guidance_scale(t.detach().cpu().numpy(), max_guidance), dtype=v.dtype)
        return v.detach() + scale.to(v.device)[:, None, None] * vjp

    return Guidance(fn, autograd=True)


def inpaint_guidance(target: Any, weights: Any) -> Guidance:
    """Replacement inpainting of a velocity sampler's clean estimate toward a committed prefix (no autograd).

    At each step the clean estimate ``a_hat = x_t + (1 - t) v`` is replaced by ``W * Y + (1 - W) * a_hat``, i.e.
    ``v' = v + W * (Y - a_hat) / (1 - t)``: the Euler step then moves the prefix along the straight path from
    ``x_t`` to ``Y`` (``x_t = t Y + (1 - t) eps`` when it started on it), so after the last step (``t = 1 - 1/K``,
    step ``1/K``) every position with ``W = 1`` equals ``Y`` exactly, and the free positions (``W = 0``) follow the
    network, which sees the inpainted prefix in ``x_t`` at every later step (the coupling that makes them agree).
    Cost: one network evaluation per step, as a plain sample (RTC's guidance, :func:`rtc_guidance`, adds a
    vector-Jacobian product). Source: the hard-masking baseline of Black et al. 2025 (arXiv 2506.07339, section 4),
    the inpainting of Janner et al. 2022 (Diffuser) and Lugmayr et al. 2022 (RePaint).

    Args:
        target: torch float ``(B, H, A)``: the committed actions ``Y`` in the sampler's (normalised) units.
        weights: torch float ``(B, H)`` or ``(H,)`` in ``[0, 1]`` (:func:`inpaint_weights` times validity).

    Returns:
        ``Guidance(fn, autograd=False)`` with ``fn(x_t, t, v, cond, sampler) -> v'`` (torch ``(B, H, A)``).
    """
    w = weights if weights.dim() == 2 else weights[None].expand(target.shape[0], -1)
    w = w[..., None].to(target.dtype)

    def fn(x_t: Any, t: Any, v: Any, cond: Any, sampler: Any) -> Any:
        a_hat = sampler.clean_estimate(x_t, t, v)
        left = (1.0 - t.to(v.dtype))[:, None, None]  # > 0: the Euler grid stops at t = 1 - 1/K
        return v + w.to(v.device) * (target.to(v.device) - a_hat) / left

    return Guidance(fn, autograd=False)


def condition_noise(noise: Any, target: Any, weights: Any) -> Any:
    """The initial ``x_0`` of a prefix-conditioned sample: ``W * Y + (1 - W) * eps``, torch ``(B, H, A)``.

    With :func:`condition_guidance` the prefix (``W = 1``) then stays exactly ``Y`` at every step: the network
    sees it clean throughout, as in training with loss ``prefix_conditioned`` (where ``eps = a`` on the prefix).

    Args:
        noise: torch float ``(B, H, A)``: the drawn ``eps``.
        target: torch float ``(B, H, A)``: the committed actions ``Y`` (normalised units).
        weights: torch float ``(B, H)`` or ``(H,)`` with values 0 or 1 (:func:`inpaint_weights` times validity).

    Raises:
        ValueError: a weight other than 0 or 1 (a clean prefix is all or nothing per step).
    """
    w = _broadcast_weights(weights, target)
    if bool(((w != 0) & (w != 1)).any()):
        raise ValueError("prefix.weights: expected 0 or 1 for method 'condition', received fractional weights")
    return w * target + (1.0 - w) * noise


def condition_guidance(weights: Any) -> Guidance:
    """The velocity of a prefix-conditioned sample with the prefix held still: ``v' = (1 - W) v`` (no autograd).

    Args:
        weights: torch float ``(B, H)`` or ``(H,)`` of 0 or 1 (see :func:`condition_noise`).

    Returns:
        ``Guidance(fn, autograd=False)`` with ``fn(x_t, t, v, cond, sampler) -> v'`` (torch ``(B, H, A)``).
    """

    def fn(x_t: Any, t: Any, v: Any, cond: Any, sampler: Any) -> Any:
        return v * (1.0 - _broadcast_weights(weights, v))

    return Guidance(fn, autograd=False)


def _broadcast_weights(weights: Any, like: Any) -> Any:
    """Weights ``(B, H)`` or ``(H,)`` -> ``(B, H, 1)`` on ``like``'s device and dtype."""
    w = weights if weights.dim() == 2 else weights[None].expand(like.shape[0], -1)
    return w[..., None].to(device=like.device, dtype=like.dtype)


__all__ = [
    "PREFIX_METHODS",
    "condition_guidance",
    "condition_noise",
    "guidance_scale",
    "inpaint_guidance",
    "inpaint_weights",
    "rtc_guidance",
    "rtc_weights",
]
