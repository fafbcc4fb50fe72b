"""The denoising loops of the generative chunk models, one place for each: a flow-matching Euler sampler and a
DDIM sampler (``diffusers``' ``DDIMScheduler``). Both implement
:class:`~policylink.adapters.capabilities.DenoisingSampler`: time ``t`` in ``[0, 1]`` with 0 = noise and
1 = clean, a guidance hook ``(x_t, t, out, cond, sampler)`` run with autograd when it asks for it, and the
trajectory on request. No caller writes its own denoising loop.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

import torch

from policylink.adapters.capabilities import Guidance, GuidanceFn, Prediction, as_guidance

Network = Callable[[torch.Tensor, torch.Tensor, Any], torch.Tensor]
"""``net(x (B, H, A), timestep (B,), cond) -> (B, H, A)``: the denoising network in its own timestep units."""


class Sampler(ABC):
    """The shared loop: ``K`` steps, each ``out = denoise(x, t, cond)``, optional guidance, then ``_step``.

    Subclasses define :meth:`denoise`, :meth:`clean_estimate`, the time grid and the update.

    Attributes:
        net: the denoising network (:data:`Network`).
        prediction: what ``net`` predicts (:class:`Prediction`).
        num_steps: default number of denoising steps ``K``.
    """

    prediction: Prediction

    def __init__(self, net: Network, num_steps: int):
        if int(num_steps) < 1:
            raise ValueError(f"num_steps: expected >= 1, received {num_steps}")
        self.net = net
        self.num_steps = int(num_steps)

    @abstractmethod
    def denoise(self, x_t: torch.Tensor, t: torch.Tensor, cond: Any) -> torch.Tensor:
        """The network's prediction ``(B, H, A)`` at ``x_t`` ``(B, H, A)``, time ``t`` float ``(B,)`` in ``[0, 1]``."""

    @abstractmethod
    def clean_estimate(self, x_t: torch.Tensor, t: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """The one-step estimate of the clean chunk ``(B, H, A)`` from a prediction ``out`` (differentiable)."""

    @abstractmethod
    def _times(self, num_steps: int) -> list[float]:
        """The ``K`` step times, increasing, in ``[0, 1]`` (flow: ``i / K``; DDIM: ``1 - k_i / K_train``, the last
        one 1.0 for step ``k = 0``)."""

    @abstractmethod
    def _step(self, x: torch.Tensor, i: int, times: list[float], out: torch.Tensor) -> torch.Tensor:
        """``x_t`` of step ``i`` -> ``x`` at the next time, given the (guided) prediction ``out``."""

    def sample(
        self,
        cond: Any,
        noise: torch.Tensor,
        num_steps: int | None = None,
        guidance: Guidance | GuidanceFn | None = None,
        return_trajectory: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Denoise ``noise`` ``(B, H, A)`` (normalised units) given ``cond``; deterministic given ``noise``.

        Args:
            cond: the network's conditioning (``(B, D)``, detached).
            noise: the initial ``x`` at ``t = 0``.
            num_steps: ``K`` (default :attr:`num_steps`).
            guidance: a :class:`Guidance` or plain hook ``fn(x_t, t, out, cond, sampler) -> out'`` called at every
                step; with ``Guidance.autograd`` the step runs with gradients on and ``x_t.requires_grad_()``.
            return_trajectory: also return the trajectory.

        Returns:
            the final chunk ``(B, H, A)``, or ``(chunk, trajectory (K+1, B, H, A), times (K+1,), outputs
            (K, B, H, A))`` with ``times[-1] = 1``; all detached.
        """
        guide = as_guidance(guidance)
        times = self._times(int(num_steps or self.num_steps))
        x = noise
        xs, outs = [x], []
        for i, ti in enumerate(times):
            t = torch.full((x.shape[0],), ti, device=x.device, dtype=torch.float32)
            out = self.guided_output(x, t, cond, guide)
            with torch.no_grad():
                x = self._step(x, i, times, out)
            if return_trajectory:
                xs.append(x)
                outs.append(out)
        if not return_trajectory:
            return x
        grid = torch.tensor([*times, 1.0], dtype=torch.float32, device=x.device)
        return x, torch.stack(xs), grid, torch.stack(outs)

    def guided_output(self, x_t: torch.Tensor, t: torch.Tensor, cond: Any, guidance: Guidance | None) -> torch.Tensor:
        """``denoise`` then ``guidance`` at one step; with ``guidance.autograd`` both run with gradients enabled
        on a ``requires_grad`` copy of ``x_t`` (so the hook can take vector-Jacobian products through the
        network); otherwise under ``no_grad``. Returns the detached prediction ``(B, H, A)``."""
        if guidance is not None and guidance.autograd:
            with torch.enable_grad():
                x = x_t.detach().requires_grad_(True)
                out = guidance(x, t, self.denoise(x, t, cond), cond, self)
            return out.detach()
        with torch.no_grad():
            out = self.denoise(x_t, t, cond)
            if guidance is not None:
                out = guidance(x_t, t, out, cond, self)
        return out


class FlowEulerSampler(Sampler):
    """Flow matching (Lipman et al. 2023; Liu et al. 2023) with DESIGN section 4's convention: ``x_t = t a +
    (1 - t) eps``, velocity ``v = a - eps``, ``K`` Euler steps ``x <- x + v / K`` from ``t = 0``.

    Args:
        net: the velocity network; it sees ``t * time_scale``.
        num_steps: default Euler steps (10).
        time_scale: factor on ``t`` before the network (the U-Net's sinusoidal embedding is tuned for
            integer-like timesteps).
    """

    prediction = Prediction.VELOCITY

    def __init__(self, net: Network, num_steps: int = 10, time_scale: float = 1.0):
        super().__init__(net, num_steps)
        self.time_scale = float(time_scale)

    def denoise(self, x_t: torch.Tensor, t: torch.Tensor, cond: Any) -> torch.Tensor:
        """Velocity ``v(x_t, t)`` ``(B, H, A)``."""
        return self.net(x_t, t * self.time_scale, cond)

    def clean_estimate(self, x_t: torch.Tensor, t: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """``a_hat = x_t + (1 - t) v``: the one clean-estimate function of the flow policies."""
        return x_t + (1.0 - t.to(x_t.dtype))[:, None, None] * out

    def _times(self, num_steps: int) -> list[float]:
        dt = 1.0 / num_steps
        return [i * dt for i in range(num_steps)]

    def _step(self, x: torch.Tensor, i: int, times: list[float], out: torch.Tensor) -> torch.Tensor:
        return x + (1.0 / len(times)) * out


class DDIMSampler(Sampler):
    """DDIM (Song et al. 2021, eta = 0) through ``diffusers.DDIMScheduler``, for a network trained with DDPM
    (Ho et al. 2020) on ``num_train_timesteps`` steps. DDPM step ``k`` is time ``t = 1 - k / K_train``.

    Args:
        net: the network; it sees the integer DDPM timestep ``k`` (int64 ``(B,)``).
        num_train_timesteps, beta_schedule, clip_sample, clip_sample_range: the training schedule
            (``diffusers`` names; clipping bounds the clean estimate inside each DDIM step).
        prediction_type: ``"epsilon"`` (noise) or ``"sample"`` (clean chunk).
        num_steps: default DDIM steps (Diffusion Policy: 10).

    Raises:
        ValueError: ``prediction_type`` is neither ``"epsilon"`` nor ``"sample"``.
    """

    def __init__(
        self,
        net: Network,
        *,
        num_train_timesteps: int = 100,
        beta_schedule: str = "squaredcos_cap_v2",
        clip_sample: bool = True,
        clip_sample_range: float = 1.0,
        prediction_type: str = "epsilon",
        num_steps: int = 10,
    ):
        super().__init__(net, num_steps)
        from diffusers import DDIMScheduler

        if prediction_type not in (Prediction.EPSILON, Prediction.SAMPLE):
            raise ValueError(
                f"policy.diffusion.prediction_type: expected 'epsilon' or 'sample', received {prediction_type!r}"
            )
        self.prediction = Prediction(prediction_type)
        self.num_train_timesteps = int(num_train_timesteps)
        self.scheduler = DDIMScheduler(
            num_train_timesteps=num_train_timesteps,
            beta_schedule=beta_schedule,
            clip_sample=clip_sample,
            clip_sample_range=clip_sample_range,
            prediction_type=prediction_type,
            set_alpha_to_one=True,
            steps_offset=0,
        )
        self._scheduled_steps: int | None = None

    def timestep(self, t: torch.Tensor) -> torch.Tensor:
        """DDPM timestep int64 ``(B,)`` of time ``t`` ``(B,)``: ``k = round((1 - t) K_train)``."""
        return ((1.0 - t.detach().double()) * self.num_train_timesteps).round().long()

    def denoise(self, x_t: torch.Tensor, t: torch.Tensor, cond: Any) -> torch.Tensor:
        """The noise (or clean-chunk) prediction ``(B, H, A)`` at DDPM step ``k(t)``."""
        return self.net(x_t, self.timestep(t).to(x_t.device), cond)

    def clean_estimate(self, x_t: torch.Tensor, t: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """``x0 = (x_t - sqrt(1 - abar_k) eps) / sqrt(abar_k)`` for epsilon prediction, ``out`` itself for sample
        prediction (DDIM paper eq. 12); not clipped, differentiable."""
        if self.prediction == Prediction.SAMPLE:
            return out
        abar = self.scheduler.alphas_cumprod.to(x_t.device, x_t.dtype)[self.timestep(t).to(x_t.device)]
        abar = abar[:, None, None]
        return (x_t - (1.0 - abar).sqrt() * out) / abar.sqrt()

    def _times(self, num_steps: int) -> list[float]:
        if self._scheduled_steps != num_steps:
            self.scheduler.set_timesteps(num_steps)
            self._scheduled_steps = num_steps
        return [1.0 - int(k) / self.num_train_timesteps for k in self.scheduler.timesteps]

    def _step(self, x: torch.Tensor, i: int, times: list[float], out: torch.Tensor) -> torch.Tensor:
        k = self.scheduler.timesteps[i]
        return self.scheduler.step(out, k, x).prev_sample


__all__ = ["DDIMSampler", "FlowEulerSampler", "Network", "Sampler"]
