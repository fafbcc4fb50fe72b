"""Policies by name: registering a policy type, and building a ready PolicyAdapter of a registered type from a
checkpoint folder or from a config. Config parsing, checkpoint loading and training dispatch through the type
table (:mod:`policylink.policies.config`), never through an if-else over type names.

A policy folder registers itself when imported (``register_policy_type("flow", FlowPolicyConfig,
"policylink.policies.flow.model:FlowModel")`` in its ``__init__.py``); the folder is imported the first time
its name is looked up, through its entry point in the ``policylink.policies`` group (one line in
``pyproject.toml``). A plug-in or a test can also call :func:`register_policy_type` directly.

Module layering (each imports only those before it): ``config`` (the type table, ``build_model``) -> ``model``
-> ``checkpoint`` (the folder format) -> ``policy`` (the PolicyAdapters) -> ``registry`` (this module). Importing
this module imports no torch (a policy folder registers itself while a config is parsed, e.g. for ``--help``);
:func:`make_policy` and :func:`load_policy` import the checkpoint and adapter modules when called.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from policylink.adapters.registry import available_policies, register_policy
from policylink.adapters.schema import PolicySpec
from policylink.policies.config import (
    _TYPES,  # noqa: F401  (the table itself: tests unregister what they register)
    DEFAULT_POLICY_TYPE,
    PolicyConfig,
    PolicyType,
    UnknownPolicyTypeError,
    add_policy_type,
    build_model,
    check_cfg_scale,
    known_policy_types,
    policy_type,
    policy_type_of,
)

if TYPE_CHECKING:
    import torch

    from policylink.policies.policy import ModelPolicy


def register_policy_type(
    name: str,
    config_cls: type[PolicyConfig],
    model_cls: type | str,
    *,
    adapter: type | str | None = None,
    overwrite: bool = False,
) -> PolicyType:
    """Register policy type ``name``: its config dataclass, its model class (or ``"module:Class"``) and, when it
    needs its own, its PolicyAdapter class (``adapter``, or ``"module:Class"``; None = the generic chunk policy).

    Records the type in the config's type table (:func:`~policylink.policies.config.add_policy_type`) and
    registers ``name`` as a PolicyAdapter factory (:func:`make_policy` bound to ``name``) in
    :mod:`policylink.adapters.registry` when no entry point already provides one.

    Raises:
        TypeError: ``config_cls`` is not a dataclass subclass of :class:`PolicyConfig`.
        ValueError: ``name`` is empty, or taken by another config class and ``overwrite`` is False.
    """
    entry = add_policy_type(name, config_cls, model_cls, adapter=adapter, overwrite=overwrite)
    if name not in available_policies():
        register_policy(name, lambda checkpoint=None, **kw: make_policy(name, checkpoint, **kw), overwrite=True)
    return entry


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


def make_policy(
    kind: str,
    checkpoint: str | Path | None = None,
    *,
    spec: PolicySpec | None = None,
    processors: Any = None,
    config: PolicyConfig | Mapping[str, Any] | None = None,
    device: str = "auto",
    seed: int = 0,
    normalizer: Any = None,
):
    """A ready PolicyAdapter of type ``kind``: loaded from ``checkpoint``, or untrained from ``spec``,
    ``processors`` and ``config`` (default: the type's default config).

    Args:
        kind: a registered type name.
        checkpoint: a checkpoint folder; when given, ``spec``, ``processors`` and ``config`` must be None.
        spec, processors: required without a checkpoint (the spec's horizons must match the config; the chain:
            :func:`~policylink.policies.processing.processors_for` of the config, the spec's observation features
            and the normaliser).
        config: a config of type ``kind``, or a dict of its fields.
        device: ``"auto"``, ``"cpu"``, ``"cuda[:N]"``. seed: the sampler's noise seed.
        normalizer: deprecated alias of ``processors`` for one release (the chain of the config with it; warns).

    Raises:
        ValueError: a checkpoint or config of another type, missing ``spec``/``processors``, or both
            ``processors`` and ``normalizer``.
        CheckpointError: a missing or inconsistent checkpoint file, or an old (pickle) layout.
    """
    from policylink.policies.checkpoint import resolve_device  # torch: only when called
    from policylink.policies.policy import policy_for_model
    from policylink.policies.processing import chain_of

    if checkpoint is not None:
        policy = load_checkpoint(checkpoint, device=device, seed=seed)
        if policy.config.type != kind:
            raise ValueError(
                f"checkpoint {str(checkpoint)!r}: expected policy type {kind!r}, received {policy.config.type!r}"
            )
        return policy
    if spec is None or processors is None and normalizer is None:
        raise ValueError(
            f"{kind} policy: expected a checkpoint, or both spec and processors; received "
            f"spec={type(spec).__name__}, processors={type(processors).__name__}"
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
    processors = chain_of(processors, normalizer, cfg, model.features, "make_policy")
    return policy_for_model(model, processors, spec, device=resolve_device(device), seed=seed)


def load_checkpoint(
    path: str | Path, device: str | torch.device = "auto", seed: int = 0, cfg_scale: float | None = None
) -> ModelPolicy:
    """Load a checkpoint folder as a ready PolicyAdapter (:func:`~policylink.policies.policy.policy_for_model`:
    the adapter of its type, with the capabilities its model supports). Use :func:`policylink.policies.load_policy`,
    which takes any policy reference; this is its checkpoint-folder case.

    Args:
        path: the checkpoint folder (needs nothing else: config, weights, normaliser and spec are inside).
        device: ``"auto"`` (CUDA when present), ``"cpu"``, ``"cuda:0"``...
        seed: seed of the sampler's noise.
        cfg_scale: classifier-free guidance weight replacing the checkpoint's ``policy.cfg_scale`` (None = keep it).

    Raises:
        CheckpointError: missing or inconsistent files, or an old (pickle) layout.
        ValueError: a bad ``cfg_scale`` (see :meth:`~policylink.policies.policy.ChunkPolicy.set_cfg_scale`).
    """
    from policylink.policies.checkpoint import load_components, resolve_device  # torch: now
    from policylink.policies.policy import ChunkPolicy, policy_for_model

    cfg, spec, model, processors = load_components(path)
    policy = policy_for_model(model, processors, spec, device=resolve_device(device), seed=seed)
    if cfg_scale is not None and isinstance(policy, ChunkPolicy):
        policy.set_cfg_scale(cfg_scale)
    elif cfg_scale is not None:  # a model with its own adapter (ACT) has no label slot: only w = 1 is valid
        check_cfg_scale(cfg_scale, 0)
    return policy


__all__ = [
    "PolicyType",
    "UnknownPolicyTypeError",
    "build_model",
    "default_config",
    "known_policy_types",
    "load_checkpoint",
    "make_config",
    "make_policy",
    "policy_type",
    "policy_type_of",
    "register_policy_type",
]
