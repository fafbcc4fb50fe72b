"""H2O's dynamics-gap estimate (Niu et al. 2022, "When to Trust Your Simulator: Dynamics-Aware Hybrid
Offline-and-Online Reinforcement Learning", NeurIPS; arXiv 2206.13464, section 4.2).

Two binary classifiers tell real transitions (the robot's) from simulated ones: ``D_sa(s, a)`` and
``D_sas(s, a, s')``, each a small MLP returning the logit of "real". Trained on balanced batches, their logits are
``log p_real(s, a) / p_sim(s, a)`` and ``log p_real(s, a, s') / p_sim(s, a, s')``, so the dynamics ratio is

    log w(s, a, s') = logit D_sas(s, a, s') - logit D_sa(s, a) = log P_real(s' | s, a) / P_sim(s' | s, a)   (eq. 7)

A simulated transition whose next state is as likely under the real dynamics gets ``w ~ 1``; one the real robot
would not produce gets ``w << 1``. The critic weighs each simulated transition's Bellman error by ``w`` clipped to
``[weight_min, weight_max]`` (H2O clips the ratio too), real transitions by 1
(:class:`~policylink.policies.critics.IQLLoss` with ``batch["weight"]``). As in the paper the discriminators see
Gaussian-noised inputs (``noise_std``, in normalised units) so that they do not separate the two datasets by
memorising them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

from policylink.adapters.config_checks import require_counts
from policylink.policies.serialization import load_json, load_tensors, save_json, save_tensors

DISCRIMINATOR_WEIGHTS = "discriminators.safetensors"
DISCRIMINATOR_CONFIG = "discriminators.json"


@dataclass(frozen=True)
class DiscriminatorConfig:
    """Shape and training settings of :class:`DynamicsDiscriminators`.

    Attributes:
        state_dim: ``S`` (normalised state). action_dim: ``A`` (normalised action).
        hidden_dim, n_layers: width and depth of each MLP.
        noise_std: std of the Gaussian noise added to the (normalised) inputs during training.
        weight_min, weight_max: clip of the dynamics ratio ``w`` (H2O: ``[1e-45, 1]``-style clipping; here
            ``[0, 1]`` by default: a simulated transition never outweighs a real one).
        lr: Adam learning rate.

    Raises:
        ValueError: a count below 1, ``noise_std < 0`` or ``weight_min > weight_max`` (names the field).
    """

    state_dim: int
    action_dim: int
    hidden_dim: int = 128
    n_layers: int = 2
    noise_std: float = 0.1
    weight_min: float = 0.0
    weight_max: float = 1.0
    lr: float = 3e-4

    def __post_init__(self) -> None:
        require_counts(self, "h2o.", state_dim=1, action_dim=1, hidden_dim=1, n_layers=1)
        if not self.noise_std >= 0:
            raise ValueError(f"h2o.noise_std: expected >= 0, received {self.noise_std}")
        if not 0 <= self.weight_min <= self.weight_max:
            raise ValueError(
                f"h2o.weight_min/weight_max: expected 0 <= weight_min <= weight_max, received "
                f"{self.weight_min}, {self.weight_max}"
            )


def _mlp(d_in: int, hidden: int, layers: int) -> nn.Sequential:
    mods: list[nn.Module] = []
    for _ in range(layers):
        mods += [nn.Linear(d_in, hidden), nn.ReLU()]
        d_in = hidden
    return nn.Sequential(*mods, nn.Linear(d_in, 1))


class DynamicsDiscriminators(nn.Module):
    """``D_sa`` and ``D_sas`` (float32), with the dynamics ratio of the module docstring.

    Args:
        cfg: :class:`DiscriminatorConfig`.
    """

    def __init__(self, cfg: DiscriminatorConfig):
        super().__init__()
        self.cfg = cfg
        s, a = cfg.state_dim, cfg.action_dim
        self.sa = _mlp(s + a, cfg.hidden_dim, cfg.n_layers)
        self.sas = _mlp(2 * s + a, cfg.hidden_dim, cfg.n_layers)

    def logits(self, s: torch.Tensor, a: torch.Tensor, s2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits of "real" ``(B,)`` of ``D_sa(s, a)`` and ``D_sas(s, a, s')`` for ``s, s2`` ``(B, S)``, ``a``
        ``(B, A)``.

        Raises:
            ValueError: a shape other than ``(B, S)`` / ``(B, A)`` (names the input)."""
        cfg = self.cfg
        for name, x, d in (
            ("state", s, cfg.state_dim),
            ("action", a, cfg.action_dim),
            ("next_state", s2, cfg.state_dim),
        ):
            if x.dim() != 2 or x.shape[1] != d:
                raise ValueError(f"h2o {name}: expected (B, {d}), received {tuple(x.shape)}")
        sa = torch.cat([s, a], -1)
        return self.sa(sa).squeeze(-1), self.sas(torch.cat([sa, s2], -1)).squeeze(-1)

    @torch.no_grad()
    def log_ratio(self, s: torch.Tensor, a: torch.Tensor, s2: torch.Tensor) -> torch.Tensor:
        """``log P_real(s'|s,a) / P_sim(s'|s,a)`` ``(B,)`` (eq. 7), unclipped."""
        l_sa, l_sas = self.logits(s, a, s2)
        return l_sas - l_sa

    @torch.no_grad()
    def weights(self, s: torch.Tensor, a: torch.Tensor, s2: torch.Tensor) -> torch.Tensor:
        """The dynamics ratio ``w`` ``(B,)`` clipped to ``[weight_min, weight_max]``."""
        w = self.log_ratio(s, a, s2).clamp(max=30.0).exp()
        return w.clamp(self.cfg.weight_min, self.cfg.weight_max)

    def save(self, folder: str | Path) -> Path:
        """Write ``discriminators.safetensors`` and ``discriminators.json`` into ``folder``; returns it."""
        folder = Path(folder)
        save_tensors(folder / DISCRIMINATOR_WEIGHTS, self.state_dict())
        save_json(folder / DISCRIMINATOR_CONFIG, asdict(self.cfg))
        return folder

    @classmethod
    def load(cls, folder: str | Path) -> DynamicsDiscriminators:
        """Inverse of :meth:`save`. Raises FileNotFoundError naming a missing file."""
        folder = Path(folder)
        for name in (DISCRIMINATOR_WEIGHTS, DISCRIMINATOR_CONFIG):
            if not (folder / name).exists():
                raise FileNotFoundError(f"h2o: expected {folder / name} (policylink finetune h2o --out)")
        disc = cls(DiscriminatorConfig(**load_json(folder / DISCRIMINATOR_CONFIG)))
        disc.load_state_dict(load_tensors(folder / DISCRIMINATOR_WEIGHTS))
        return disc


