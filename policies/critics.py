"""Chunk critics: an IQL critic (Kostrikov et al. 2021, arXiv 2110.06169) over action chunks, as in Q-chunking
(Li et al. 2025, arXiv 2507.07969), for Q-guided fine-tuning of chunk policies (DESIGN section 4).

A transition is ``(s_t, A_t = a_{t:t+H}, R_t = sum_k gamma^k r_{t+k}, s_{t+H}, d)`` with ``H`` the executed steps
of a chunk; the TD target bootstraps with ``gamma^H`` unless ``d`` (a true termination; a time-limit end
bootstraps). The state ``s`` is a compact vector: the frozen policy's observation latent plus the newest
normalised state (:func:`critic_state`), so the critic never trains the policy's encoder. ``Q`` is an ensemble of
LayerNorm MLP heads with the flattened action chunk injected into every hidden layer (so ``grad_a Q`` is
informative); ``V`` is fitted by expectile regression to the min over the target heads; ``Q`` by TD to ``V``;
target heads follow by Polyak averaging after every gradient step.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from policylink.adapters.config_checks import require_counts, require_within
from policylink.policies.serialization import load_json, load_tensors, refuse_legacy, save_json, save_tensors

CRITIC_WEIGHTS = "critic.safetensors"
CRITIC_CONFIG = "critic.json"
LEGACY_CRITIC_WEIGHTS = "critic.pt"
"""The pickled weights of critic folders written before :data:`CRITIC_WEIGHTS` (refused)."""


@dataclass(frozen=True)
class CriticConfig:
    """Shape and training settings of a :class:`ChunkCritic`.

    Attributes:
        state_dim: ``S``, width of the critic state (latent + normalised state, :func:`critic_state`).
        action_dim: ``A``.
        horizon: ``H``, executed steps per chunk (the action input is ``(B, H, A)``, normalised units).
        hidden_dim, n_layers: width and number of hidden layers of each head.
        n_heads: ensemble size ``E`` (2-10).
        expectile: IQL expectile ``tau`` in ``(0, 1)`` (0.7-0.9; the paper's 0.8).
        gamma: per-step discount.
        polyak: Polyak rate of the target heads (0.005).
        lr: Adam learning rate of Q and V.
    """

    state_dim: int
    action_dim: int
    horizon: int
    hidden_dim: int = 256
    n_layers: int = 3
    n_heads: int = 2
    expectile: float = 0.8
    gamma: float = 0.99
    polyak: float = 0.005
    lr: float = 3e-4

    def validate(self) -> CriticConfig:
        """Return self if consistent. Raises ValueError naming the field, expected and received value."""
        require_counts(self, "critic.", state_dim=1, action_dim=1, horizon=1, hidden_dim=1, n_layers=1, n_heads=1)
        require_within(self, "critic.", expectile="(0, 1)", gamma="(0, 1]", polyak="(0, 1]")
        return self


def expectile_loss(diff: torch.Tensor, expectile: float, sample_weight: torch.Tensor | None = None) -> torch.Tensor:
    """IQL's asymmetric L2 (Kostrikov et al. 2021, eq. 5): ``mean(|tau - 1[diff < 0]| * diff^2)`` with ``diff =
    Q - V`` (any shape). ``tau > 0.5`` weights under-estimates of ``Q`` by ``V`` more (an upper expectile).
    ``sample_weight`` (broadcastable to ``diff``) multiplies each term (H2O's dynamics ratio; None = 1)."""
    weight = torch.where(diff < 0, 1.0 - expectile, expectile)
    if sample_weight is not None:
        weight = weight * sample_weight
    return (weight * diff.square()).mean()


def chunk_td_target(
    ret: torch.Tensor, discount: torch.Tensor, terminal: torch.Tensor, v_next: torch.Tensor
) -> torch.Tensor:
    """``y = R + gamma^n (1 - d) V(s')``, all ``(B,)``: ``ret`` the discounted chunk reward, ``discount`` the
    bootstrap factor ``gamma^n`` (``gamma^H`` for a full chunk), ``terminal`` bool ``d`` (true termination
    only), ``v_next`` ``V(s_{t+H})``."""
    return ret + discount * (~terminal.bool()).to(ret.dtype) * v_next


@torch.no_grad()
def polyak_update(target: nn.Module, source: nn.Module, rate: float) -> None:
    """``theta_target <- (1 - rate) theta_target + rate theta`` for every parameter (in place)."""
    for t, s in zip(target.parameters(), source.parameters(), strict=True):
        t.lerp_(s, rate)


def critic_state(latent: torch.Tensor, obs: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """The critic's state ``(B, D + sum of vector dims)``: the frozen policy's latent ``(B, D)`` plus the newest
    step of every normalised vector observation ``(B, To, d)`` in ``obs`` (images are left to the latent; the
    instruction strings under ``task`` too), in sorted key order."""
    vectors = [v[:, -1] for k, v in sorted(obs.items()) if isinstance(v, torch.Tensor) and v.dim() == 3]
    return torch.cat([latent, *vectors], dim=-1)


def critic_state_dim(model: Any) -> int:
    """``S`` of :func:`critic_state` for a policy model: its latent width plus the width of every vector
    observation feature (shape ``(d,)``) it reads."""
    return int(model.latent_dim) + sum(f.shape[0] for f in model.features.values() if len(f.shape) == 1)


class ActionInjectedMLP(nn.Module):
    """``h_{i+1} = relu(LN(W_i [h_i, a]))``; output ``w [h_L, a]``: a LayerNorm MLP on ``(s, a)`` whose every
    layer also sees the flattened action (Q-VGM's critic; keeps ``grad_a Q`` from vanishing in depth).

    Args:
        in_dim: state width ``S``. action_dim: flattened action width (``H * A``). hidden_dim, n_layers: sizes.
    """

    def __init__(self, in_dim: int, action_dim: int, hidden_dim: int, n_layers: int):
        super().__init__()
        dims = [in_dim, *[hidden_dim] * n_layers]
        self.layers = nn.ModuleList(nn.Linear(d + action_dim, hidden_dim) for d in dims[:-1])
        self.norms = nn.ModuleList(nn.LayerNorm(hidden_dim) for _ in range(n_layers))
        self.out = nn.Linear(hidden_dim + action_dim, 1)

    def forward(self, s: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
        """``(B, S)``, ``(B, H*A)`` -> ``(B,)``."""
        h = s
        for layer, norm in zip(self.layers, self.norms, strict=True):
            h = torch.relu(norm(layer(torch.cat([h, a], dim=-1))))
        return self.out(torch.cat([h, a], dim=-1)).squeeze(-1)


class ChunkCritic(nn.Module):
    """An ensemble of chunk Q heads, their Polyak targets (no gradient) and a state-value net (all float32).

    Args:
        cfg: :class:`CriticConfig` (validated).

    Raises:
        ValueError: a bad config field.
    """

    def __init__(self, cfg: CriticConfig):
        super().__init__()
        self.cfg = cfg.validate()
        flat = cfg.horizon * cfg.action_dim
        self.q_heads = nn.ModuleList(
            ActionInjectedMLP(cfg.state_dim, flat, cfg.hidden_dim, cfg.n_layers) for _ in range(cfg.n_heads)
        )
        self.q_targets = copy.deepcopy(self.q_heads).requires_grad_(False)
        layers: list[nn.Module] = []
        d = cfg.state_dim
        for _ in range(cfg.n_layers):
            layers += [nn.Linear(d, cfg.hidden_dim), nn.LayerNorm(cfg.hidden_dim), nn.ReLU()]
            d = cfg.hidden_dim
        self.v_net = nn.Sequential(*layers, nn.Linear(d, 1))

    def q(self, s: torch.Tensor, a: torch.Tensor, target: bool = False) -> torch.Tensor:
        """Q of every head ``(E, B)`` for states ``(B, S)`` and normalised chunks ``(B, H, A)`` (only the first
        ``H`` steps are read when longer). ``target`` uses the Polyak heads.

        Raises:
            ValueError: the chunk is shorter than ``H`` or has the wrong action dimension.
        """
        h, adim = self.cfg.horizon, self.cfg.action_dim
        if a.dim() != 3 or a.shape[1] < h or a.shape[2] != adim:
            raise ValueError(f"critic action: expected (B, >= {h}, {adim}), received {tuple(a.shape)}")
        flat = a[:, :h].reshape(a.shape[0], -1)
        heads = self.q_targets if target else self.q_heads
        return torch.stack([head(s, flat) for head in heads])

    def actor_q(self, s: torch.Tensor, a: torch.Tensor, pessimism: float = 0.0) -> torch.Tensor:
        """The actor's objective ``(B,)``: mean over the online heads (Q-VGM) minus ``pessimism`` times their
        standard deviation (population; with 2 heads ``pessimism = 1`` gives the min of the two), the lower
        confidence bound of ensemble methods (e.g. SUNRISE, Lee et al. 2021) that keeps an actor off actions the
        heads disagree on."""
        q = self.q(s, a)
        if not pessimism:
            return q.mean(0)
        return q.mean(0) - pessimism * q.std(0, unbiased=False)

    def value(self, s: torch.Tensor) -> torch.Tensor:
        """``V(s)`` ``(B,)``."""
        return self.v_net(s).squeeze(-1)

    def save(self, folder: str | Path) -> Path:
        """Write ``critic.safetensors`` (every weight, targets included) and ``critic.json`` (the
        :class:`CriticConfig`) into ``folder`` (created if needed; other files in it are left alone). Returns the
        folder."""
        folder = Path(folder)
        save_tensors(folder / CRITIC_WEIGHTS, self.state_dict())
        save_json(folder / CRITIC_CONFIG, asdict(self.cfg))
        return folder

    @classmethod
    def load(cls, folder: str | Path, device: torch.device | str = "cpu") -> ChunkCritic:
        """Inverse of :meth:`save`.

        Raises:
            LegacyFormatError: the folder holds the old pickled ``critic.pt`` instead (it is never unpickled).
            FileNotFoundError: a missing file (named).
        """
        folder = Path(folder)
        remedy = f"Train the critic again: policylink finetune critic --policy CKPT --buffer STORE --out {folder}"
        refuse_legacy(folder, CRITIC_WEIGHTS, LEGACY_CRITIC_WEIGHTS, remedy)
        for name in (CRITIC_WEIGHTS, CRITIC_CONFIG):
            if not (folder / name).exists():
                raise FileNotFoundError(f"critic: expected {folder / name} (policylink finetune critic --out)")
        critic = cls(CriticConfig(**load_json(folder / CRITIC_CONFIG)))
        critic.load_state_dict(load_tensors(folder / CRITIC_WEIGHTS))
        return critic.to(device)


class IQLLoss:
    """The IQL objective on a batch of chunk transitions (Kostrikov et al. 2021, Algorithm 1, with
    the chunked target of Q-chunking): ``L_V = expectile(min_e Q'_e(s, A) - V(s))``, ``L_Q = sum_e mean (Q_e(s,
    A) - y)^2`` with ``y = chunk_td_target(R, gamma^n, d, V(s'))``; then Polyak on the targets.

    Args:
        critic: the :class:`ChunkCritic` to train (in place): :meth:`trained_modules` go to the optimizer
            (:func:`policylink.train.critic.iql_optimization`), :meth:`after_step` follows every step.

    The batch (float32 tensors on the critic's device): ``state`` ``(B, S)``, ``action`` ``(B, >=H, A)``,
    ``return`` ``(B,)``, ``discount`` ``(B,)``, ``terminal`` bool ``(B,)``, ``next_state`` ``(B, S)``; optionally
    ``weight`` ``(B,)``, a per-transition weight of both losses (H2O, Niu et al. 2022: a simulated transition's
    Bellman error weighted by its dynamics ratio, :mod:`policylink.policies.finetune.h2o`).
    """

    def __init__(self, critic: ChunkCritic):
        self.critic = critic

    def trained_modules(self) -> list[nn.Module]:
        """The modules the optimizer steps: the online Q heads and the value net (never the targets)."""
        return [self.critic.q_heads, self.critic.v_net]

    def losses(self, batch: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
        """``(L_V, L_Q, metrics)`` for one batch (no optimizer step)."""
        c = self.critic
        s, a = batch["state"], batch["action"]
        with torch.no_grad():
            q_min = c.q(s, a, target=True).min(0).values
            y = chunk_td_target(batch["return"], batch["discount"], batch["terminal"], c.value(batch["next_state"]))
        v = c.value(s)
        w = batch.get("weight")
        loss_v = expectile_loss(q_min - v, c.cfg.expectile, w)
        q = c.q(s, a)
        err = (q - y[None]).square()
        loss_q = (err if w is None else err * w[None]).mean(1).sum()
        metrics = {"loss_v": loss_v.item(), "loss_q": loss_q.item(), "q_mean": q.mean().item()}
        metrics["v_mean"] = v.mean().item()
        return loss_v, loss_q, metrics

    def __call__(self, batch: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, float]]:
        """``(L_V + L_Q, metrics)``: the scalar the optimizer minimises."""
        loss_v, loss_q, metrics = self.losses(batch)
        return loss_v + loss_q, metrics

    def after_step(self) -> None:
        """Polyak update of the target Q heads toward the online ones (``cfg.polyak``)."""
        polyak_update(self.critic.q_targets, self.critic.q_heads, self.critic.cfg.polyak)


__all__ = [
    "ActionInjectedMLP",
    "ChunkCritic",
    "CriticConfig",
    "IQLLoss",
    "chunk_td_target",
    "critic_state",
    "critic_state_dim",
    "expectile_loss",
    "polyak_update",
]
