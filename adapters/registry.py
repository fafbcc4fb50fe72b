"""Name -> factory registries for policies and environments.

Built-in and third-party entries come from Python entry points (groups ``policylink.policies`` and
``policylink.envs``, declared in a package's ``pyproject.toml``), loaded only when a name is looked up, so
importing the registry imports no simulator or deep-learning stack. Entries can also be registered in code
with :func:`register_env` / :func:`register_policy`.

An *env family* (entry-point group ``policylink.env_families``, or :func:`register_env_family`) names many envs at
once: ``<family>/<task>`` (``metaworld/push``) resolves to ``family(task, **kwargs)`` for each ``task`` in the
family's ``tasks``. Benchmarks that run in an isolated virtual environment behind the env transport
(:mod:`policylink.sim.isolated`) are families; looking one up imports only its light host-side module.

An env may declare its keyword arguments as a config dataclass (:mod:`policylink.adapters.env_config`:
``register_env(name, factory, config=Cls)``, ``@with_env_config(Cls)`` on an entry-point factory, or an
``env_config`` attribute of an env family); :func:`make_env` then checks a kwargs mapping against it before building
the env (:func:`check_env_kwargs`). An env without one takes its kwargs unchecked, as before.
"""

from __future__ import annotations

import difflib
import functools
from collections.abc import Callable, Iterable, Mapping
from importlib.metadata import entry_points
from typing import Any

from policylink.adapters.env_config import (
    ENV_CONFIG_ATTRIBUTE,
    check_config_class,
    field_types,
    matches,
    nested_config,
)

ENV_GROUP = "policylink.envs"
POLICY_GROUP = "policylink.policies"
FAMILY_GROUP = "policylink.env_families"
FAMILY_SEPARATOR = "/"

_registries: dict[str, dict[str, Callable[..., Any]]] = {ENV_GROUP: {}, POLICY_GROUP: {}, FAMILY_GROUP: {}}
_env_configs: dict[str, type | None] = {}  # env name -> its kwargs config (None: unchecked kwargs)


