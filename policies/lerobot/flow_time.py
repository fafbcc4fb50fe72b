"""The pi0-family time convention (LeRobot's ``pi0``, ``pi05``, ``smolvla``; openpi) converted to ours at the adapter
boundary (DESIGN section 4), so our guidance hooks (RTC, Q-gradient, monitor guidance) run on their action expert
through our one Euler sampler.

pi0 (Black et al. 2024, arXiv 2410.24164; LeRobot ``PI0Pytorch.forward`` / ``sample_actions``) writes
``x_tau = tau * eps + (1 - tau) * a`` with ``tau = 1`` pure noise, target ``u = eps - a``, and integrates
``x <- x - v / K`` from ``tau = 1`` down to 0. Ours: ``x_t = t a + (1 - t) eps``, ``t = 0`` noise, ``v = a - eps``,
``x <- x + v / K`` from ``t = 0``. Hence ``tau = 1 - t`` and ``v_ours = -v_pi``: the two Euler loops visit the same
``x`` at ``t_i = i / K`` (``tau_i = 1 - i / K``), and the clean estimate ``a_hat = x_t + (1 - t) v_ours = x_tau -
tau v_pi`` is the same chunk.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from policylink.policies.common.samplers import FlowEulerSampler, Network

PiVelocity = Callable[[torch.Tensor, torch.Tensor, Any], torch.Tensor]
"""``v_pi(x (B, H, A), tau (B,), cond) -> (B, H, A)``: a pi0-family velocity in its own time (``tau = 1`` noise)."""


def pi0_time(t: torch.Tensor) -> torch.Tensor:
    """pi0's ``tau`` of our ``t`` (either way: the map is its own inverse): ``tau = 1 - t``, float ``(B,)``."""
    return 1.0 - t


def pi0_network(velocity: PiVelocity) -> Network:
    """Our :data:`~policylink.policies.common.samplers.Network` (``t = 0`` noise, ``v = a - eps``) from a pi0-family
    velocity ``v_pi(x, tau, cond)``: ``net(x, t, cond) = -v_pi(x, 1 - t, cond)``."""

    def net(x: torch.Tensor, t: torch.Tensor, cond: Any) -> torch.Tensor:
        return -velocity(x, pi0_time(t), cond)

    return net


def pi0_sampler(model: Any, prefix: tuple, state: torch.Tensor | None = None, num_steps: int | None = None):
    """Our :class:`FlowEulerSampler` over a LeRobot ``PI0Pytorch`` / ``PI05Pytorch`` action expert, with the
    conditioning its ``sample_actions`` builds (the prefix of images and language run once through the VLM into a
    key/value cache). ``sampler.sample(cond, noise, guidance=...)`` then equals ``model.sample_actions(...,
    noise=noise)`` without LeRobot's RTC, and accepts our guidance hooks (``x_t``, ``t`` and ``out`` in our
    convention; the chunk is ``(B, chunk_size, max_action_dim)`` in the model's normalised space).

    Args:
        model: the ``policy.model`` of a loaded LeRobot pi0 / pi05 policy.
        prefix: ``embed_prefix``'s arguments as ``sample_actions`` takes them: pi0 ``(images, img_masks,
            lang_tokens, lang_masks)``, pi05 ``(images, img_masks, tokens, masks)``.
        state: pi0's state ``(B, max_state_dim)`` (its action expert reads it; pi05 has it in the tokens: None).
        num_steps: Euler steps (default ``model.config.num_inference_steps``).

    Returns:
        ``(sampler, cond)``; ``cond`` holds ``prefix_pad_masks``, ``past_key_values`` (and ``state`` for pi0).
    """
    from lerobot.policies.pi0.modeling_pi0 import make_att_2d_masks

    embs, pad_masks, att_masks = model.embed_prefix(*prefix)
    att_4d = model._prepare_attention_masks_4d(make_att_2d_masks(pad_masks, att_masks))
    model.paligemma_with_expert.paligemma.language_model.config._attn_implementation = "eager"
    _, cache = model.paligemma_with_expert.forward(
        attention_mask=att_4d,
        position_ids=torch.cumsum(pad_masks, dim=1) - 1,
        past_key_values=None,
        inputs_embeds=[embs, None],
        use_cache=True,
    )
    cond = {"prefix_pad_masks": pad_masks, "past_key_values": cache, **({} if state is None else {"state": state})}

    def velocity(x: torch.Tensor, tau: torch.Tensor, c: dict[str, Any]) -> torch.Tensor:
        return model.denoise_step(x_t=x, timestep=tau, **c)

    return FlowEulerSampler(pi0_network(velocity), int(num_steps or model.config.num_inference_steps)), cond


__all__ = ["PiVelocity", "pi0_network", "pi0_sampler", "pi0_time"]
