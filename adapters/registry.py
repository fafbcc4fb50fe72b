"""Name -> factory registries for policies and environments.

Built-in and third-party entries come from Python entry points (groups ``policylink.policies`` and
``policylink.envs``, declared in a package's ``pyproject.toml``), loaded only when a name is looked up, so
importing the registry imports no simulator or deep-learning stack. Entries can also be registered in code
with :func:`register_env` / :func:`register_policy`.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable
from importlib.metadata import entry_points
from typing import Any

ENV_GROUP = "policylink.envs"
POLICY_GROUP = "policylink.policies"

_registries: dict[str, dict[str, Callable[..., Any]]] = {ENV_GROUP: {}, POLICY_GROUP: {}}


class UnknownNameError(KeyError, ValueError):
    """A name outside its closed set: a registry name that is neither registered in code nor declared as an entry
    point, or another unknown choice. The message names the field, the choices and the closest one
    (:func:`unknown_name_message`); the CLI prints it as its one line. Also a ValueError (a bad value)."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


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
    registered or declared as ``name``. Nothing is imported, so a command checks its names before any work."""
    if name not in available_envs():
        raise UnknownNameError(unknown_name_message(field, name, available_envs()))


def check_policy_name(name: str, field: str = "policy") -> None:
    """Raise :class:`UnknownNameError` naming ``field`` when no policy is registered or declared as ``name``
    (nothing is imported)."""
    if name not in available_policies():
        raise UnknownNameError(unknown_name_message(field, name, available_policies()))


def register_env(name: str, factory: Callable[..., Any], overwrite: bool = False) -> None:
    """Register an environment factory ``(**kwargs) -> EnvAdapter`` under ``name``.

    Raises:
        ValueError: ``name`` is taken and ``overwrite`` is False.
    """
    _register(ENV_GROUP, name, factory, overwrite)


def register_policy(name: str, factory: Callable[..., Any], overwrite: bool = False) -> None:
    """Register a policy factory ``(**kwargs) -> PolicyAdapter`` under ``name``.

    Raises:
        ValueError: ``name`` is taken and ``overwrite`` is False.
    """
    _register(POLICY_GROUP, name, factory, overwrite)


def make_env(name: str, **kwargs: Any) -> Any:
    """Build the environment registered as ``name`` with ``kwargs``.

    Raises:
        UnknownNameError: no env ``name``.
        ValueError: a keyword the factory does not take (names it and the env), or the factory's own errors.
    """
    factory = _lookup(ENV_GROUP, name)
    try:
        return factory(**kwargs)
    except TypeError as e:
        if "unexpected keyword argument" not in str(e):
            raise
        raise ValueError(f"env kwargs for {name!r}: {e} (received {sorted(kwargs)})") from None


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
    """Sorted names of every registered or entry-point environment (nothing is imported)."""
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
        return reg[name]
    kind = "environment" if group == ENV_GROUP else "policy"
    close = closest_name(name, _names(group))
    hint = f"; did you mean {close!r}?" if close is not None else ""
    raise UnknownNameError(f"{kind} {name!r}: unknown; available: {_names(group)}{hint}")


def _names(group: str) -> list[str]:
    return sorted(set(_registries[group]) | set(_entry_points(group)))
