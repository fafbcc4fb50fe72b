"""Advantage-conditioned improvement (RECAP in pi*0.6; ALTER in N0-VTLA, arXiv 2607.23782), policy side: a value
model on the frozen policy's observation latents (``embed``), cross-fitted over episodes so that a step's value
never comes from a model that saw that step's return, the latents of every step of a store, and the
advantage-weighted regression baseline's weights (AWR, Peng et al. 2019, arXiv 1910.00177).

The labels themselves (n-step advantage, thresholds, failure windows, storage) are in :mod:`policylink.data.labels`;
the conditioning slot, label dropout and classifier-free guidance in :mod:`policylink.policies.common.conditioning`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from policylink.adapters.config_checks import require_choice, require_counts
from policylink.data.buffer import EpisodeStore
from policylink.data.processors import Processors
from policylink.data.sampler import SequenceDataset
from policylink.policies.model import ChunkModel

VALUE_KINDS = ("bins", "mse")


@dataclass(frozen=True)
class ValueConfig:
    """The value model ``V(o_t)`` on frozen latents.

    Attributes:
        kind: ``"bins"``, a distributional head (cross-entropy on a two-hot target over ``num_bins`` evenly spaced
            bins on ``[v_min, v_max]``, value = the expected bin centre; RECAP's value model is distributional) or
            ``"mse"`` (a scalar regression).
        num_bins: number of value bins (``kind="bins"``).
        v_min: centre of the lowest bin (RECAP's normalised returns lie in ``[-1, 0]``).
        v_max: centre of the highest bin.
        hidden: width of the value MLP's hidden layers (its input latent standardised).
        layers: hidden layers of the value MLP.
        steps: AdamW steps per fold.
        batch_size: latents per AdamW step.
        lr: AdamW learning rate.
        folds: episode folds for cross-fitting (1 = fit and predict on all episodes).
    """

    kind: str = "bins"
    num_bins: int = 41
    v_min: float = -1.0
    v_max: float = 0.0
    hidden: int = 256
    layers: int = 2
    steps: int = 1500
    batch_size: int = 256
    lr: float = 1e-3
    folds: int = 2

    def __post_init__(self) -> None:
        require_choice(self, "value.", kind=VALUE_KINDS)
        if self.kind == "bins" and (self.num_bins < 2 or not self.v_min < self.v_max):
            raise ValueError(f"value bins: expected num_bins >= 2 and v_min < v_max, received {self.num_bins}, "
                             f"[{self.v_min}, {self.v_max}]")  # fmt: skip
        require_counts(self, "value.", folds=1, steps=1)


class ValueModel(nn.Module):
    """``V(z)`` from latents ``z`` float32 ``(N, D)``: standardise (training-set mean / std) -> MLP ->
    ``num_bins`` logits or one scalar.

    Args:
        latent_dim: ``D``. cfg: :class:`ValueConfig`.
    """

    def __init__(self, latent_dim: int, cfg: ValueConfig):
        super().__init__()
        self.cfg = cfg
        out = cfg.num_bins if cfg.kind == "bins" else 1
        layers: list[nn.Module] = []
        width = latent_dim
        for _ in range(cfg.layers):
            layers += [nn.Linear(width, cfg.hidden), nn.GELU()]
            width = cfg.hidden
        layers.append(nn.Linear(width, out))
        self.net = nn.Sequential(*layers)
        self.register_buffer("centers", torch.linspace(cfg.v_min, cfg.v_max, max(cfg.num_bins, 2)))
        self.register_buffer("mean", torch.zeros(latent_dim))  # input standardisation (set by train.value)
        self.register_buffer("std", torch.ones(latent_dim))

    def forward(self, latents: torch.Tensor) -> torch.Tensor:
        """Raw head output ``(N, num_bins)`` logits (bins) or ``(N, 1)`` (mse) of standardised latents."""
        return self.net((latents - self.mean) / self.std)

    def predict(self, latents: torch.Tensor) -> torch.Tensor:
        """Value estimate float32 ``(N,)`` (bins: ``sum_k softmax_k * centre_k``)."""
        out = self(latents)
        if self.cfg.kind == "bins":
            return (out.softmax(-1) * self.centers).sum(-1)
        return out[:, 0]

    def loss(self, latents: torch.Tensor, returns: torch.Tensor) -> torch.Tensor:
        """Scalar training loss against returns ``(N,)``: cross-entropy to :func:`two_hot` targets, or MSE."""
        out = self(latents)
        if self.cfg.kind == "bins":
            target = two_hot(returns, self.cfg.v_min, self.cfg.v_max, self.cfg.num_bins)
            return -(target * out.log_softmax(-1)).sum(-1).mean()
        return (out[:, 0] - returns).square().mean()


def two_hot(values: torch.Tensor, v_min: float, v_max: float, num_bins: int) -> torch.Tensor:
    """Two-hot encoding ``(N, K)`` of ``values`` ``(N,)`` on ``K`` evenly spaced centres over ``[v_min, v_max]``:
    the mass splits between the two nearest centres so that the expected centre equals the (clipped) value.
    E.g. centres ``[-1, -0.5, 0]`` and value ``-0.25`` -> ``[0, 0.5, 0.5]``."""
    v = values.float().clamp(v_min, v_max)
    pos = (v - v_min) / (v_max - v_min) * (num_bins - 1)
    lo = pos.floor().clamp(max=num_bins - 2).long()
    frac = pos - lo.float()
    out = torch.zeros(v.shape[0], num_bins, dtype=torch.float32, device=v.device)
    out.scatter_(1, lo[:, None], (1.0 - frac)[:, None])
    out.scatter_add_(1, (lo + 1)[:, None], frac[:, None])
    return out


def store_latents(model: ChunkModel, processors: Processors, store: EpisodeStore, batch_size: int = 512) -> np.ndarray:
    """The frozen policy's observation latent ``embed`` of every step of ``store``, float32 ``(N_steps, D)`` in the
    store's order (the window of step ``t`` ends at ``t``; the first steps of an episode repeat its first
    observation, as in training and at inference).

    Raises:
        KeyError: the store lacks one of the policy's observation keys.
    """
    cfg = model.cfg
    ds = SequenceDataset(
        store, **processors.window_args(training=False), horizon=processors.n_obs_steps,
        obs_keys=list(cfg.observation_keys), processors=processors,
    )  # fmt: skip
    if len(ds) != store.n_steps:  # one window per step (default padding)
        raise AssertionError(f"store_latents: expected {store.n_steps} windows, received {len(ds)}")
    out = []
    model.eval()
    with torch.no_grad():
        for i in range(0, len(ds), batch_size):
            batch = ds.get_batch(range(i, min(i + batch_size, len(ds))))
            out.append(model.embed({k: batch[k] for k in ds.obs_keys}).float().numpy())
    return np.concatenate(out) if out else np.zeros((0, model.latent_dim), np.float32)


def awr_weights(advantage: torch.Tensor, beta: float, max_weight: float) -> torch.Tensor:
    """Advantage-weighted regression weights ``w = min(exp(A / beta), w_max)`` ``(B,)``, computed as
    ``exp(min(A / beta, log w_max))`` so that no intermediate overflows (``A = 1e4`` gives ``w_max``).

    Raises:
        ValueError: ``beta <= 0`` or ``max_weight <= 0``.
    """
    if not beta > 0 or not max_weight > 0:
        raise ValueError(f"awr beta / max_weight: expected > 0, received {beta}, {max_weight}")
    return torch.exp(torch.clamp(advantage.float() / beta, max=math.log(max_weight)))


__all__ = [
    "VALUE_KINDS",
    "ValueConfig",
    "ValueModel",
    "awr_weights",
    "store_latents",
    "two_hot",
]
