"""An environment's keyword arguments as a config dataclass: what an env factory takes, declared once, so a mapping
of kwargs (``--env_kwargs`` from YAML/JSON, ``--gap``, ``--perturbation``) is checked by name and type before the
env is built (:func:`policylink.adapters.registry.make_env`), and listed by ``policylink envs kwargs NAME``.

A config is a plain ``@dataclass``: one field per keyword, annotated with the types the factory takes and holding
its default. A field annotated with a dataclass (``perturbation: PerturbationConfig | None``) takes an instance or a
mapping of its fields (checked in turn); a field whose annotation also names ``Mapping`` (``gap: RealityGap |
Mapping[str, Any] | str | None``) takes any mapping (the env checks it). Numbers follow :mod:`numbers` (an int is a
valid ``float``, a bool is no ``int``; numpy scalars count), a list is a valid ``tuple`` (YAML has no tuples).
Imports nothing of ours.
"""

from __future__ import annotations

import dataclasses
import functools
import numbers
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import numpy as np

F = TypeVar("F", bound=Callable[..., Any])

ENV_CONFIG_ATTRIBUTE = "env_config"
"""The attribute of a factory (or env family) that holds its config dataclass (set by :func:`with_env_config`)."""


def with_env_config(config: type) -> Callable[[F], F]:
    """Decorator declaring ``config`` (a dataclass type) as the kwargs of an env factory or env family, for
    factories loaded from entry points: ``@with_env_config(MujocoTaskConfig) def make_reach_env(**kwargs)``.
    Returns the factory itself, with the attribute :data:`ENV_CONFIG_ATTRIBUTE` set.

    Raises:
        TypeError: ``config`` is not a dataclass type.
    """
    check_config_class(config)

    def mark(factory: F) -> F:
        setattr(factory, ENV_CONFIG_ATTRIBUTE, config)
        return factory

    return mark


def check_config_class(config: Any) -> None:
    """Raise TypeError unless ``config`` is a dataclass type (an env's kwargs config)."""
    if not (isinstance(config, type) and dataclasses.is_dataclass(config)):
        raise TypeError(f"env config: expected a dataclass type, received {config!r}")


@functools.cache
def field_types(config: type) -> dict[str, tuple[Any, str]]:
    """``{field: (resolved annotation, annotation as written)}`` of dataclass ``config``, in field order (the
    written form, e.g. ``"int | tuple[int, int]"``, is what an error message shows as expected)."""
    hints = typing.get_type_hints(config)
    return {f.name: (hints[f.name], _written(f.type)) for f in dataclasses.fields(config)}


def matches(value: Any, hint: Any) -> bool:
    """Whether ``value`` is of the type ``hint`` (a resolved annotation) as env kwargs are given: see the module
    docstring (a mapping matches a dataclass type here; :func:`nested_config` says which, for its keys)."""
    if hint is Any or hint is typing.Any:
        return True
    if hint is None or hint is type(None):
        return value is None
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Union or origin is types.UnionType:
        return any(matches(value, arm) for arm in args)
    if origin is typing.Literal:
        return value in args
    if origin is tuple:
        if not isinstance(value, (tuple, list)):
            return False
        if len(args) == 2 and args[1] is Ellipsis:
            return all(matches(v, args[0]) for v in value)
        return len(value) == len(args) and all(matches(v, a) for v, a in zip(value, args))
    if origin in (list, Sequence):
        return isinstance(value, (tuple, list)) and (not args or all(matches(v, args[0]) for v in value))
    if origin in (dict, Mapping):
        return isinstance(value, Mapping)
    if hint is bool:
        return isinstance(value, (bool, np.bool_))
    if hint is int:
        return isinstance(value, numbers.Integral) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, numbers.Real) and not isinstance(value, bool)
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return isinstance(value, hint) or isinstance(value, Mapping)
    return isinstance(hint, type) and isinstance(value, hint)


def nested_config(value: Any, hint: Any) -> type | None:
    """The dataclass whose fields a mapping ``value`` stands for under annotation ``hint``
    (``PerturbationConfig`` for ``{displacement: 0.03}`` under ``PerturbationConfig | None``), or None: ``value``
    is no mapping, or ``hint`` takes plain mappings too (``Mapping[str, Any]`` among its arms)."""
    if not isinstance(value, Mapping):
        return None
    arms = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    if any(typing.get_origin(a) in (dict, Mapping) or a in (dict, Mapping) for a in arms):
        return None
    found = [a for a in arms if isinstance(a, type) and dataclasses.is_dataclass(a)]
    return found[0] if found else None


def describe_config(config: type) -> list[str]:
    """One line per field of ``config``: ``name: annotation = default``, plus the accepted keys of a field that
    takes a dataclass's fields as a mapping (what ``policylink envs kwargs NAME`` prints)."""
    lines = []
    for f in dataclasses.fields(config):
        hint, written = field_types(config)[f.name]
        if f.default is not dataclasses.MISSING:
            default = f" = {f.default!r}"
        elif f.default_factory is not dataclasses.MISSING:
            default = f" = {f.default_factory()!r}"
        else:
            default = " (required)"
        lines.append(f"{f.name}: {written}{default}")
        nested = nested_config({}, hint)
        if nested is not None:
            lines.append(f"    (or a mapping of {nested.__name__} keys: {', '.join(field_types(nested))})")
    return lines


def _written(annotation: Any) -> str:
    if isinstance(annotation, str):
        return annotation
    return getattr(annotation, "__name__", None) or str(annotation).replace("typing.", "")


__all__ = [
    "ENV_CONFIG_ATTRIBUTE",
    "check_config_class",
    "describe_config",
    "field_types",
    "matches",
    "nested_config",
    "with_env_config",
]
