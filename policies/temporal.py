"""SEGA long-horizon memory (SeedPolicy, Gui et al., arXiv 2603.05117; public code Youqiang-Gui/SeedPolicy):
a fixed-size latent state of ``N`` tokens (width ``W``) updated at every encoded observation window by ``L``
layers of *parallel* cross-attention -- state tokens attend to the window's observation tokens and, from the
same layer inputs, observation tokens attend to the state -- and blended with the previous state by a gate
computed from the pre-softmax state->obs attention logits::

    g_n = sigmoid(mean over obs tokens, layers and heads of logits[l, h, n, :])     # (B, N), per state token
    s_t = g * s_update + (1 - g) * s_{t-1}          g = 1 at reset (the first window of an episode)

The chunk head conditions on the *enhanced* observation tokens (the obs tokens after the layers), flattened.

One state update happens per encoded window: at inference once per row each time its window changed (the
policy's latent cache), i.e. every ``n_action_steps`` with the receding executor; in training a sample is a chain
of ``K`` consecutive windows ``n_action_steps`` apart (:func:`policylink.policies.temporal_config.chain_windows`,
the dataset's ``chain_windows``), the state carried across them and detached every ``sega.detach_every`` windows.
The per-row state lives in the batched policy (:class:`MemoryRows`); ``reset(env_ids)`` clears exactly those rows.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from policylink.adapters.schema import FeatureSpec
from policylink.data.sampler import OBS_PAD_KEY
from policylink.policies.common.encoders import ObservationEncoder
from policylink.policies.temporal_config import SegaConfig


class CrossAttention(nn.Module):
    """Multi-head attention of ``query`` tokens ``(B, Nq, W)`` over ``context`` tokens ``(B, Nk, W)``.

    Returns ``(out (B, Nq, W), logits (B, heads, Nq, Nk))``, ``logits`` the scaled dot products before softmax.
    """

    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads, self.scale = heads, (width // heads) ** -0.5
        self.q, self.kv, self.proj = nn.Linear(width, width), nn.Linear(width, 2 * width), nn.Linear(width, width)

    def forward(self, query: torch.Tensor, context: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        b, nq, w = query.shape
        q = self.q(query).reshape(b, nq, self.heads, -1).transpose(1, 2)  # (B, h, Nq, d)
        k, v = self.kv(context).reshape(b, context.shape[1], 2, self.heads, -1).permute(2, 0, 3, 1, 4)
        logits = (q @ k.transpose(-2, -1)) * self.scale  # (B, h, Nq, Nk)
        out = (logits.softmax(-1) @ v).transpose(1, 2).reshape(b, nq, w)
        return self.proj(out), logits


class UpdateBlock(nn.Module):
    """Pre-norm block on ``tokens`` ``(B, N, W)`` given ``context`` ``(B, M, W)``: self-attention, cross-attention
    to the context, MLP (each residual). Returns ``(tokens', cross-attention logits (B, heads, N, M))``."""

    def __init__(self, width: int, heads: int, mlp_ratio: float):
        super().__init__()
        self.norm_self, self.norm_cross, self.norm_ctx, self.norm_mlp = (nn.LayerNorm(width) for _ in range(4))
        self.self_attn = CrossAttention(width, heads)
        self.cross_attn = CrossAttention(width, heads)
        hidden = max(1, int(round(width * mlp_ratio)))
        self.mlp = nn.Sequential(nn.Linear(width, hidden), nn.GELU(), nn.Linear(hidden, width))

    def forward(self, tokens: torch.Tensor, context: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.norm_self(tokens)
        tokens = tokens + self.self_attn(x, x)[0]
        out, logits = self.cross_attn(self.norm_cross(tokens), self.norm_ctx(context))
        tokens = tokens + out
        return tokens + self.mlp(self.norm_mlp(tokens)), logits


class SegaMemory(nn.Module):
    """The gated state update: ``(obs tokens (B, T, W), state (B, N, W) | None, reset bool (B,) | None) ->
    (enhanced obs tokens (B, T, W), new state (B, N, W), gate (B, N))``.

    ``state=None`` or ``reset[b]`` True start row ``b`` from the learned initial tokens with gate 1 (so the new
    state is the update itself). Deterministic (no dropout).
    """

    def __init__(self, cfg: SegaConfig):
        super().__init__()
        w, n = cfg.width, cfg.tokens
        self.initial = nn.Parameter(torch.randn(1, n, w) * 0.02)
        self.position = nn.Parameter(torch.zeros(1, n, w))
        self.state_blocks = nn.ModuleList(UpdateBlock(w, cfg.heads, cfg.mlp_ratio) for _ in range(cfg.layers))
        self.obs_blocks = nn.ModuleList(UpdateBlock(w, cfg.heads, cfg.mlp_ratio) for _ in range(cfg.layers))
        self.norm_state, self.norm_obs = nn.LayerNorm(w), nn.LayerNorm(w)

    def initial_state(self, batch_size: int) -> torch.Tensor:
        """The reset state ``(B, N, W)`` (the learned initial tokens)."""
        return self.initial.expand(batch_size, -1, -1)

    def forward(
        self, obs_tokens: torch.Tensor, state: torch.Tensor | None = None, reset: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        b = obs_tokens.shape[0]
        init = self.initial_state(b)
        if state is None:
            state, reset = init, torch.ones(b, dtype=torch.bool, device=obs_tokens.device)
        elif reset is not None:
            state = torch.where(reset[:, None, None], init, state)
        s = state + self.position
        o, logits = obs_tokens, []
        for state_block, obs_block in zip(self.state_blocks, self.obs_blocks):
            s_next, lg = state_block(s, o)  # state -> obs
            o = obs_block(o, s)[0]  # obs -> state, from the same layer inputs (parallel)
            s = s_next
            logits.append(lg)
        gate = torch.sigmoid(torch.stack(logits).mean(dim=(0, 2, 4)))  # (L, B, h, N, T) -> (B, N)
        if reset is not None:
            gate = torch.where(reset[:, None], torch.ones_like(gate), gate)
        updated = self.norm_state(s) - self.position
        new_state = gate[..., None] * updated + (1.0 - gate[..., None]) * state
        return self.norm_obs(o), new_state, gate


class MemoryRows:
    """Per-row SEGA states of a batched policy: float32 ``(B, N, W)`` plus a ``started`` flag per row (False =
    the row was reset: its next window starts from the initial tokens with gate 1)."""

    def __init__(self) -> None:
        self.states: torch.Tensor | None = None
        self.started: np.ndarray | None = None

    def reset(self, env_ids: Sequence[int] | np.ndarray | None = None) -> None:
        """Clear rows ``env_ids`` (``None`` = all, which also forgets ``B``)."""
        if env_ids is None or self.started is None:
            self.states = self.started = None
            return
        self.started[np.asarray(env_ids, np.int64)] = False

    def get(self, ids: np.ndarray, batch_size: int) -> tuple[torch.Tensor | None, torch.Tensor]:
        """``(states (len(ids), N, W) or None before any update, reset bool (len(ids),))`` for rows ``ids``."""
        if self.started is None or len(self.started) != batch_size:
            self.states, self.started = None, np.zeros(batch_size, bool)
        reset = torch.as_tensor(~self.started[ids])
        if self.states is None:
            return None, reset
        return self.states[torch.as_tensor(ids, device=self.states.device)], reset.to(self.states.device)

    def set(self, ids: np.ndarray, states: torch.Tensor, batch_size: int) -> None:
        """Store the new states ``(len(ids), N, W)`` of rows ``ids`` (detached) and mark them started."""
        if self.states is None:
            self.states = states.new_zeros(batch_size, *states.shape[1:])
        self.states[torch.as_tensor(ids, device=states.device)] = states.detach()
        self.started[ids] = True


class SegaEncoder(nn.Module):
    """Window encoder + SEGA: per-step features (:class:`ObservationEncoder`) -> tokens of width ``W`` -> the gated
    memory -> enhanced tokens flattened, float32 ``(B, T * W)`` (``out_dim``).

    ``forward(obs, memory=None)``: ``obs[key]`` windows ``(B, T, ...)`` as for :class:`ObservationEncoder`.
    With ``memory = (rows: MemoryRows, ids, batch_size)`` the state of those rows is read and updated; without
    it every row starts from the reset state. A training chain -- windows ``(B, K * T, ...)`` of ``K``
    consecutive windows oldest first with ``obs["observation_is_pad"]`` bool ``(B, K * T)`` -- is unrolled:
    windows whose newest step is padded (before the episode start) are skipped, the first real one resets, the
    state is detached every ``cfg.detach_every`` windows, and the last window's tokens are returned.

    Raises:
        ValueError: a chain without ``observation_is_pad``, or a window length not a multiple of ``T``.
    """

    def __init__(self, features: Mapping[str, FeatureSpec], n_obs_steps: int, encoder_cfg: Any, cfg: SegaConfig):
        super().__init__()
        self.steps = ObservationEncoder(features, 1, encoder_cfg)  # per-step features (B*T, step_dim)
        self.keys = sorted(self.steps.image_keys + self.steps.vector_keys)
        self.project = nn.Linear(self.steps.step_dim, cfg.width)
        self.time = nn.Parameter(torch.zeros(1, n_obs_steps, cfg.width))
        self.memory = SegaMemory(cfg)
        self.cfg, self.n_obs_steps = cfg, n_obs_steps
        self.out_dim = n_obs_steps * cfg.width

    def tokens(self, obs: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Observation tokens ``(B, T', W)`` of windows ``(B, T', ...)`` (any ``T'``; time embedding per window)."""
        b, t = obs[self.keys[0]].shape[:2]
        flat = {k: obs[k].reshape(b * t, 1, *obs[k].shape[2:]) for k in self.keys}
        x = self.project(self.steps(flat)).reshape(b, t // self.n_obs_steps, self.n_obs_steps, -1)
        return (x + self.time[:, None]).reshape(b, t, -1)

    def forward(self, obs: Mapping[str, torch.Tensor], memory: tuple[MemoryRows, np.ndarray, int] | None = None):
        b, total = obs[self.keys[0]].shape[:2]
        t = self.n_obs_steps
        if total % t:
            raise ValueError(f"observation window: expected a multiple of n_obs_steps={t} steps, received {total}")
        tokens = self.tokens(obs)
        if total == t:
            state, reset = (None, None) if memory is None else memory[0].get(memory[1], memory[2])
            enhanced, new_state, _ = self.memory(tokens, state, reset)
            if memory is not None:
                memory[0].set(memory[1], new_state, memory[2])
            return enhanced.flatten(1)
        if OBS_PAD_KEY not in obs:
            raise ValueError(f"a chain of {total // t} windows needs obs[{OBS_PAD_KEY!r}] (B, {total}); not given")
        started = ~obs[OBS_PAD_KEY].reshape(b, -1, t)[:, :, -1]  # (B, K): the window's newest step is real
        return self._unroll(tokens.reshape(b, -1, t, tokens.shape[-1]), started.to(tokens.device))

    def _unroll(self, tokens: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
        """Chain ``(B, K, T, W)`` with ``real`` bool ``(B, K)`` -> the last window's enhanced tokens ``(B, T*W)``."""
        state, out = self.memory.initial_state(tokens.shape[0]), None
        seen = torch.zeros_like(real[:, 0])
        for k in range(tokens.shape[1]):
            enhanced, new_state, _ = self.memory(tokens[:, k], state, ~seen)
            keep = real[:, k, None, None]
            state = torch.where(keep, new_state, state)
            seen = seen | real[:, k]
            if self.cfg.detach_every and (k + 1) % self.cfg.detach_every == 0:
                state = state.detach()
            out = enhanced
        return out.flatten(1)


def observation_encoder(
    features: Mapping[str, FeatureSpec], n_obs_steps: int, cfg: Any
) -> ObservationEncoder | SegaEncoder:
    """The observation encoder of policy config ``cfg``: :class:`SegaEncoder` for ``cfg.memory == "sega"``, else
    :class:`ObservationEncoder` (both map windows ``(B, T, ...)`` to ``(B, out_dim)``)."""
    if getattr(cfg, "memory", "none") == "sega":
        return SegaEncoder(features, n_obs_steps, cfg.encoder, cfg.sega)
    return ObservationEncoder(features, n_obs_steps, cfg.encoder)


__all__ = ["CrossAttention", "MemoryRows", "SegaEncoder", "SegaMemory", "UpdateBlock", "observation_encoder"]
