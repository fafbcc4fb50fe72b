"""Real-time chunking (Black, Galliker, Levine 2025, "Real-Time Execution of Action Chunking Flow Policies",
arXiv 2506.07339): while the next chunk is generated, guide the flow sampler so that it agrees with the
actions of the previous chunk that are already committed (inference-time inpainting with a soft mask)."""

from __future__ import annotations

import math

import numpy as np


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


def guidance_scale(t: np.ndarray | float, max_guidance: float) -> np.ndarray:
    """RTC's guidance weight ``min(beta, (1 - t) / (t r_t^2))`` with ``r_t^2 = (1 - t)^2 / (t^2 + (1 - t)^2)``.

    ``t`` is flow time in ``[0, 1]`` (0 = noise, 1 = clean); at ``t = 0`` the weight is ``beta``.
    """
    t = np.asarray(t, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        r2 = (1.0 - t) ** 2 / (t**2 + (1.0 - t) ** 2)
        raw = (1.0 - t) / (t * r2)
    return np.where(t <= 0.0, max_guidance, np.minimum(max_guidance, np.nan_to_num(raw, nan=0.0, posinf=1e30)))


def make_flow_guidance(target, weights, max_guidance: float = 5.0):
    """The RTC velocity correction as a flow-sampler guidance hook ``(x_t, t, v) -> v'``.

    ``v' = v + min(beta, (1-t)/(t r_t^2)) * W * (Y - a_hat)`` with ``a_hat = x_t + (1 - t) v``. This is RTC's
    pseudo-inverse guidance (their eq. 2-4) with the network Jacobian ``d a_hat / d x_t`` taken as the
    identity, because the sampler runs without autograd; the frozen prefix (``W = 1``) is pulled onto the
    committed actions and the free suffix (``W = 0``) is untouched.

    Args:
        target: torch float ``(B, H, A)``: the committed actions ``Y`` in the sampler's (normalised) units.
        weights: torch float ``(B, H)`` or ``(H,)``: per-step weights ``W`` (:func:`rtc_weights`).
        max_guidance: ``beta``.

    Returns:
        ``guidance(x_t (B, H, A), t (B,), v (B, H, A)) -> v' (B, H, A)`` (torch tensors).
    """
    import torch

    w = weights if weights.dim() == 2 else weights[None].expand(target.shape[0], -1)
    w = w[..., None].to(target.dtype)

    def guidance(x_t: torch.Tensor, t: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        tt = t.to(v.dtype)[:, None, None]
        a_hat = x_t + (1.0 - tt) * v
        scale = torch.as_tensor(guidance_scale(t.detach().cpu().numpy(), max_guidance), dtype=v.dtype, device=v.device)[
            :, None, None
        ]
        return v + scale * w.to(v.device) * (target.to(v.device) - a_hat)

    return guidance
