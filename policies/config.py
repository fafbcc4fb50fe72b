"""The base configuration of every registered policy: the fields shared by all of them (observation keys,
horizons, encoder, conditioning slot, EMA, normalisation), saved in every checkpoint's config file and parsed
from training YAML files with draccus; and the table of policy types (name -> config class, model class) that
the ``type`` key is looked up in, and :func:`build_model` (the model of a config's type).

A policy folder subclasses :class:`PolicyConfig` and registers it by name with
:func:`policylink.policies.registry.register_policy_type` (which records it here with :func:`add_policy_type`);
the ``type`` key of ``policy: {type: ..., ...}`` selects the subclass (draccus choice types, as LeRobot's
``PreTrainedConfig.register_subclass``). A name not yet in the table is imported through its entry point in the
``policylink.policies`` group the first time it is looked up.
"""

from __future__ import annotations

import dataclasses
import importlib
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any, ClassVar

import draccus

from policylink.adapters.capabilities import ConditioningSpec
from policylink.adapters.registry import POLICY_GROUP, UnknownNameError, unknown_name_message
from policylink.adapters.schema import FeatureSpec
from policylink.policies.common.encoder_config import EncoderConfig
from policylink.policies.temporal_config import SegaConfig

DEFAULT_POLICY_TYPE = "diffusion"
"""The type a ``policy:`` mapping without a ``type`` key gets (the type default of the original config)."""