class DiscriminatorLoss:
    """The objective of both discriminators: binary cross-entropy of "real" on a batch holding real and simulated
    transitions, inputs noised by ``noise_std`` (drawn from ``generator``).

    Args:
        disc: the :class:`DynamicsDiscriminators` trained in place.

    The batch: ``state``, ``next_state`` ``(B, S)``, ``action`` ``(B, A)`` float32, ``real`` float32 ``(B,)`` (1 =
    real, 0 = simulated), ``noise`` a ``torch.Generator``-drawn ``(B, 2S + A)`` standard normal tensor.
    """

    metrics = ("loss_sa", "loss_sas", "acc_sas")

    def __init__(self, disc: DynamicsDiscriminators):
        self.disc = disc

    def __call__(self, batch: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, float]]:
        """``(BCE(D_sa) + BCE(D_sas), metrics)``."""
        s, a, s2, y = batch["state"], batch["action"], batch["next_state"], batch["real"]
        n = self.disc.cfg.noise_std * batch["noise"]
        S, A = s.shape[1], a.shape[1]
        l_sa, l_sas = self.disc.logits(s + n[:, :S], a + n[:, S : S + A], s2 + n[:, S + A :])
        loss_sa = F.binary_cross_entropy_with_logits(l_sa, y)
        loss_sas = F.binary_cross_entropy_with_logits(l_sas, y)
        acc = float(((l_sas > 0).float() == y).float().mean())
        return loss_sa + loss_sas, {"loss_sa": loss_sa.item(), "loss_sas": loss_sas.item(), "acc_sas": acc}


__all__ = ["DiscriminatorConfig", "DiscriminatorLoss", "DynamicsDiscriminators"]
