"""The objectives ``policylink finetune qvgm`` trains a policy with, registered by name (``--method`` picks one):
``qvgm`` (Q-guided value-gradient matching, arXiv 2606.08015) and ``critic_awr`` (flow matching weighted by the
critic's chunk advantage, its same-critic baseline); ``--method bc`` is the ``imitation`` objective. Each loss is
built as ``Loss(PolicyFinetune, **options)`` (:class:`PolicyFinetune`: the policy config, the model being
fine-tuned and the critic folder)."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, ClassVar

from policylink.policies.critics import ChunkCritic
from policylink.policies.finetune.critic_awr import CriticAWRLoss
from policylink.policies.finetune.qvgm import QVGMConfig, QVGMLoss
from policylink.train.objectives import ObjectiveConfig, register_objective

FINETUNE_QVGM = "finetune qvgm"


@dataclass(frozen=True)
class QVGMObjectiveConfig(QVGMConfig, ObjectiveConfig):
    """Objective ``qvgm`` (``finetune qvgm --method qvgm``): the options are
    :class:`~policylink.policies.finetune.qvgm.QVGMConfig`'s; trains the policy; needs a trained critic and a flow
    policy."""

    trains: ClassVar[tuple[str, ...]] = ("policy",)
    commands: ClassVar[tuple[str, ...]] = (FINETUNE_QVGM,)
    requires: ClassVar[tuple[str, ...]] = ("critic", "flow")


@dataclass
class CriticAWRConfig(ObjectiveConfig):
    """Objective ``critic_awr`` (``finetune qvgm --method awr``, flags ``--awr_beta`` / ``--awr_max_weight``):
    flow matching weighted by the critic's chunk advantage (:class:`~policylink.policies.finetune.critic_awr.
    CriticAWRLoss`); trains the policy; needs a trained critic.

    Attributes:
        beta: temperature on the batch-standardised advantage (> 0).
        max_weight: weight cap ``w_max`` (> 0).
    """

    trains: ClassVar[tuple[str, ...]] = ("policy",)
    commands: ClassVar[tuple[str, ...]] = (FINETUNE_QVGM,)
    requires: ClassVar[tuple[str, ...]] = ("critic",)

    beta: float = 1.0
    max_weight: float = 20.0


@dataclass
class PolicyFinetune:
    """What ``finetune qvgm`` builds its objective's loss from (the loss's first argument).

    Attributes:
        policy: the checkpoint's policy config (as a train config's ``policy``: the imitation loss reads it).
        model: the policy model being fine-tuned.
        critic_path: the critic folder (``--critic``; empty when the objective needs none).
    """

    policy: Any
    model: Any
    critic_path: str = ""

    def critic(self) -> ChunkCritic:
        """The trained critic of ``critic_path`` (loaded on each call)."""
        return ChunkCritic.load(self.critic_path)

    def reference(self) -> Any:
        """A frozen copy of ``model`` as it is now: the encoder of the critic's latents."""
        return copy.deepcopy(self.model)


class QVGMObjective(QVGMLoss):
    """Q-VGM (arXiv 2606.08015; :class:`~policylink.policies.finetune.qvgm.QVGMLoss`) with the context's critic and a
    frozen copy of its model as the reference. Args: ``context`` (:class:`PolicyFinetune`), ``**options``
    (:class:`~policylink.policies.finetune.qvgm.QVGMConfig` fields). Raises ValueError: a bad option (named)."""

    def __init__(self, context: PolicyFinetune, **options: Any):
        super().__init__(QVGMConfig(**options), context.critic(), context.reference())


class CriticAWRObjective(CriticAWRLoss):
    """Critic-weighted AWR (:class:`~policylink.policies.finetune.critic_awr.CriticAWRLoss`) with the context's
    critic and a frozen copy of its model as the reference. Raises ValueError: ``beta`` or ``max_weight`` <= 0."""

    def __init__(self, context: PolicyFinetune, beta: float = 1.0, max_weight: float = 20.0):
        super().__init__(context.critic(), context.reference(), beta, max_weight)


register_objective("qvgm", QVGMObjectiveConfig, QVGMObjective)
register_objective("critic_awr", CriticAWRConfig, CriticAWRObjective)

__all__ = [
    "FINETUNE_QVGM",
    "CriticAWRConfig",
    "CriticAWRObjective",
    "PolicyFinetune",
    "QVGMObjective",
    "QVGMObjectiveConfig",
]
