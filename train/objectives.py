"""Objectives by name: the ``objective: {type: NAME, ...}`` section of a train config, and the registry that maps
a name to its config dataclass and its loss (as the ``policy: {type: ...}`` section maps a name to a policy type).

An objective is a config dataclass (a subclass of :class:`ObjectiveConfig`: the options of the section) and a
:class:`~policylink.train.losses.Loss` class built as ``Loss(train_config, **options)``; it is registered with
:func:`register_objective` (built-ins below, plug-ins anywhere) and chosen in YAML or on the command line::

    objective: {type: advantage, label_dropout: 0.1}      # YAML
    policylink train ... --objective.type awr --objective.beta 0.5

The trainer builds the chosen loss with :func:`make_objective` and never branches on a name. The former flat
spelling ``loss: NAME`` (``--loss``) still selects the type for one release (:func:`resolve_objective`). Nothing
here imports torch: a loss class is named ``"module:Class"`` and imported when a run starts.
"""

from __future__ import annotations

import dataclasses
import importlib
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import draccus

from policylink.adapters.config_checks import require_counts, require_positive, require_within
from policylink.adapters.registry import UnknownNameError, unknown_name_message
from policylink.data.labels import DEFAULT_LABEL_SET

if TYPE_CHECKING:
    from policylink.train.config import TrainConfig
    from policylink.train.losses import Loss

DEFAULT_OBJECTIVE = "imitation"


@dataclass
class ObjectiveConfig(draccus.ChoiceRegistry):
    """The options of one objective (abstract: a registered subclass is instantiated). Its fields are the keyword
    arguments of the objective's loss class; ``type`` (the registry name) selects the subclass."""

    @property
    def type(self) -> str:
        """The registry name of this config's objective (``"imitation"``, ``"awr"``...)."""
        return ObjectiveConfig.get_choice_name(type(self))

    def validate(self, prefix: str = "objective.") -> ObjectiveConfig:
        """Return self if every option is usable; raise ValueError naming ``{prefix}{field}``, the expected and the
        received value. Subclasses with options extend this."""
        return self

    def to_dict(self) -> dict[str, Any]:
        """``{"type": name, **options}`` (YAML-ready; what a checkpoint's train config records)."""
        return {"type": self.type, **dataclasses.asdict(self)}

    @classmethod
    def default_choice_name(cls) -> str | None:
        """:data:`DEFAULT_OBJECTIVE` for a section without ``type``."""
        return DEFAULT_OBJECTIVE if cls is ObjectiveConfig else None


_LOSSES: dict[str, Callable[..., Loss] | str] = {}


def register_objective(
    name: str, config_cls: type[ObjectiveConfig], loss: Callable[..., Loss] | str, *, overwrite: bool = False
) -> None:
    """Register objective ``name``: its options (``config_cls``, a dataclass subclass of :class:`ObjectiveConfig`)
    and its loss, a class or factory ``loss(train_config, **options) -> Loss`` or its ``"module:attribute"``.

    Raises:
        TypeError: ``config_cls`` is not a dataclass subclass of :class:`ObjectiveConfig`.
        ValueError: ``name`` is taken (by another config or loss) and ``overwrite`` is False.
    """
    if not (isinstance(config_cls, type) and issubclass(config_cls, ObjectiveConfig)
            and dataclasses.is_dataclass(config_cls)):  # fmt: skip
        raise TypeError(f"objective {name!r}: expected an ObjectiveConfig dataclass subclass, received {config_cls!r}")
    registry = ObjectiveConfig._choice_registry
    if name in registry and (registry[name], _LOSSES[name]) != (config_cls, loss) and not overwrite:
        raise ValueError(f"objective {name!r}: already registered (pass overwrite=True to replace it)")
    registry[name] = config_cls
    _LOSSES[name] = loss


def available_objectives() -> list[str]:
    """Sorted names of every registered objective."""
    return sorted(_LOSSES)


def objective_config(name: str, field: str = "objective.type", **options: Any) -> ObjectiveConfig:
    """A config of objective ``name`` with ``options``.

    Raises:
        UnknownNameError: ``name`` is not registered (the message names ``field`` and lists the objectives).
    """
    if name not in _LOSSES:
        raise UnknownNameError(unknown_name_message(field, name, available_objectives()))
    return ObjectiveConfig.get_choice_class(name)(**options)


