"""Objectives by name: every loss the product trains (a policy's imitation, advantage and AWR objectives; the
fine-tune jobs' Q-VGM, critic-weighted AWR, chunk-critic IQL, value model, corrector monitor and H2O
discriminators), and the registry that maps a name to its config dataclass and its loss (as the ``policy: {type:
...}`` section maps a name to a policy type).

An objective is a config dataclass (a subclass of :class:`ObjectiveConfig`: the options of the objective, plus
its declarations :attr:`~ObjectiveConfig.trains`, :attr:`~ObjectiveConfig.commands` and
:attr:`~ObjectiveConfig.requires`) and a :class:`~policylink.train.losses.Loss`-like class built as
``Loss(context, **options)``, ``context`` being what its command builds it from (a train config for ``train``;
each fine-tune objective documents its own); it is registered with :func:`register_objective` (built-ins below
and in the fine-tune modules of :data:`BUILT_IN_MODULES`, plug-ins anywhere). The objectives of ``policylink
train`` are chosen in YAML or on the command line::

    objective: {type: advantage, label_dropout: 0.1}      # YAML
    policylink train ... --objective.type awr --objective.beta 0.5

and the fine-tune commands look theirs up by name too (``finetune qvgm --method NAME``, :func:`objective_loss`).
The trainer builds the chosen loss with :func:`make_objective` and never branches on a name. The former flat
spelling ``loss: NAME`` (``--loss``) still selects the type for one release (:func:`resolve_objective`). Nothing
here imports torch: a loss class is named ``"module:Class"`` and imported when a run starts, and the fine-tune
objectives (whose configs extend the torch-side ``QVGMConfig``, ``CriticConfig``...) register when their module is
first looked up.
"""

from __future__ import annotations

import dataclasses
import importlib
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import draccus

from policylink.adapters.config_checks import require_counts, require_positive, require_within
from policylink.adapters.registry import UnknownNameError, unknown_name_message
from policylink.data.labels import DEFAULT_LABEL_SET

if TYPE_CHECKING:
    from policylink.train.config import TrainConfig
    from policylink.train.losses import Loss

DEFAULT_OBJECTIVE = "imitation"
TRAIN = "train"
"""The command name of ``policylink train`` (and ``finetune advantage train``) in :attr:`ObjectiveConfig.commands`:
its objectives are built from the run's train config and are the choices of its ``objective`` section."""
BUILT_IN_MODULES = (
    "policylink.train.critic",
    "policylink.train.qvgm_objectives",
    "policylink.train.value",
    "policylink.train.monitor",
    "policylink.train.h2o",
)
"""Modules that register the fine-tune objectives when imported (they import torch: loaded on the first lookup)."""


@dataclass
class ObjectiveConfig(draccus.ChoiceRegistry):
    """The options of one objective (abstract: a registered subclass is instantiated). Its fields are the keyword
    arguments of the objective's loss class; ``type`` (the registry name) selects the subclass.

    Class attributes (declarations, not options):
        trains: the modules the objective's optimizer steps, by role: ``policy``, ``critic``, ``value``,
            ``monitor``, ``discriminators``.
        commands: the commands that build its loss, each passing its own context as the loss's first argument:
            ``train`` (a :class:`~policylink.train.config.TrainConfig`), ``finetune qvgm``, ``finetune critic``,
            ``finetune advantage label``, ``finetune monitor``, ``finetune h2o``. Only ``train`` objectives are
            choices of a train config's ``objective`` section.
        requires: inputs the command must provide besides its data: ``critic`` (a trained chunk critic,
            ``--critic``), ``flow`` (a policy whose sampler predicts a velocity).
    """

    trains: ClassVar[tuple[str, ...]] = ("policy",)
    commands: ClassVar[tuple[str, ...]] = (TRAIN,)
    requires: ClassVar[tuple[str, ...]] = ()

    @property
    def type(self) -> str:
        """The registry name of this config's objective (``"imitation"``, ``"awr"``...).

        Raises:
            ValueError: the config class is not registered.
        """
        for name, config_cls in _CONFIGS.items():
            if config_cls is type(self):
                return name
        raise ValueError(f"objective: {type(self).__name__} is not a registered objective config")

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


_CONFIGS: dict[str, type[ObjectiveConfig]] = {}
_LOSSES: dict[str, Callable[..., Any] | str] = {}