@dataclass
class PolicyConfig(draccus.ChoiceRegistry):
    """Everything that defines a policy besides its PolicySpec and normaliser; abstract: instantiate a registered
    subclass (``make_config(name, ...)`` or the folder's dataclass).

    Attributes:
        observation_keys: observation features the policy reads (state vectors and/or camera images).
        n_obs_steps: observation horizon ``T``: the latest ``T`` observations each prediction reads, steps
            (Diffusion Policy: 2).
        chunk_size: prediction horizon ``H``: actions per predicted chunk, steps (Diffusion Policy: 16).
        n_action_steps: action horizon: actions executed from each chunk before replanning, steps, in ``[1,
            chunk_size]`` (Diffusion Policy: 8).
        encoder: observation-encoder settings.
        conditioning: the extra conditioning slot (advantage labels, language vectors) with a learned null
            token; ``ConditioningSpec()`` (no labels, no vectors, the default) adds no parameter, so checkpoints
            written before the slot existed load unchanged.
        default_label: the conditioning label every row samples with until ``set_conditioning`` changes it
            (``-1`` = the null label; advantage-conditioned checkpoints: 1, "positive").
        cfg_scale: classifier-free guidance weight ``w`` at inference, ``out = (1 - w) out_u + w out_c`` (velocity
            for flow, noise for diffusion; 0 = unconditional, 1 = conditional, plain sampling) for rows with a
            label; ``--cfg_scale`` of ``eval`` / ``run`` / ``serve`` overrides the checkpoint's (see check_cfg_scale).
        ema_max_decay: EMA decay ceiling; the decay warms up as ``1 - (1 + step) ** -ema_power``.
        ema_power: EMA warm-up exponent (Diffusion Policy: 0.75).
        state_norm_mode: normaliser mode for state vectors (``min_max`` maps to ``[-1, 1]``).
        action_norm_mode: normaliser mode for actions.
        image_norm_mode: normaliser mode for camera images (already in ``[0, 1]``; the image encoder maps them
            to ``[-1, 1]``).
        mask_padded_actions: leave the padded steps past an episode's end out of the loss (they repeat the
            last action; wrong for delta actions when episodes end at success).
        memory: long-horizon memory of the observation encoder: ``"none"`` or ``"sega"`` (SeedPolicy's gated
            latent state, :mod:`policylink.policies.temporal`).
        sega: the SEGA size and training chain (used when ``memory == "sega"``).

    Class attributes:
        legacy_fields: top-level keys a subclass ignores when reading an older checkpoint config (the original
            single config saved every head's section for every type).
    """

    legacy_fields: ClassVar[tuple[str, ...]] = ()

    observation_keys: list[str] = field(default_factory=lambda: ["observation.state"])
    n_obs_steps: int = 2
    chunk_size: int = 16
    n_action_steps: int = 8
    encoder: EncoderConfig = field(default_factory=EncoderConfig)
    conditioning: ConditioningSpec = field(default_factory=ConditioningSpec)
    default_label: int = -1
    cfg_scale: float = 1.0
    ema_max_decay: float = 0.9999
    ema_power: float = 0.75
    state_norm_mode: str = "min_max"
    action_norm_mode: str = "min_max"
    image_norm_mode: str = "identity"
    mask_padded_actions: bool = True
    memory: str = "none"
    sega: SegaConfig = field(default_factory=SegaConfig)

    def __post_init__(self) -> None:
        if type(self) is PolicyConfig:
            raise TypeError(
                "PolicyConfig: abstract; expected a registered subclass (policylink.policies.registry.make_config"
                "(name, ...) or the policy folder's config class)"
            )

    @property
    def type(self) -> str:
        """The registry name of this config's policy type (``"diffusion"``, ``"flow"``...)."""
        return PolicyConfig.get_choice_name(self.__class__)

    def validate(self) -> PolicyConfig:
        """Return self if consistent; raise ValueError naming the field, expected and received value.

        Subclasses extend this (call ``super().validate()``).
        """
        if not 1 <= self.n_action_steps <= self.chunk_size:
            raise ValueError(
                f"policy.n_action_steps: expected in [1, chunk_size={self.chunk_size}], received {self.n_action_steps}"
            )
        if self.n_obs_steps < 1:
            raise ValueError(f"policy.n_obs_steps: expected >= 1, received {self.n_obs_steps}")
        if not self.observation_keys:
            raise ValueError("policy.observation_keys: expected at least one key, received []")
        self.sega.validate(self.memory)
        c = self.conditioning
        if c.num_labels < 0 or c.token_dim < 0:
            raise ValueError(
                f"policy.conditioning: expected num_labels >= 0 and token_dim >= 0, received "
                f"num_labels={c.num_labels}, token_dim={c.token_dim}"
            )
        if not -1 <= self.default_label < max(c.num_labels, 0):
            raise ValueError(
                f"policy.default_label: expected -1 (null) or a trained label in [0, {c.num_labels}) "
                f"(policy.conditioning.num_labels={c.num_labels}), received {self.default_label}"
            )
        check_cfg_scale(self.cfg_scale, c.num_labels, "policy.cfg_scale")
        return self

    def to_dict(self) -> dict[str, Any]:
        """Plain nested dict (YAML-ready), ``type`` first."""
        return {"type": self.type, **dataclasses.asdict(self)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PolicyConfig:
        """Inverse of :meth:`to_dict`: the registered subclass named by ``d["type"]`` (default
        :data:`DEFAULT_POLICY_TYPE`); its :attr:`legacy_fields` are dropped, other unknown fields raise.

        Raises:
            ValueError: unknown ``type`` (lists the registered ones) or a bad / unknown field (named).
        """
        d = dict(d)
        name = d.pop("type", DEFAULT_POLICY_TYPE)
        sub = cls.get_choice_class(name)
        if cls is not PolicyConfig and not issubclass(sub, cls):
            raise ValueError(f"policy.type: expected a {cls.__name__}, received {name!r} ({sub.__name__})")
        for key in sub.legacy_fields:
            d.pop(key, None)
        try:
            return draccus.decode(sub, d)
        except Exception as e:  # draccus raises several types; re-raise with the config's name
            raise ValueError(f"policy config ({name}): {e}") from e

    # draccus choice-type hooks: every lookup goes through the policy-type table below, which imports a policy
    # folder (entry point group ``policylink.policies``) the first time its name is asked for.

    @classmethod
    def get_choice_class(cls, name: str) -> type[PolicyConfig]:
        """The config class registered as ``name``. Raises UnknownPolicyTypeError (a ValueError and KeyError)."""
        return policy_type(name).config_cls

    @classmethod
    def get_known_choices(cls) -> dict[str, type[PolicyConfig]]:
        """Every registered policy type's config class by name (imports each policy folder's config)."""
        return {name: t.config_cls for name, t in known_policy_types().items()}

    @classmethod
    def get_choice_name(cls, subcls: type) -> str:
        """The registry name of config class ``subcls``. Raises ValueError when it is not registered."""
        return policy_type_of(subcls).name

    @classmethod
    def default_choice_name(cls) -> str | None:
        """:data:`DEFAULT_POLICY_TYPE` for the base class (a concrete subclass decodes as itself)."""
        return DEFAULT_POLICY_TYPE if cls is PolicyConfig else None


def check_cfg_scale(w: Any, num_labels: int, name: str = "cfg_scale") -> float:
    """A classifier-free guidance weight ``w`` as a float: finite and ``>= 0`` (0 = unconditional, 1 = conditional,
    > 1 = guided toward the label; Ho & Salimans 2022), and exactly 1.0 for a policy without a label slot.

    Raises:
        ValueError: names ``name``, the expected and the received value (a non-number, NaN/inf, a negative
            weight, or ``w != 1`` with ``num_labels = 0``).
    """
    try:
        value = float(w)
    except (TypeError, ValueError):
        raise ValueError(f"{name}: expected a number >= 0, received {w!r}") from None
    if not math.isfinite(value) or value < 0:
        raise ValueError(
            f"{name}: expected a finite weight >= 0 (0 = unconditional, 1 = conditional, > 1 = guided), received {w}"
        )
    if value != 1.0 and not num_labels:
        raise ValueError(
            f"{name}: expected 1.0 for a policy without a label slot (policy.conditioning.num_labels=0: it was not "
            f"trained with advantage conditioning), received {w}"
        )
    return value


class UnknownPolicyTypeError(UnknownNameError):
    """A policy type name that is neither registered nor an importable entry point of ``policylink.policies`` (a
    ValueError and a KeyError; its message names the closest registered type, and the CLI prints it as one line)."""


@dataclass(frozen=True)
class PolicyType:
    """One registered policy type.

    Attributes:
        name: registry name (the ``type`` of ``policy: {type: ...}``).
        config_cls: its :class:`PolicyConfig` subclass.
        model: its model class (a :class:`policylink.policies.model.ChunkModel` subclass built as
            ``model(cfg, features, action_dim)``), or ``"module:Class"`` imported on first use so that parsing a
            config imports no network code.
        adapter: its PolicyAdapter class (``adapter(model, processors, spec, device=, seed=, validate=)``) or
            ``"module:Class"``; None = the generic :class:`~policylink.policies.policy.ChunkPolicy` (or
            :class:`~policylink.policies.policy.PrefixChunkPolicy` for a velocity sampler).
    """

    name: str
    config_cls: type[PolicyConfig]
    model: type | str
    adapter: type | str | None = None

    def model_cls(self) -> type:
        """The model class (imports ``"module:Class"`` on first use)."""
        return _resolve(self.model)

    def adapter_cls(self) -> type | None:
        """The PolicyAdapter class, or None for the generic one (imports ``"module:Class"`` on first use)."""
        return None if self.adapter is None else _resolve(self.adapter)


def _resolve(ref: type | str) -> type:
    if isinstance(ref, str):
        module, _, attr = ref.partition(":")
        return getattr(importlib.import_module(module), attr)
    return ref


_TYPES: dict[str, PolicyType] = {}


def add_policy_type(
    name: str,
    config_cls: type[PolicyConfig],
    model_cls: type | str,
    *,
    adapter: type | str | None = None,
    overwrite: bool = False,
) -> PolicyType:
    """Record policy type ``name`` (config dataclass, model class or ``"module:Class"``, optional PolicyAdapter
    class, see :class:`PolicyType`) in the table that config parsing looks types up in. Policy folders and plug-ins call
    :func:`policylink.policies.registry.register_policy_type`, which also registers the type's PolicyAdapter
    factory.

    Raises:
        TypeError: ``config_cls`` is not a dataclass subclass of :class:`PolicyConfig`.
        ValueError: ``name`` is empty, or taken by another config class and ``overwrite`` is False.
    """
    if not (isinstance(config_cls, type) and issubclass(config_cls, PolicyConfig) and config_cls is not PolicyConfig):
        raise TypeError(f"config_cls for {name!r}: expected a PolicyConfig subclass, received {config_cls!r}")
    if not name or not isinstance(name, str):
        raise ValueError(f"policy type name: expected a non-empty str, received {name!r}")
    old = _TYPES.get(name)
    same = old is not None and (old.config_cls, old.model, old.adapter) == (config_cls, model_cls, adapter)
    if old is not None and not overwrite and not same:
        raise ValueError(f"policy type {name!r}: already registered; pass overwrite=True to replace it")
    _TYPES[name] = PolicyType(name, config_cls, model_cls, adapter)
    return _TYPES[name]


def policy_type(name: str) -> PolicyType:
    """The :class:`PolicyType` registered as ``name``, importing its folder through its entry point if needed.

    Raises:
        UnknownPolicyTypeError: no such type (the message lists the known ones).
    """
    if name not in _TYPES:
        eps = {ep.name: ep for ep in entry_points(group=POLICY_GROUP)}
        if name in eps:
            eps[name].load()  # importing the policy folder registers its type
    if name not in _TYPES:
        raise UnknownPolicyTypeError(unknown_name_message("policy.type", name, sorted(known_policy_types())))
    return _TYPES[name]


def policy_type_of(config_cls: type) -> PolicyType:
    """The registered type whose config class is exactly ``config_cls``. Raises ValueError when none is."""
    for t in _TYPES.values():
        if t.config_cls is config_cls:
            return t
    raise ValueError(f"{getattr(config_cls, '__name__', config_cls)}: not a registered policy config class")


def known_policy_types() -> dict[str, PolicyType]:
    """Every registered type, after importing every entry point of ``policylink.policies`` (entry points that
    register no type, e.g. plain PolicyAdapter factories, are skipped)."""
    for ep in entry_points(group=POLICY_GROUP):
        if ep.name not in _TYPES:
            try:
                ep.load()
            except ImportError:  # an optional plug-in whose dependencies are not installed
                continue
    return dict(_TYPES)


def build_model(cfg: PolicyConfig, features: Mapping[str, FeatureSpec], action_dim: int) -> Any:
    """The model of ``cfg``'s registered type, freshly initialised: ``model_cls(cfg, features, action_dim)`` (a
    :class:`~policylink.policies.model.ChunkModel`; its module, and torch, are imported on first use).

    Raises:
        ValueError: the config is inconsistent, or an observation key is not in ``features``.
        UnknownPolicyTypeError: ``cfg``'s type is not registered.
    """
    cfg.validate()
    return policy_type(cfg.type).model_cls()(cfg, features, action_dim)


__all__ = [
    "DEFAULT_POLICY_TYPE",
    "PolicyConfig",
    "PolicyType",
    "UnknownPolicyTypeError",
    "add_policy_type",
    "build_model",
    "check_cfg_scale",
    "known_policy_types",
    "policy_type",
    "policy_type_of",
]
