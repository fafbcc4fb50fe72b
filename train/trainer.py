"""The one optimisation loop of policylink: every objective (imitation of diffusion / flow / ACT / VLA heads,
advantage conditioning, AWR, Q-VGM, the chunk critic's IQL, the advantage value model, the corrector's monitor)
is trained by :func:`fit` stepping an :class:`Optimization`; nothing else in the product calls
``optimizer.step()``.

An :class:`Optimization` owns what one optimizer step means: zero the gradients, backward (with a gradient
scaler under float16 autocast), clip the global gradient norm, step Adam/AdamW, step the learning-rate schedule
(constant, or Diffusion Policy's linear warm-up then cosine), update the EMA copy, then the objective's own
after-step hook (the critic's Polyak target update). Its :meth:`Optimization.state` is what a resumed run
restores. :func:`fit` draws each step's loss from a callable, steps, and yields a :class:`StepResult` per step so
that the caller logs, validates and checkpoints between steps (with a tqdm progress bar when asked).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

OPTIMIZERS = ("adam", "adamw")
SCHEDULES = ("constant", "cosine")


@dataclass(frozen=True)
class OptimConfig:
    """One optimizer step's settings.

    Attributes:
        optimizer: ``adam`` or ``adamw`` (``torch.optim``; decoupled weight decay for ``adamw``).
        lr: peak learning rate.
        betas: Adam's ``(beta1, beta2)``.
        weight_decay: L2 (``adam``) or decoupled (``adamw``) weight decay.
        grad_clip: clip the global gradient norm to this value; 0 = no clipping (the norm is still measured when
            ``measure_grad_norm``).
        schedule: ``constant`` or ``cosine`` (:func:`cosine_with_warmup` over ``total_steps``).
        warmup_steps, total_steps: the cosine schedule's warm-up and length, in optimizer steps.
        ema_max_decay, ema_power: an EMA copy of the trained module (Diffusion Policy's warm-up,
            :class:`~policylink.policies.common.ema.EMA`); ``ema_max_decay`` None = no EMA.
        amp: mixed precision on CUDA (bfloat16 autocast; float16 with a gradient scaler when bf16 is unsupported);
            ignored on CPU.
        measure_grad_norm: return the global gradient norm from :meth:`Optimization.step` (nan when False and
            nothing is clipped: saves one pass over the gradients in small loops).

    Raises:
        ValueError: an unknown optimizer/schedule, a negative or non-finite ``lr``, a negative weight decay or
            clip, or a cosine schedule without ``total_steps`` (the message names the field).
    """

    optimizer: str = "adamw"
    lr: float = 1e-4
    betas: tuple[float, float] = (0.9, 0.999)
    weight_decay: float = 0.0
    grad_clip: float = 0.0
    schedule: str = "constant"
    warmup_steps: int = 0
    total_steps: int = 0
    ema_max_decay: float | None = None
    ema_power: float = 0.75
    amp: bool = False
    measure_grad_norm: bool = False

    def __post_init__(self) -> None:
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer: expected one of {OPTIMIZERS}, received {self.optimizer!r}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule: expected one of {SCHEDULES}, received {self.schedule!r}")
        if not (math.isfinite(self.lr) and self.lr >= 0):
            raise ValueError(f"lr: expected a finite value >= 0, received {self.lr}")
        for name in ("weight_decay", "grad_clip"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name}: expected >= 0, received {getattr(self, name)}")
        if self.schedule == "cosine" and self.total_steps < 1:
            raise ValueError(f"total_steps: expected >= 1 for the cosine schedule, received {self.total_steps}")


class Optimization:
    """The only place an optimizer steps: parameters, optimizer, LR schedule, gradient clipping, AMP and EMA.

    Args:
        params: the trained parameters (an ``nn.Module`` or an iterable of tensors / modules).
        config: :class:`OptimConfig`.
        ema_of: the module an EMA copy averages (default: ``params`` when it is a module); needs
            ``config.ema_max_decay``.
        after_step: called after every step (e.g. a critic's Polyak target update).
        device: where autocast runs (``amp`` is honoured on CUDA only).

    Attributes:
        optimizer, scheduler (None for ``constant``), ema (None without EMA).
    """

    def __init__(
        self,
        params: nn.Module | Iterable[Any],
        config: OptimConfig,
        *,
        ema_of: nn.Module | None = None,
        after_step: Callable[[], None] | None = None,
        device: torch.device | str = "cpu",
    ):
        self.config, self.after_step = config, after_step
        self.params = _parameters(params)
        cls = torch.optim.AdamW if config.optimizer == "adamw" else torch.optim.Adam
        self.optimizer = cls(self.params, lr=config.lr, betas=tuple(config.betas), weight_decay=config.weight_decay)
        self.scheduler = None
        if config.schedule == "cosine":
            f = cosine_with_warmup(config.warmup_steps, config.total_steps)
            self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, f)
        self.ema = None
        if config.ema_max_decay is not None:
            from policylink.policies.common.ema import EMA

            self.ema_source = ema_of if ema_of is not None else params
            self.ema = EMA(self.ema_source, config.ema_max_decay, config.ema_power)
        self.device = torch.device(device)
        self.amp_dtype = _amp_dtype(config.amp, self.device)
        fp16 = self.amp_dtype is torch.float16
        self.scaler = torch.amp.GradScaler("cuda") if fp16 else None

    def autocast(self):
        """The forward pass's autocast context (a no-op without AMP)."""
        if self.amp_dtype is None:
            return nullcontext()
        return torch.autocast(self.device.type, dtype=self.amp_dtype)

    @property
    def lr(self) -> float:
        """The learning rate of the next step."""
        return float(self.optimizer.param_groups[0]["lr"])

    def step(self, loss: torch.Tensor) -> float:
        """Zero, backward, clip, optimizer step, LR step, EMA update, after-step hook.

        Args:
            loss: scalar loss tensor with a graph to the parameters.

        Returns:
            The global L2 gradient norm before clipping (nan when neither clipped nor measured).
        """
        self.optimizer.zero_grad(set_to_none=True)
        if self.scaler is not None:
            self.scaler.scale(loss).backward()
            self.scaler.unscale_(self.optimizer)
        else:
            loss.backward()
        grad_norm = self._clip()
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        if self.scheduler is not None:
            self.scheduler.step()
        if self.ema is not None:
            self.ema.update(self.ema_source)
        if self.after_step is not None:
            self.after_step()
        return grad_norm

    def _clip(self) -> float:
        c = self.config
        if c.grad_clip > 0:
            return float(torch.nn.utils.clip_grad_norm_(self.params, c.grad_clip))
        if not c.measure_grad_norm:
            return math.nan
        grads = [p.grad.norm() for p in self.params if p.grad is not None]
        return float(torch.stack(grads).norm()) if grads else 0.0

    def state(self) -> dict[str, Any]:
        """Optimizer, scheduler, EMA and gradient-scaler state: what a resumed run restores (plain tensors,
        numbers and lists; see :mod:`policylink.policies.checkpoint` for how it is saved)."""
        out: dict[str, Any] = {"optimizer": self.optimizer.state_dict()}
        if self.scheduler is not None:
            out["scheduler"] = self.scheduler.state_dict()
        if self.ema is not None:
            out["ema"] = self.ema.state_dict()
        if self.scaler is not None:
            out["scaler"] = self.scaler.state_dict()
        return out

    def load(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state`.

        Raises:
            KeyError: a part this optimization has (scheduler, EMA, scaler) is missing from ``state``.
        """
        self.optimizer.load_state_dict(state["optimizer"])
        if self.scheduler is not None:
            self.scheduler.load_state_dict(state["scheduler"])
        if self.ema is not None:
            self.ema.load_state_dict(state["ema"])
        if self.scaler is not None:
            self.scaler.load_state_dict(state["scaler"])


@dataclass
class StepResult:
    """One finished optimizer step: ``step`` (1-based count of steps taken), the ``loss`` tensor (detached),
    ``grad_norm`` (see :meth:`Optimization.step`), the objective's ``metrics`` and the progress ``bar`` (None
    without one; ``bar.set_postfix`` shows logged values)."""

    step: int
    loss: torch.Tensor
    grad_norm: float
    metrics: dict[str, float]
    bar: Any = None


def fit(
    step_loss: Callable[[int], tuple[torch.Tensor, dict[str, float]]],
    optimization: Optimization,
    steps: int,
    *,
    start: int = 0,
    progress: str | None = None,
) -> Iterator[StepResult]:
    """THE optimisation loop: for ``step`` in ``start..steps-1``, ``loss, metrics = step_loss(step)`` (under the
    optimization's autocast), one :meth:`Optimization.step`, then yield a :class:`StepResult` (the caller logs,
    validates and saves between steps; a resumed run passes ``start``).

    Args:
        step_loss: draws step ``step``'s batch and returns ``(scalar loss, metrics)``; each step's randomness
            should be a function of ``step`` so that a resumed run continues exactly.
        optimization: the :class:`Optimization` that steps.
        steps: total optimizer steps (the loop stops at ``steps``).
        start: steps already taken (resume).
        progress: a tqdm bar with this description, or None for none.

    Yields:
        :class:`StepResult` after every step.
    """
    bar = None
    if progress is not None:
        from tqdm.auto import tqdm

        bar = tqdm(total=steps, initial=start, desc=progress, unit="step", dynamic_ncols=True)
    try:
        for step in range(start, steps):
            with optimization.autocast():
                loss, metrics = step_loss(step)
            grad_norm = optimization.step(loss)
            if bar is not None:
                bar.update(1)
            yield StepResult(step + 1, loss.detach(), grad_norm, metrics, bar)
    finally:
        if bar is not None:
            bar.close()


def tty_progress(desc: str) -> str | None:
    """``desc`` when standard error is a terminal (a progress bar for :func:`fit`), else None (no bar in logs)."""
    import sys

    return desc if sys.stderr.isatty() else None


def cosine_with_warmup(warmup_steps: int, total_steps: int) -> Callable[[int], float]:
    """LR multiplier ``f(step)``: linear ``1 / warmup_steps -> 1`` over the first ``warmup_steps`` steps, then
    cosine ``1 -> 0`` at ``total_steps``.

    This is diffusers' ``get_cosine_schedule_with_warmup`` multiplier ``g`` with its warm-up one step earlier:
    ``f(s) = g(s + 1)`` for ``s < warmup_steps`` and ``f(s) = g(s)`` after. diffusers' warm-up is ``s / warmup``,
    so its first step has LR 0 (a step that only moves Adam's moments); ours has always been ``(s + 1) / warmup``,
    and the cosine part ``0.5 (1 + cos(pi (s - w) / (T - w)))`` is the same formula.
    """
    from diffusers.optimization import get_cosine_schedule_with_warmup

    dummy = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)  # diffusers builds g on an optimizer
    g = get_cosine_schedule_with_warmup(dummy, warmup_steps, total_steps).lr_lambdas[0]

    def f(step: int) -> float:
        return g(step + 1) if step < warmup_steps else g(step)

    return f


def _parameters(params: nn.Module | Iterable[Any]) -> list[torch.nn.Parameter]:
    """The parameters of a module or of an iterable of tensors / modules (order kept, no duplicates)."""
    items = params.parameters() if isinstance(params, nn.Module) else params
    out: list[Any] = []
    for item in items:
        out.extend(item.parameters() if isinstance(item, nn.Module) else [item])
    seen: set[int] = set()
    return [p for p in out if not (id(p) in seen or seen.add(id(p)))]


def _amp_dtype(amp: bool, device: torch.device) -> torch.dtype | None:
    if not amp or device.type != "cuda":
        return None
    return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16


__all__ = ["OptimConfig", "Optimization", "StepResult", "cosine_with_warmup", "fit", "tty_progress"]