class UnknownNameError(KeyError, ValueError):
    """A name outside its closed set: a registry name that is neither registered in code nor declared as an entry
    point, or another unknown choice. The message names the field, the choices and the closest one
    (:func:`unknown_name_message`); the CLI prints it as its one line. Also a ValueError (a bad value)."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


class EnvKwargsError(ValueError):
    """A bad value among an environment's keyword arguments (``--env_kwargs``, ``--gap``, ``--perturbation``): the
    message is one line naming the env, the field, the expected and the received value (``'push' env kwarg
    perturbation.force: expected float, received 'strong' (str)``); the CLI prints it as its one line."""


def closest_name(name: str, choices: Iterable[str]) -> str | None:
    """The choice closest to ``name`` when one is close enough to be a typo of it (``difflib`` ratio >= 0.6:
    ``pushh`` -> ``push``, ``diffuson`` -> ``diffusion``), else None."""
    close = difflib.get_close_matches(str(name), [str(c) for c in choices], n=1, cutoff=0.6)
    return close[0] if close else None


def unknown_name_message(field: str, value: Any, choices: Iterable[str], other: str = "") -> str:
    """The one message for a value outside a closed set of names: ``"<field>: expected one of [...], received
    'x'"``, plus ``"; did you mean 'y'?"`` when a choice is close (:func:`closest_name`). ``other`` names what else
    the field accepts (``"a checkpoint folder"``: ``expected a checkpoint folder or one of [...]``)."""
    choices = list(choices)
    close = closest_name(value, choices) if isinstance(value, str) else None
    hint = f"; did you mean {close!r}?" if close is not None else ""
    expected = f"{other} or one of" if other else "one of"
    return f"{field}: expected {expected} {choices}, received {value!r}{hint}"


def check_env_name(name: str, field: str = "env") -> None:
    """Raise :class:`UnknownNameError` (:func:`unknown_name_message`, naming ``field``) when no environment is
    registered or declared as ``name`` (``<family>/<task>`` for an env family's task). Nothing but the env families'
    light host-side modules is imported, so a command checks its names before any work."""
    if name not in available_envs():
        raise UnknownNameError(unknown_name_message(field, name, available_envs()))


def check_policy_name(name: str, field: str = "policy") -> None:
    """Raise :class:`UnknownNameError` naming ``field`` when no policy is registered or declared as ``name``
    (nothing is imported)."""
    if name not in available_policies():
        raise UnknownNameError(unknown_name_message(field, name, available_policies()))


def register_env(name: str, factory: Callable[..., Any], overwrite: bool = False, config: type | None = None) -> None:
    """Register an environment factory ``(**kwargs) -> EnvAdapter`` under ``name``.

    Args:
        config: the dataclass of the factory's keyword arguments (:mod:`policylink.adapters.env_config`);
            :func:`make_env` checks kwargs against it. None: the factory's own ``env_config`` attribute
            (:func:`~policylink.adapters.env_config.with_env_config`) if it has one, else kwargs go unchecked.

    Raises:
        ValueError: ``name`` is taken and ``overwrite`` is False.
        TypeError: ``factory`` is not callable, or ``config`` is not a dataclass type.
    """
    if config is not None:
        check_config_class(config)
    _register(ENV_GROUP, name, factory, overwrite)
    _env_configs[name] = config if config is not None else getattr(factory, ENV_CONFIG_ATTRIBUTE, None)


def register_policy(name: str, factory: Callable[..., Any], overwrite: bool = False) -> None:
    """Register a policy factory ``(**kwargs) -> PolicyAdapter`` under ``name``.

    Raises:
        ValueError: ``name`` is taken and ``overwrite`` is False.
    """
    _register(POLICY_GROUP, name, factory, overwrite)


def register_env_family(name: str, family: Callable[..., Any], overwrite: bool = False) -> None:
    """Register an env family: ``family(task, **kwargs) -> EnvAdapter`` with a ``tasks`` attribute (a sequence of
    task names); each ``<name>/<task>`` is then an environment name.

    Raises:
        TypeError: ``family`` is not callable or has no ``tasks``.
        ValueError: ``name`` is taken (and not ``overwrite``) or holds ``/``.
    """
    if FAMILY_SEPARATOR in name:
        raise ValueError(f"family name: expected no {FAMILY_SEPARATOR!r}, received {name!r}")
    if not isinstance(getattr(family, "tasks", None), (list, tuple)):
        raise TypeError(f"family {name!r}: expected a `tasks` list or tuple of task names")
    _register(FAMILY_GROUP, name, family, overwrite)


def env_family(name: str) -> Any:
    """The env family registered (or declared as an entry point) as ``name``. Raises :class:`UnknownNameError`."""
    return _lookup(FAMILY_GROUP, name)


def available_env_families() -> list[str]:
    """Sorted names of every registered or entry-point env family (nothing is imported)."""
    return _names(FAMILY_GROUP)


def make_env(name: str, **kwargs: Any) -> Any:
    """Build the environment registered as ``name`` with ``kwargs``, checked first against the env's config
    (:func:`check_env_kwargs`) when it has one; the kwargs reach the factory unchanged.

    Raises:
        UnknownNameError: no env ``name``, or a keyword the env's config does not name (with the accepted ones and
            the closest: ``did you mean 'gap'?``).
        EnvKwargsError: a keyword of the wrong type or a value its config refuses (names the env, the field,
            expected and received), or a value error of the factory whose message starts with the keyword's name
            (``obs_mode: expected one of ...`` becomes ``'push' env kwarg obs_mode: expected one of ...``).
        ValueError: a keyword the factory does not take (names it and the env), or the factory's other errors.
    """
    factory = _lookup(ENV_GROUP, name)
    check_env_kwargs(name, kwargs)
    try:
        return factory(**kwargs)
    except TypeError as e:
        if "unexpected keyword argument" not in str(e):
            raise
        raise ValueError(f"env kwargs for {name!r}: {e} (received {sorted(kwargs)})") from None
    except (ValueError, KeyError) as e:
        if isinstance(e, EnvKwargsError) or _kwarg_named(e, kwargs) is None:
            raise
        kind = UnknownNameError if isinstance(e, KeyError) else EnvKwargsError  # an unknown name stays a KeyError
        raise kind(f"{name!r} env kwarg {e.args[0]}") from e


def _kwarg_named(error: BaseException, kwargs: Mapping[str, Any]) -> str | None:
    """The keyword of ``kwargs`` that the factory's ``error`` is about: its message starts with the keyword's name
    (``obs_mode: expected ...``, ``gap.dynamics.mass_scale: ...``, an env's own value checks); else None."""
    message = error.args[0] if len(error.args) == 1 and isinstance(error.args[0], str) else ""
    head = message.split(":", 1)[0].split(".", 1)[0].split(" ", 1)[0]
    return head if head in kwargs and ":" in message else None


def env_config(name: str) -> type | None:
    """The kwargs config dataclass of environment ``name`` (see :func:`register_env`), or None when it declares
    none. Loads the env's factory (an entry point's module, a family's host-side module).

    Raises:
        UnknownNameError: no env ``name``.
    """
    _lookup(ENV_GROUP, name)
    return _env_configs.get(name)


def check_env_kwargs(name: str, kwargs: Mapping[str, Any]) -> None:
    """Check the keyword arguments ``kwargs`` of environment ``name`` against its config (:func:`env_config`):
    every key a field, every value of the field's type; a mapping given for a config-typed field
    (``perturbation: {displacement: 0.03}``) is checked the same way, its fields named ``perturbation.<key>``.
    Nothing is checked for an env without a config. Builds nothing.

    Raises:
        UnknownNameError: no env ``name``, or a key that is no field (message: ``'<name>' env kwarg: expected
            one of [<fields>], received '<key>'; did you mean '<field>'?``).
        EnvKwargsError: a value of the wrong type (``'<name>' env kwarg <field>: expected <annotation>, received
            <value> (<type>)``), or a mapping for a config-typed field that its dataclass refuses when built from
            it (``'<name>' env kwarg randomization.color: expected a value in [0, 1], received 7``).
    """
    config = env_config(name)
    if config is not None:
        _check_fields(config, kwargs, f"{name!r} env kwarg")


def _check_fields(config: type, kwargs: Mapping[str, Any], where: str, prefix: str = "") -> None:
    types_ = field_types(config)
    for key, value in kwargs.items():
        if key not in types_:
            field = f"{where} {prefix.rstrip('.')}" if prefix else where
            raise UnknownNameError(unknown_name_message(field, key, types_))
        hint, written = types_[key]
        if not matches(value, hint):
            received = f"{value!r} ({type(value).__name__})"
            raise EnvKwargsError(f"{where} {prefix}{key}: expected {written}, received {received}")
        nested = nested_config(value, hint)
        if nested is not None:
            _check_fields(nested, value, where, f"{prefix}{key}.")
            _check_values(nested, value, f"{where} {prefix}{key}")


def _check_values(config: type, value: Mapping[str, Any], field: str) -> None:
    """Build ``config`` from the mapping ``value`` (keys and types already checked) so its own value checks run
    (ranges: ``RandomizationConfig.color`` in [0, 1]); a refusal is re-raised naming ``field`` (``'push' env kwarg
    randomization``) in place of the class (``RandomizationConfig.color: ...`` -> ``... randomization.color: ...``).

    Raises:
        EnvKwargsError: the dataclass refused a value.
    """
    try:
        config(**value)
    except ValueError as e:
        message = str(e)
        for head in (config.__name__, field.rsplit(" ", 1)[-1]):
            if message.startswith(f"{head}.") or message.startswith(f"{head}:"):
                raise EnvKwargsError(f"{field}{message[len(head) :]}") from e
        raise EnvKwargsError(f"{field}: {message}") from e


def make_policy(name: str, **kwargs: Any) -> Any:
    """Build the policy registered as ``name`` with ``kwargs``. Raises :class:`UnknownNameError`."""
    return _lookup(POLICY_GROUP, name)(**kwargs)


def env_factory(name: str) -> Callable[..., Any]:
    """The factory registered as environment ``name`` (for vector envs). Raises :class:`UnknownNameError`."""
    return _lookup(ENV_GROUP, name)


def policy_factory(name: str) -> Callable[..., Any]:
    """The factory registered as policy ``name``. Raises :class:`UnknownNameError`."""
    return _lookup(POLICY_GROUP, name)


def available_envs() -> list[str]:
    """Sorted names of every registered or entry-point environment, and ``<family>/<task>`` for each env family's
    tasks (only the families' light host-side modules are imported)."""
    return _names(ENV_GROUP)


def available_policies() -> list[str]:
    """Sorted names of every registered or entry-point policy (nothing is imported)."""
    return _names(POLICY_GROUP)


def _register(group: str, name: str, factory: Callable[..., Any], overwrite: bool) -> None:
    if not callable(factory):
        raise TypeError(f"factory for {name!r}: expected a callable, received {type(factory).__name__}")
    reg = _registries[group]
    if name in reg and not overwrite:
        raise ValueError(f"{group} name {name!r}: already registered; pass overwrite=True to replace it")
    reg[name] = factory


def _entry_points(group: str) -> dict[str, Any]:
    return {ep.name: ep for ep in entry_points(group=group)}


def _lookup(group: str, name: str) -> Callable[..., Any]:
    reg = _registries[group]
    if name in reg:
        return reg[name]
    eps = _entry_points(group)
    if name in eps:
        reg[name] = eps[name].load()
        if group == ENV_GROUP:
            _env_configs[name] = getattr(reg[name], ENV_CONFIG_ATTRIBUTE, None)
        return reg[name]
    if group == ENV_GROUP and FAMILY_SEPARATOR in name:
        prefix, task = name.split(FAMILY_SEPARATOR, 1)
        if prefix in _names(FAMILY_GROUP):
            family = _lookup(FAMILY_GROUP, prefix)
            if task not in family.tasks:
                raise UnknownNameError(unknown_name_message(f"{prefix} task", task, family.tasks))
            reg[name] = functools.partial(family, task)
            _env_configs[name] = getattr(family, ENV_CONFIG_ATTRIBUTE, None)
            return reg[name]
    kind = {ENV_GROUP: "environment", POLICY_GROUP: "policy", FAMILY_GROUP: "env family"}[group]
    close = closest_name(name, _names(group))
    hint = f"; did you mean {close!r}?" if close is not None else ""
    raise UnknownNameError(f"{kind} {name!r}: unknown; available: {_names(group)}{hint}")


def _names(group: str) -> list[str]:
    names = set(_registries[group]) | set(_entry_points(group))
    if group == ENV_GROUP:  # each family's tasks (loads the families' light host-side modules)
        for prefix in _names(FAMILY_GROUP):
            names |= {f"{prefix}{FAMILY_SEPARATOR}{t}" for t in _lookup(FAMILY_GROUP, prefix).tasks}
    return sorted(names)