def register_objective(
    name: str, config_cls: type[ObjectiveConfig], loss: Callable[..., Any] | str, *, overwrite: bool = False
) -> None:
    """Register objective ``name``: its options and declarations (``config_cls``, a dataclass subclass of
    :class:`ObjectiveConfig`) and its loss, a class or factory ``loss(context, **options)`` or its
    ``"module:attribute"``. An objective of :data:`TRAIN` also becomes a choice of the train config's
    ``objective`` section.

    Raises:
        TypeError: ``config_cls`` is not a dataclass subclass of :class:`ObjectiveConfig`, or its ``trains`` /
            ``commands`` is not a non-empty tuple of names.
        ValueError: ``name`` is taken (by another config or loss) and ``overwrite`` is False.
    """
    if not (isinstance(config_cls, type) and issubclass(config_cls, ObjectiveConfig)
            and dataclasses.is_dataclass(config_cls)):  # fmt: skip
        raise TypeError(f"objective {name!r}: expected an ObjectiveConfig dataclass subclass, received {config_cls!r}")
    for attr in ("trains", "commands", "requires"):
        value = getattr(config_cls, attr)
        if not (isinstance(value, tuple) and all(isinstance(v, str) and v for v in value)
                and (value or attr == "requires")):  # fmt: skip
            raise TypeError(f"objective {name!r}: expected {config_cls.__name__}.{attr} a non-empty tuple of names, "
                            f"received {value!r}")  # fmt: skip
    if name in _CONFIGS and (_CONFIGS[name], _LOSSES[name]) != (config_cls, loss) and not overwrite:
        raise ValueError(f"objective {name!r}: already registered (pass overwrite=True to replace it)")
    _CONFIGS[name] = config_cls
    _LOSSES[name] = loss
    choices = ObjectiveConfig._choice_registry
    if TRAIN in config_cls.commands:
        choices[name] = config_cls
    else:
        choices.pop(name, None)


def unregister_objective(name: str) -> None:
    """Remove objective ``name`` (a plug-in's, in its tests); no error when it is not registered."""
    for table in (_CONFIGS, _LOSSES, ObjectiveConfig._choice_registry):
        table.pop(name, None)


def available_objectives(command: str | None = None) -> list[str]:
    """Sorted names of every registered objective (the fine-tune ones included), or of those ``command`` builds
    (``"train"``, ``"finetune qvgm"``... see :attr:`ObjectiveConfig.commands`)."""
    _load_built_ins()
    return sorted(n for n, c in _CONFIGS.items() if command is None or command in c.commands)


def objective_class(name: str, field: str = "objective.type", command: str | None = None) -> type[ObjectiveConfig]:
    """The config class of objective ``name`` (its options and declarations).

    Raises:
        UnknownNameError: ``name`` is not registered, or (with ``command``) not built by ``command``; the message
            names ``field`` and lists the objectives ``command`` builds.
    """
    if name not in _CONFIGS:
        _load_built_ins()
    config_cls = _CONFIGS.get(name)
    if config_cls is None or (command is not None and command not in config_cls.commands):
        other = "" if config_cls is None else f" (objective {name!r} is built by {' / '.join(config_cls.commands)})"
        raise UnknownNameError(unknown_name_message(field, name, available_objectives(command)) + other)
    return config_cls


def objective_config(name: str, field: str = "objective.type", **options: Any) -> ObjectiveConfig:
    """A config of objective ``name`` with ``options``.

    Raises:
        UnknownNameError: ``name`` is not registered (the message names ``field`` and lists the objectives).
    """
    return objective_class(name, field)(**options)


def objective_loss(
    name: str,
    context: Any,
    options: Mapping[str, Any] | None = None,
    *,
    command: str,
    field: str = "objective.type",
) -> Any:
    """The loss of objective ``name`` as ``command`` builds it: its config from ``options`` (validated), then
    ``Loss(context, **options)`` with every option of the config.

    Args:
        name: a registered objective built by ``command``.
        context: what ``command`` builds its objectives' losses from (see :attr:`ObjectiveConfig.commands`).
        options: keyword arguments of the objective's config (missing ones keep their defaults).
        command: the building command, e.g. ``"finetune critic"``.
        field: the option that named the objective (named in the error).

    Raises:
        UnknownNameError: ``name`` is not registered or not built by ``command`` (names ``field``).
        ValueError / TypeError: an option the config refuses (named) or does not have.
    """
    config = objective_class(name, field, command)(**dict(options or {}))
    return _build(name, config.validate(), context)


