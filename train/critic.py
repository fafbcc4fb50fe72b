"""The chunk critic's IQL objective in the one trainer: :func:`iql_optimization` is its optimizer step (Adam at the
critic's learning rate, then the Polyak target update)."""

from __future__ import annotations

from policylink.policies.critics import IQLLoss
from policylink.train.trainer import OptimConfig, Optimization


def iql_optimization(objective: IQLLoss) -> Optimization:
    """Adam over ``objective.trained_modules()`` at ``critic.cfg.lr`` (no clipping, no schedule), with
    :meth:`IQLLoss.after_step` (Polyak) after every step."""
    config = OptimConfig("adam", lr=objective.critic.cfg.lr)
    return Optimization(objective.trained_modules(), config, after_step=objective.after_step)


__all__ = ["iql_optimization"]
