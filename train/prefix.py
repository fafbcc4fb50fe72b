"""Training-time action conditioning for real-time chunking (Black, Ren, Equi, Levine 2025, "Training-Time Action
Conditioning for Efficient Real-Time Chunking", arXiv 2512.05964): train a flow policy to continue a committed
prefix instead of inpainting it at inference time.

For each training window a delay ``d`` is drawn uniformly from ``0 .. max_delay``; the first ``d`` steps of the
noisy chunk are the clean demonstrated actions (for flow matching ``x_t = t a + (1 - t) eps``, so ``eps = a`` on
those steps makes ``x_t = a`` at every ``t``) and their error is left out of the loss. The network thus learns the
velocity of the remaining ``H - d`` steps given that the first ``d`` are already fixed: at deployment the ``d``
actions executed while the chunk is computed are given the same way (``executor.rtc_method: condition``,
:func:`policylink.policies.common.rtc.condition_noise`), with no guidance and no extra network pass. The paper puts
the clean prefix in with a per-token flow time of 1; the shared U-Net takes one time per chunk, so here the prefix
is recognisable only by being clean (noise-free) -- the adaptation this module makes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import torch

from policylink.train.losses import BatchFields, ImitationLoss

MAX_DELAY_STEPS = 4
"""Largest committed prefix drawn in training, steps (0.4 s at 10 Hz: two periods beyond the 100 ms goal)."""


class PrefixConditionedLoss(ImitationLoss):
    """Flow matching with a clean committed prefix of ``d ~ U{0 .. max_delay}`` steps per window (module docstring).

    Scalar loss: the flow-matching MSE over ``B * H * A`` entries with the prefix steps (and, with
    ``policy.mask_padded_actions``, padded steps) zeroed. Metric ``prefix_steps``: the batch's mean ``d``.

    Args:
        cfg: the run's :class:`~policylink.train.config.TrainConfig`; its policy must be a flow policy (the noise
            swap relies on ``x_t = t a + (1 - t) eps``).
        max_delay: the largest ``d`` (steps, ``0 <= max_delay < H``).

    Raises:
        ValueError: the policy is not a flow policy, or ``max_delay`` is outside ``[0, H)``.
    """

    fields: ClassVar[BatchFields] = BatchFields()
    metrics: ClassVar[tuple[str, ...]] = ("prefix_steps",)

    def __init__(self, cfg: Any, max_delay: int = MAX_DELAY_STEPS):
        super().__init__(cfg)
        if cfg.policy.type != "flow":
            raise ValueError(f"loss prefix_conditioned: expected policy.type 'flow', received {cfg.policy.type!r}")
        horizon = int(cfg.policy.chunk_size)
        if not 0 <= int(max_delay) < horizon:
            raise ValueError(f"prefix max_delay: expected 0 <= max_delay < chunk_size {horizon}, received {max_delay}")
        self.max_delay = int(max_delay)

    def draw(
        self, model: torch.nn.Module, batch_size: int, generator: torch.Generator, device: torch.device | str = "cpu"
    ) -> dict[str, torch.Tensor]:
        """The head's noise ``{"noise": (B, H, A), "t": (B,)}`` plus ``"prefix"``: int64 ``(B,)`` delays ``d``."""
        out = model.draw_noise(batch_size, generator, device)
        out["prefix"] = torch.randint(0, self.max_delay + 1, (batch_size,), generator=generator).to(device)
        return out

    def __call__(
        self, model: torch.nn.Module, batch: Mapping[str, Any], step: int
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """Scalar loss and ``{"prefix_steps": mean d}`` (see the class)."""
        actions, noise = batch["action"], dict(batch["noise"])
        d = noise.pop("prefix")
        fixed = prefix_mask(d, actions.shape[1])
        noise["noise"] = torch.where(fixed[..., None], actions, noise["noise"])
        valid = ~fixed
        if self.mask_padded_actions:
            valid = valid & batch["valid"].bool()
        return model(batch["obs"], actions, noise, valid), {"prefix_steps": float(d.float().mean())}


def prefix_mask(delays: torch.Tensor, horizon: int) -> torch.Tensor:
    """bool ``(B, H)``: ``True`` at steps ``i < d_b`` (the committed prefix) for delays int ``(B,)``."""
    return torch.arange(horizon, device=delays.device)[None] < delays[:, None]


__all__ = ["MAX_DELAY_STEPS", "PrefixConditionedLoss", "prefix_mask"]