def resolve_objective(cfg: TrainConfig) -> ObjectiveConfig:
    """The objective a run trains: ``cfg.objective``, unless the deprecated ``cfg.loss`` names another type; then that
    type's config, keeping the options of ``cfg.objective`` it also has (``labels`` from advantage to awr).

    Raises:
        UnknownNameError: ``cfg.loss`` or ``cfg.objective``'s type is not registered (the field is named).
    """
    if not cfg.loss or cfg.loss == cfg.objective.type:
        return objective_config(cfg.objective.type, **dataclasses.asdict(cfg.objective))
    warnings.warn("loss: deprecated, use objective.type (--objective.type NAME)", DeprecationWarning, stacklevel=2)
    known = cfg.loss in _LOSSES
    own = {f.name for f in dataclasses.fields(ObjectiveConfig.get_choice_class(cfg.loss))} if known else set()
    kept = {k: v for k, v in dataclasses.asdict(cfg.objective).items() if k in own}
    return objective_config(cfg.loss, "loss", **kept)


def make_objective(cfg: TrainConfig) -> Loss:
    """The loss of the run's objective (:func:`resolve_objective`): ``Loss(cfg, **options)``, validated first.

    Raises:
        UnknownNameError: an unregistered objective. ValueError: a bad option (named) or one the loss refuses.
    """
    objective = resolve_objective(cfg).validate()
    loss = _LOSSES[objective.type]
    if isinstance(loss, str):
        module, _, attr = loss.partition(":")
        loss = getattr(importlib.import_module(module), attr)
    return loss(cfg, **dataclasses.asdict(objective))


# ------------------------------------------------------------------------------------------------ built-ins


@dataclass
class ImitationConfig(ObjectiveConfig):
    """Behaviour cloning of the generative head (:class:`~policylink.train.losses.ImitationLoss`); no options."""


@dataclass
class AdvantageConfig(ObjectiveConfig):
    """Advantage-conditioned behaviour cloning (RECAP in pi*0.6; :class:`~policylink.train.advantage.AdvantageLoss`).

    Attributes:
        labels: label set of the store (``labels/<name>``, written by ``finetune advantage label``).
        label_dropout: probability that a sample's label becomes the null label (RECAP: 0.3; 0.1 when conditioning
            only on positives), so the same network is also the unconditional model for CFG.
    """

    labels: str = DEFAULT_LABEL_SET
    label_dropout: float = 0.3

    def validate(self, prefix: str = "objective.") -> AdvantageConfig:
        require_within(self, prefix, label_dropout="[0, 1]")
        return self


@dataclass
class AWRConfig(ObjectiveConfig):
    """Advantage-weighted regression on stored advantages (Peng et al. 2019, arXiv 1910.00177;
    :class:`~policylink.train.advantage.AWRLoss`).

    Attributes:
        labels: label set whose advantages weight the samples.
        beta: temperature on advantages divided by their standard deviation over the store.
        max_weight: weight cap ``w_max``.
    """

    labels: str = DEFAULT_LABEL_SET
    beta: float = 1.0
    max_weight: float = 20.0

    def validate(self, prefix: str = "objective.") -> AWRConfig:
        require_positive(self, "beta", "max_weight", prefix=prefix)
        return self


@dataclass
class PrefixConditionedConfig(ObjectiveConfig):
    """Flow matching with a clean committed prefix (Black et al. 2025, arXiv 2512.05964;
    :class:`~policylink.train.prefix.PrefixConditionedLoss`).

    Attributes:
        max_delay: the largest committed prefix ``d`` drawn per window, steps (``0 <= max_delay < chunk_size``).
    """

    max_delay: int = 4

    def validate(self, prefix: str = "objective.") -> PrefixConditionedConfig:
        require_counts(self, prefix, max_delay=0)
        return self


register_objective("imitation", ImitationConfig, "policylink.train.losses:ImitationLoss")
register_objective("advantage", AdvantageConfig, "policylink.train.advantage:AdvantageLoss")
register_objective("awr", AWRConfig, "policylink.train.advantage:AWRLoss")
register_objective("prefix_conditioned", PrefixConditionedConfig, "policylink.train.prefix:PrefixConditionedLoss")

__all__ = [
    "AWRConfig",
    "AdvantageConfig",
    "ImitationConfig",
    "ObjectiveConfig",
    "PrefixConditionedConfig",
    "available_objectives",
    "make_objective",
    "objective_config",
    "register_objective",
    "resolve_objective",
]
