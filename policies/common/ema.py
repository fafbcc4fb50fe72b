"""Exponential moving average of model weights through ``diffusers``' ``EMAModel`` with Diffusion Policy's warm-up:
the ``k``-th update (0-based) uses ``decay = min(max_decay, 1 - (1 + k) ** -power)``.

``EMAModel(use_ema_warmup=True, inv_gamma=1, power=p)`` computes ``1 - (1 + s) ** -p`` with
``s = optimization_step - 1`` and 0 at the first update, which is that formula; :class:`EMA` keeps the average
inside a module (what checkpoints save and evaluation runs) by pointing the ``EMAModel``'s shadow tensors at
that module's parameters.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn


class EMA:
    """An averaged copy of ``model`` (parameters averaged by ``diffusers.training_utils.EMAModel``; buffers copied).

    Args:
        model: the trained module; the average starts as a deep copy of it (eval mode, no grad).
        max_decay: decay ceiling (0.9999 in Diffusion Policy), in ``[0, 1)``.
        power: warm-up exponent (0.75): early steps average over few updates, later ones over many.

    Attributes:
        model: the averaged module (what checkpoints save as ``model.safetensors``).

    Raises:
        ValueError: ``max_decay`` outside ``[0, 1)``.
    """

    def __init__(self, model: nn.Module, max_decay: float = 0.9999, power: float = 0.75):
        from diffusers.training_utils import EMAModel

        if not 0.0 <= max_decay < 1.0:
            raise ValueError(f"ema max_decay: expected a value in [0, 1), received {max_decay}")
        self.model = copy.deepcopy(model).eval().requires_grad_(False)
        params = list(self.model.parameters())
        self._ema = EMAModel(
            params, decay=max_decay, min_decay=0.0, update_after_step=0, use_ema_warmup=True, inv_gamma=1.0,
            power=power, foreach=True,
        )  # fmt: skip
        self._ema.shadow_params = params  # average in place inside self.model (no second copy)

    @property
    def step(self) -> int:
        """Number of :meth:`update` calls so far."""
        return int(self._ema.optimization_step)

    def decay(self) -> float:
        """The decay the next update uses: ``min(max_decay, 1 - (1 + step) ** -power)`` (0 at step 0)."""
        return float(self._ema.get_decay(self._ema.optimization_step + 1))

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        """``ema -= (1 - decay) * (ema - param)`` for every parameter (a frozen parameter is copied); buffers are
        copied."""
        self._ema.step(model.parameters())
        for ema_b, b in zip(self.model.buffers(), model.buffers()):
            ema_b.copy_(b)

    def state_dict(self) -> dict[str, Any]:
        """``{"model": averaged weights, "step": int}`` (part of a checkpoint's training state)."""
        return {"model": self.model.state_dict(), "step": self.step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore from :meth:`state_dict`."""
        self.model.load_state_dict(state["model"])
        self._ema.optimization_step = int(state["step"])


__all__ = ["EMA"]
