"""The value model of advantage-conditioned improvement in the one trainer: objective ``value``
(:class:`ValueObjectiveConfig`, :class:`ValueLoss`); :func:`fit_value_model` fits a
:class:`~policylink.policies.finetune.advantage.ValueModel` on frozen policy latents (AdamW through
:func:`~policylink.train.trainer.fit`), :func:`cross_fitted_values` cross-fits it over episodes so that a step's
value never comes from a model that saw that step's return (RECAP in pi*0.6; ALTER in N0-VTLA, arXiv 2607.23782).
Built by ``policylink finetune advantage label --source value``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

import numpy as np
import torch

from policylink.policies.finetune.advantage import ValueConfig, ValueModel
from policylink.train.objectives import ObjectiveConfig, objective_loss, register_objective
from policylink.train.trainer import OptimConfig, Optimization, fit

VALUE_OBJECTIVE = "value"
LABEL_COMMAND = "finetune advantage label"


@dataclass(frozen=True)
class ValueObjectiveConfig(ValueConfig, ObjectiveConfig):
    """Objective ``value``: the options are :class:`~policylink.policies.finetune.advantage.ValueConfig`'s (the
    head, and the steps / batch / learning rate / folds of its fit); trains the value model."""

    trains: ClassVar[tuple[str, ...]] = ("value",)
    commands: ClassVar[tuple[str, ...]] = (LABEL_COMMAND,)


class ValueLoss:
    """The value model's loss (:meth:`~policylink.policies.finetune.advantage.ValueModel.loss`: cross-entropy on
    the two-hot return for ``bins``, squared error for ``mse``) for a new ``ValueModel`` (weights from torch's
    global generator: seed it first) whose input standardisation is the latents' mean / std.

    Args:
        context: the training latents float32 tensor ``(N, D)`` (their width and statistics).
        **options: :class:`~policylink.policies.finetune.advantage.ValueConfig` fields.

    Attributes:
        model: the trained :class:`ValueModel`.
    """

    def __init__(self, context: torch.Tensor, **options: Any):
        self.model = ValueModel(context.shape[1], ValueConfig(**options))
        self.model.mean.copy_(context.mean(0))
        self.model.std.copy_(context.std(0).clamp_min(1e-6))

    def __call__(self, batch: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, float]]:
        """``(loss, {})`` of ``latent`` float32 ``(B, D)`` against ``return`` float32 ``(B,)``."""
        return self.model.loss(batch["latent"], batch["return"]), {}


register_objective(VALUE_OBJECTIVE, ValueObjectiveConfig, ValueLoss)


def fit_value_model(latents: np.ndarray, returns: np.ndarray, cfg: ValueConfig, seed: int = 0) -> ValueModel:
    """Train a :class:`ValueModel` on latents ``(N, D)`` and returns ``(N,)`` (float32 numpy); returns it in eval
    mode. Minibatches of ``cfg.batch_size`` drawn with a generator seeded by ``seed``."""
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    z = torch.as_tensor(np.asarray(latents, np.float32))
    r = torch.as_tensor(np.asarray(returns, np.float32))
    loss = objective_loss(VALUE_OBJECTIVE, z, asdict(cfg), command=LABEL_COMMAND)
    model = loss.model
    run = Optimization(model, OptimConfig("adamw", lr=cfg.lr, weight_decay=1e-4))

    def step_loss(_: int) -> tuple[torch.Tensor, dict[str, float]]:
        idx = torch.randint(0, len(z), (min(cfg.batch_size, len(z)),), generator=g)
        return loss({"latent": z[idx], "return": r[idx]})

    for _ in fit(step_loss, run, cfg.steps):
        pass
    return model.eval()


def cross_fitted_values(
    latents: np.ndarray, returns: np.ndarray, episode_of_step: np.ndarray, cfg: ValueConfig, seed: int = 0
) -> np.ndarray:
    """``V`` float32 ``(N,)`` for every step, each predicted by a model fitted on the other ``cfg.folds - 1``
    folds of episodes (episode ``e`` is in fold ``perm(e) % folds``), so a value never memorises its own return;
    with ``folds = 1`` one model fits and predicts everything.

    Raises:
        ValueError: fewer episodes than folds, or arrays of different lengths.
    """
    ep = np.asarray(episode_of_step, np.int64)
    if not len(latents) == len(returns) == len(ep):
        raise ValueError(f"latents/returns/episodes: expected equal lengths, received {len(latents)}, "
                         f"{len(returns)}, {len(ep)}")  # fmt: skip
    n_ep = int(ep.max()) + 1 if len(ep) else 0
    if n_ep < cfg.folds:
        raise ValueError(f"value.folds: expected <= the number of episodes ({n_ep}), received {cfg.folds}")
    fold_of_ep = np.random.default_rng(seed).permutation(n_ep) % cfg.folds
    fold = fold_of_ep[ep]
    out = np.zeros(len(ep), np.float32)
    for k in range(cfg.folds):
        train = fold != k if cfg.folds > 1 else np.ones(len(ep), bool)
        model = fit_value_model(latents[train], returns[train], cfg, seed + k)
        with torch.no_grad():
            out[fold == k] = model.predict(torch.as_tensor(latents[fold == k])).numpy()
    return out


__all__ = [
    "VALUE_OBJECTIVE",
    "ValueConfig",
    "ValueLoss",
    "ValueObjectiveConfig",
    "cross_fitted_values",
    "fit_value_model",
]