def resolve_objective(cfg: TrainConfig) -> ObjectiveConfig:
    """The objective a run trains: ``cfg.objective``, unless the deprecated ``cfg.loss`` names another type; then that
    type's config, keeping the options of ``cfg.objective`` it also has (``labels`` from advantage to awr).

    Raises:
        UnknownNameError: ``cfg.loss`` or ``cfg.objective``'s type is not an objective of ``policylink train`` (the
            field is named).
    """
    if not cfg.loss or cfg.loss == cfg.objective.type:
        return objective_class(cfg.objective.type, command=TRAIN)(**dataclasses.asdict(cfg.objective))
    warnings.warn("loss: deprecated, use objective.type (--objective.type NAME)", DeprecationWarning, stacklevel=2)
    config_cls = objective_class(cfg.loss, "loss", TRAIN)
    own = {f.name for f in dataclasses.fields(config_cls)}
    return config_cls(**{k: v for k, v in dataclasses.asdict(cfg.objective).items() if k in own})


def make_objective(cfg: TrainConfig) -> Loss:
    """The loss of the run's objective (:func:`resolve_objective`): ``Loss(cfg, **options)``, validated first.

    Raises:
        UnknownNameError: an unregistered objective. ValueError: a bad option (named) or one the loss refuses.
    """
    objective = resolve_objective(cfg).validate()
    return _build(objective.type, objective, cfg)


def _build(name: str, config: ObjectiveConfig, context: Any) -> Any:
    """``loss(context, **options of config)`` for objective ``name``'s registered loss (imported when named)."""
    loss = _LOSSES[name]
    if isinstance(loss, str):
        module, _, attr = loss.partition(":")
        loss = getattr(importlib.import_module(module), attr)
    return loss(context, **dataclasses.asdict(config))


def _load_built_ins() -> None:
    """Import :data:`BUILT_IN_MODULES` (each registers its objectives on import; a no-op after the first call)."""
    for module in BUILT_IN_MODULES:
        importlib.import_module(module)


# ------------------------------------------------------------------------------------------------ built-ins


@dataclass
class ImitationConfig(ObjectiveConfig):
    """Behaviour cloning of the generative head (:class:`~policylink.train.losses.ImitationLoss`); no options.
    Also ``finetune qvgm --method bc`` (filtered BC), built from that command's context (its ``policy``)."""

    trains: ClassVar[tuple[str, ...]] = ("policy",)
    commands: ClassVar[tuple[str, ...]] = (TRAIN, "finetune qvgm")


@dataclass
class AdvantageConfig(ObjectiveConfig):
    """Advantage-conditioned behaviour cloning (RECAP in pi*0.6; :class:`~policylink.train.advantage.AdvantageLoss`).

    Attributes:
        labels: label set of the store (``labels/<name>``, written by ``finetune advantage label``).
        label_dropout: probability that a sample's label becomes the null label (RECAP: 0.3; 0.1 when conditioning
            only on positives), so the same network is also the unconditional model for CFG.
    """

    trains: ClassVar[tuple[str, ...]] = ("policy",)
    commands: ClassVar[tuple[str, ...]] = (TRAIN,)

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

    trains: ClassVar[tuple[str, ...]] = ("policy",)
    commands: ClassVar[tuple[str, ...]] = (TRAIN,)

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

    trains: ClassVar[tuple[str, ...]] = ("policy",)
    commands: ClassVar[tuple[str, ...]] = (TRAIN,)

    max_delay: int = 4

    def validate(self, prefix: str = "objective.") -> PrefixConditionedConfig:
        require_counts(self, prefix, max_delay=0)
        return self


register_objective("imitation", ImitationConfig, "policylink.train.losses:ImitationLoss")
register_objective("advantage", AdvantageConfig, "policylink.train.advantage:AdvantageLoss")
register_objective("awr", AWRConfig, "policylink.train.advantage:AWRLoss")
register_objective("prefix_conditioned", PrefixConditionedConfig, "policylink.train.prefix:PrefixConditionedLoss")

__all__ = [
    "BUILT_IN_MODULES",
    "TRAIN",
    "AWRConfig",
    "AdvantageConfig",
    "ImitationConfig",
    "ObjectiveConfig",
    "PrefixConditionedConfig",
    "available_objectives",
    "make_objective",
    "objective_class",
    "objective_config",
    "objective_loss",
    "register_objective",
    "resolve_objective",
    "unregister_objective",
]
