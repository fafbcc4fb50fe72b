"""The chunk critic's IQL objective in the one trainer: objective ``iql`` (:class:`IQLObjectiveConfig`, the
:class:`~policylink.policies.critics.CriticConfig` of the critic it trains; :class:`IQLObjective`, the loss) and
:func:`iql_optimization`, its optimizer step (Adam at the critic's learning rate, then the Polyak target update).
Built by ``policylink finetune critic`` and, with per-transition weights, by ``finetune h2o``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from policylink.policies.critics import ChunkCritic, CriticConfig, IQLLoss
from policylink.train.objectives import ObjectiveConfig, register_objective
from policylink.train.trainer import OptimConfig, Optimization

IQL_OBJECTIVE = "iql"


@dataclass(frozen=True)
class IQLObjectiveConfig(CriticConfig, ObjectiveConfig):
    """Objective ``iql``: the options are the trained critic's :class:`~policylink.policies.critics.CriticConfig`
    (shape, expectile, discount, Polyak rate, learning rate); trains the critic."""

    trains: ClassVar[tuple[str, ...]] = ("critic",)
    commands: ClassVar[tuple[str, ...]] = ("finetune critic", "finetune h2o")


class IQLObjective(IQLLoss):
    """IQL on chunk transitions (Kostrikov et al. 2021, arXiv 2110.06169; :class:`~policylink.policies.critics.IQLLoss`)
    for a new :class:`~policylink.policies.critics.ChunkCritic` built from the options (its weights drawn from
    torch's global generator: seed it first). The batch -> ``(L_V + L_Q, metrics)`` as :class:`IQLLoss`, an optional
    ``weight`` ``(B,)`` weighting both losses (H2O).

    Args:
        context: unused (the critic's shape is in the options).
        **options: :class:`~policylink.policies.critics.CriticConfig` fields.

    Attributes:
        critic: the trained critic (:meth:`trained_modules`: its online heads and value net).

    Raises:
        ValueError: a bad critic setting (named ``critic.<field>``).
    """

    def __init__(self, context: Any = None, **options: Any):
        super().__init__(ChunkCritic(CriticConfig(**options)))


def iql_optimization(objective: IQLLoss) -> Optimization:
    """Adam over ``objective.trained_modules()`` at ``critic.cfg.lr`` (no clipping, no schedule), with
    :meth:`IQLLoss.after_step` (Polyak) after every step."""
    config = OptimConfig("adam", lr=objective.critic.cfg.lr)
    return Optimization(objective.trained_modules(), config, after_step=objective.after_step)


register_objective(IQL_OBJECTIVE, IQLObjectiveConfig, IQLObjective)

__all__ = ["IQL_OBJECTIVE", "IQLObjective", "IQLObjectiveConfig", "iql_optimization"]
