"""Chunk transitions of a replay buffer (an episode store with per-step ``reward`` / ``done`` / ``terminated``)
as the critic's tensors, with the frozen policy's latents computed once per buffer (DESIGN section 4, chunk
critic): every window of the store becomes ``(s_t, A_t, R_t, gamma^n, d, s_{t+H})``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from policylink.data.buffer import DONE_KEY, REWARD_KEY, EpisodeStore
from policylink.data.processors import Processors
from policylink.data.recorder import TERMINATED_KEY
from policylink.data.sampler import ACTION_PAD_KEY, NEXT_PREFIX, SequenceDataset
from policylink.policies.critics import critic_state
from policylink.policies.model import ChunkModel


class BufferError(ValueError):
    """A replay buffer cannot train a critic for this policy (no rewards, another env, other features)."""


@dataclass
class TransitionCache:
    """Every chunk transition of a buffer as tensors (float32 unless said; ``N`` windows).

    Attributes:
        state, next_state: ``(N, S)`` critic states of ``s_t`` and ``s_{t+H}`` (:func:`critic_state`).
        action: ``(N, H, A)`` normalised executed chunk.
        ret: ``(N,)`` ``sum_{k<n} gamma^k r_{t+k}``. discount: ``(N,)`` ``gamma^n``. terminal: bool ``(N,)``.
        episode, step: int64 ``(N,)`` the window's episode and anchor step. success: int8 ``(N,)`` episode flag.
    """

    state: torch.Tensor
    action: torch.Tensor
    ret: torch.Tensor
    discount: torch.Tensor
    terminal: torch.Tensor
    next_state: torch.Tensor
    episode: torch.Tensor
    step: torch.Tensor
    success: torch.Tensor

    def __len__(self) -> int:
        return int(self.state.shape[0])

    def batch(self, idx: torch.Tensor | np.ndarray) -> dict[str, torch.Tensor]:
        """The :class:`~policylink.policies.critics.IQLLoss` batch of rows ``idx``."""
        i = torch.as_tensor(np.asarray(idx), dtype=torch.long)
        return {
            "state": self.state[i],
            "action": self.action[i],
            "return": self.ret[i],
            "discount": self.discount[i],
            "terminal": self.terminal[i],
            "next_state": self.next_state[i],
        }


def check_buffer(
    store: EpisodeStore, env: str | None, features: Sequence[str], rewards: bool = True, field: str = "buffer"
) -> None:
    """Raise :class:`BufferError` (one line, naming option ``field``) when ``store`` cannot train a critic for a
    policy trained on ``env`` that reads ``features``: no ``reward`` array or never a non-zero reward (checked when
    ``rewards``), recorded on another env, or a feature missing."""
    where = f"{field} {str(store.path)!r}"
    if rewards and REWARD_KEY not in store.keys:
        raise BufferError(f"{where}: expected a per-step 'reward' array, found keys {store.keys}")
    if rewards and (store.n_steps == 0 or not np.any(store.array(REWARD_KEY)[:] != 0)):
        raise BufferError(f"{where}: expected rewards, found none non-zero in {store.n_steps} steps (no signal)")
    recorded = store.info.get("env")
    if env and recorded and recorded != env:
        raise BufferError(f"{where}: expected episodes of env {env!r} (the policy's), found env {recorded!r}")
    missing = [k for k in features if k not in store.keys]
    if missing:
        raise BufferError(f"{where}: expected the policy's features {list(features)}, missing {missing}")


@torch.no_grad()
def build_transitions(
    store: EpisodeStore | str | Path,
    model: ChunkModel,
    processors: Processors,
    horizon: int,
    gamma: float,
    episodes: Sequence[int] | None = None,
    batch_size: int = 1024,
) -> TransitionCache:
    """Every window of ``store`` (or of ``episodes``) as chunk transitions of ``horizon`` executed steps, with
    states from the frozen ``model``'s encoder (no gradient) after its ``processors``.

    ``d`` is the store's ``terminated`` (true terminations) over the chunk's steps inside the episode; a store
    without it falls back to ``done`` (every episode end, so time-limit ends do not bootstrap there).

    Raises:
        BufferError: no rewards or a missing feature (:func:`check_buffer`).
        ValueError: ``gamma`` outside ``(0, 1]`` or ``horizon < 1``.
    """
    if int(horizon) < 1:
        raise ValueError(f"horizon: expected executed steps >= 1, received {horizon}")
    store = store if isinstance(store, EpisodeStore) else EpisodeStore(store, "r")
    keys = list(model.features)
    check_buffer(store, None, keys)
    has_term = TERMINATED_KEY in store.keys
    to = processors.n_obs_steps
    fields = [REWARD_KEY, DONE_KEY, *([TERMINATED_KEY] if has_term else [])]
    ds = SequenceDataset(
        store,
        n_obs_steps=to,
        horizon=to - 1 + int(horizon),
        obs_keys=keys,
        step_fields=fields,
        episode_fields=("success",),
        episodes=episodes,
        processors=processors,
    )
    model = model.eval()
    parts: dict[str, list[torch.Tensor]] = {}
    for start in range(0, len(ds), batch_size):
        idx = list(range(start, min(start + batch_size, len(ds))))
        raw = ds.get_transitions(idx, gamma)
        for k, v in _rows(raw, model, keys, to, has_term).items():
            parts.setdefault(k, []).append(v)
    return TransitionCache(**{k: torch.cat(v) for k, v in parts.items()})


def _rows(raw: Mapping, model: ChunkModel, keys: list[str], to: int, has_term: bool) -> dict[str, torch.Tensor]:
    obs = {k: raw[k] for k in keys}
    nxt = {k: raw[NEXT_PREFIX + k] for k in keys}
    terminal = raw["terminal"]
    if has_term:
        inside = ~raw[ACTION_PAD_KEY][:, to - 1 :]
        terminal = (raw[TERMINATED_KEY][:, to - 1 :].bool() & inside).any(1)
    return {
        "state": critic_state(model.embed(obs), obs),
        "action": raw["action"][:, to - 1 :],
        "ret": raw["return"].float(),
        "discount": raw["discount"].float(),
        "terminal": terminal.bool(),
        "next_state": critic_state(model.embed(nxt), nxt),
        "episode": raw["episode_index"].long(),
        "step": raw["step"].long(),
        "success": raw["success"].to(torch.int8),
    }


__all__ = ["BufferError", "TransitionCache", "build_transitions", "check_buffer"]
