"""The policy-type registry: name -> (config dataclass, model class). Config parsing, model building,
checkpoint loading and training dispatch through it, never through an if-else over type names.

A policy folder registers itself when imported (``register_policy_type("flow", FlowPolicyConfig,
"policylink.policies.flow.model:FlowModel")`` in its ``__init__.py``); the folder is imported the first time
its name is looked up, through its entry point in the ``policylink.policies`` group (one line in
``pyproject.toml``). A plug-in or a test can also call :func:`register_policy_type` directly.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from policylink.adapters.registry import POLICY_GROUP, available_policies, register_policy
from policylink.adapters.schema import FeatureSpec, PolicySpec
from policylink.policies.config import DEFAULT_POLICY_TYPE, PolicyConfig


class UnknownPolicyTypeError(ValueError, KeyError):
    """A policy type name that is neither registered nor an importable entry point of ``policylink.policies``."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


@dataclass(frozen=True)
class PolicyType:
    """One registered policy type.

    Attributes:
        name: registry name (the ``type`` of ``policy: {type: ...}``).
        config_cls: its :class:`PolicyConfig` subclass.
        model: its model class (a :class:`policylink.policies.model.ChunkModel` subclass built as
            ``model(cfg, features, action_dim)``), or ``"module:Class"`` imported on first use so that parsing a
            config imports no network code.
    """

    name: str
    config_cls: type[PolicyConfig]
    model: type | str

    def model_cls(self) -> type:
        """The model class (imports ``"module:Class"`` on first use)."""
        if isinstance(self.model, str):
            module, _, attr = self.model.partition(":")
            return getattr(importlib.import_module(module), attr)
        return self.model


_TYPES: dict[str, PolicyType] = {}


def register_policy_type(
    name: str, config_cls: type[PolicyConfig], model_cls: type | str, *, overwrite: bool = False
) -> PolicyType:
    """Register policy type ``name``: its config dataclass and its model class (or ``"module:Class"``).

    Also registers ``name`` as a PolicyAdapter factory (:func:`make_policy` bound to ``name``) in
    :mod:`policylink.adapters.registry` when no entry point already provides one.

    Raises:
        TypeError: ``config_cls`` is not a dataclass subclass of :class:`PolicyConfig`.
        ValueError: ``name`` is empty, or taken by another config class and ``overwrite`` is False.
    """
    if not (isinstance(config_cls, type) and issubclass(config_cls, PolicyConfig) and config_cls is not PolicyConfig):
        raise TypeError(f"config_cls for {name!r}: expected a PolicyConfig subclass, received {config_cls!r}")
    if not name or not isinstance(name, str):
        raise ValueError(f"policy type name: expected a non-empty str, received {name!r}")
    old = _TYPES.get(name)
    if old is not None and not overwrite and (old.config_cls, old.model) != (config_cls, model_cls):
        raise ValueError(f"policy type {name!r}: already registered; pass overwrite=True to replace it")
    _TYPES[name] = PolicyType(name, config_cls, model_cls)
    if name not in available_policies():
        register_policy(name, lambda checkpoint=None, **kw: make_policy(name, checkpoint, **kw), overwrite=True)
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
        raise UnknownPolicyTypeError(f"policy.type: expected one of {sorted(known_policy_types())}, received {name!r}")
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


def make_config(name: str, **fields: Any) -> PolicyConfig:
    """A config of type ``name`` with ``fields`` (nested parts as dataclasses or dicts).

    Raises:
        UnknownPolicyTypeError: unknown ``name``. ValueError: an unknown or bad field (named).
    """
    config_cls = policy_type(name).config_cls
    if all(not isinstance(v, Mapping) for v in fields.values()):
        try:
            return config_cls(**fields)
        except TypeError as e:
            raise ValueError(f"policy config ({name}): {e}") from None
    return PolicyConfig.from_dict({"type": name, **fields})


def default_config() -> PolicyConfig:
    """The default config of :data:`~policylink.policies.config.DEFAULT_POLICY_TYPE` (a dataclass default factory
    for fields typed :class:`PolicyConfig`)."""
    return make_config(DEFAULT_POLICY_TYPE)


def build_model(cfg: PolicyConfig, features: Mapping[str, FeatureSpec], action_dim: int):
    """The model of ``cfg``'s type, freshly initialised: ``model_cls(cfg, features, action_dim)``.

    Raises:
        ValueError: the config is inconsistent, or an observation key is not in ``features``.
    """
    cfg.validate()
    return policy_type(cfg.type).model_cls()(cfg, features, action_dim)


def make_policy(
    kind: str,
    checkpoint: str | Path | None = None,
    *,
    spec: PolicySpec | None = None,
    normalizer: Any = None,
    config: PolicyConfig | Mapping[str, Any] | None = None,
    device: str = "auto",
    seed: int = 0,
):
    """A ready PolicyAdapter of type ``kind``: loaded from ``checkpoint``, or untrained from ``spec``,
    ``normalizer`` and ``config`` (default: the type's default config).

    Args:
        kind: a registered type name.
        checkpoint: a checkpoint folder; when given, ``spec``, ``normalizer`` and ``config`` must be None.
        spec, normalizer: required without a checkpoint (the spec's horizons must match the config).
        config: a config of type ``kind``, or a dict of its fields.
        device: ``"auto"``, ``"cpu"``, ``"cuda[:N]"``. seed: the sampler's noise seed.

    Raises:
        ValueError: a checkpoint or config of another type, or missing ``spec``/``normalizer``.
    """
    from policylink.policies.checkpoint import load_components, resolve_device
    from policylink.policies.policy import policy_for_model

    if checkpoint is not None:
        cfg, ckpt_spec, model, norm = load_components(checkpoint)
        if cfg.type != kind:
            raise ValueError(f"checkpoint {str(checkpoint)!r}: expected policy type {kind!r}, received {cfg.type!r}")
        return policy_for_model(model, norm, ckpt_spec, device=resolve_device(device), seed=seed)
    if spec is None or normalizer is None:
        raise ValueError(
            f"{kind} policy: expected a checkpoint, or both spec and normalizer; received "
            f"spec={type(spec).__name__}, normalizer={type(normalizer).__name__}"
        )
    if config is None:
        cfg = make_config(kind)
    elif isinstance(config, PolicyConfig):
        cfg = config
    else:
        cfg = PolicyConfig.from_dict({**dict(config), "type": kind})
    if cfg.type != kind:
        raise ValueError(f"config.type: expected {kind!r}, received {cfg.type!r}")
    model = build_model(cfg, spec.observation_features, spec.action.dim)
    return policy_for_model(model, normalizer, spec, device=resolve_device(device), seed=seed)


__all__ = [
    "PolicyType",
    "UnknownPolicyTypeError",
    "build_model",
    "default_config",
    "known_policy_types",
    "make_config",
    "make_policy",
    "policy_type",
    "policy_type_of",
    "register_policy_type",
]
