"""Exponential moving average of model weights with Diffusion Policy's warm-up (``EMAModel`` of diffusers /
diffusion_policy): ``decay = min(max_decay, 1 - (1 + step) ** -power)``.
"""

from __future__ import annotations

import copy

import torch
from torch import nn


class EMA:
    """Keep an averaged copy of ``model`` (parameters averaged; buffers copied).

    Args:
        model: the trained module; the average starts as a deep copy of it (in eval mode, no grad).
        max_decay: decay ceiling (0.9999 in Diffusion Policy).
        power: warm-up exponent (0.75): early steps average over few updates, later ones over many.

    Attributes:
        model: the averaged module (what checkpoints save as ``model.safetensors``).
        step: number of :meth:`update` calls so far.
    """

    def __init__(self, model: nn.Module, max_decay: float = 0.9999, power: float = 0.75):
        if not 0.0 <= max_decay < 1.0:
            raise ValueError(f"ema max_decay: expected a value in [0, 1), received {max_decay}")
        self.model = copy.deepcopy(model).eval().requires_grad_(False)
        self.max_decay = float(max_decay)
        self.power = float(power)
        self.step = 0

    def decay(self) -> float:
        """The decay used by the next update: ``min(max_decay, 1 - (1 + step) ** -power)`` (0 at step 0)."""
        return min(self.max_decay, max(0.0, 1.0 - (1.0 + self.step) ** -self.power))

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        """``ema = decay * ema + (1 - decay) * param`` for every parameter; buffers are copied."""
        d = self.decay()
        for ema_p, p in zip(self.model.parameters(), model.parameters()):
            ema_p.lerp_(p.detach(), 1.0 - d)
        for ema_b, b in zip(self.model.buffers(), model.buffers()):
            ema_b.copy_(b)
        self.step += 1

    def state_dict(self) -> dict:
        """``{"model": averaged weights, "step": int}`` (for ``training_state.pt``)."""
        return {"model": self.model.state_dict(), "step": self.step}

    def load_state_dict(self, state: dict) -> None:
        """Restore from :meth:`state_dict`."""
        self.model.load_state_dict(state["model"])
        self.step = int(state["step"])
