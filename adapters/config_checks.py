"""The field checks every config shares (policies, objectives, envs, jobs): integer counts, positive and non-negative
numbers, values inside an interval, one of a set of names. Each raises one ValueError naming the field (with its
section, e.g. ``critic.expectile``), the expectation and the received value, so every config reports a bad field
the same way. Imports nothing of ours and no torch (a ``--help`` or a config parse checks fields without it)."""

from __future__ import annotations

from collections.abc import Iterable
from numbers import Integral, Real
from typing import Any


def require_counts(config: Any, prefix: str = "", **minimums: int) -> None:
    """Check integer fields: ``require_counts(cfg, episodes=1)`` requires ``cfg.episodes`` to be an int ``>= 1``;
    ``prefix`` (``"critic."``) is put before the field's name in the message.

    Raises:
        ValueError: the first field that is not an int (bools refused) at or above its minimum.
    """
    for name, low in minimums.items():
        value = getattr(config, name)
        if isinstance(value, bool) or not isinstance(value, Integral) or value < low:
            raise ValueError(f"{prefix}{name}: expected an integer >= {low}, received {value!r}")


def require_positive(config: Any, *names: str, prefix: str = "") -> None:
    """Check number fields: ``require_positive(cfg, "lr")`` requires ``cfg.lr > 0``.

    Raises:
        ValueError: the first field not above 0 (``prefix`` + its name, the expectation and the value).
    """
    for name in names:
        if not getattr(config, name) > 0:
            raise ValueError(f"{prefix}{name}: expected > 0, received {getattr(config, name)}")


def require_non_negative(config: Any, *names: str, prefix: str = "") -> None:
    """Check number fields: ``require_non_negative(cfg, "grad_clip")`` requires ``cfg.grad_clip >= 0``.

    Raises:
        ValueError: the first field below 0 (or NaN), named with ``prefix``.
    """
    for name in names:
        if not getattr(config, name) >= 0:
            raise ValueError(f"{prefix}{name}: expected >= 0, received {getattr(config, name)}")


def require_within(config: Any, prefix: str = "", **intervals: str) -> None:
    """Check number fields against intervals written as in mathematics: ``require_within(cfg, gamma="(0, 1]",
    expectile="(0, 1)")`` requires ``0 < cfg.gamma <= 1`` and ``0 < cfg.expectile < 1``; ``inf`` is allowed as an
    open bound (``"(0, inf)"``).

    Raises:
        ValueError: the first field outside its interval (or NaN), named with ``prefix``; a malformed interval.
    """
    for name, interval in intervals.items():
        value = getattr(config, name)
        if not _inside(value, name, interval):
            shown = repr(value) if isinstance(value, str) else value
            raise ValueError(f"{prefix}{name}: expected a value in {interval}, received {shown}")


def require_integers_within(config: Any, prefix: str = "", **intervals: str) -> None:
    """Check integer fields against intervals (as :func:`require_within`): ``require_integers_within(cfg,
    port="[1, 65535]")`` requires ``cfg.port`` to be an int (bools refused) with ``1 <= cfg.port <= 65535``.

    Raises:
        ValueError: the first field that is no int or lies outside its interval (``"port: expected an integer in
            [1, 65535], received 70000"``, named with ``prefix``); a malformed interval.
    """
    for name, interval in intervals.items():
        value = getattr(config, name)
        integral = isinstance(value, Integral) and not isinstance(value, bool)
        if not (integral and _inside(value, name, interval)):
            raise ValueError(f"{prefix}{name}: expected an integer in {interval}, received {value!r}")


def _inside(value: Any, name: str, interval: str) -> bool:
    """Whether number ``value`` lies in ``interval`` (``"(0, 1]"``; ``inf`` allowed); False for NaN and for a value
    that is no number (``'x'`` from a text-only source such as ``inspect-robots -E k=v``).

    Raises:
        ValueError: ``interval`` is malformed (names field ``name``).
    """
    text = interval.replace(" ", "")
    if len(text) < 5 or text[0] not in "([" or text[-1] not in ")]" or text.count(",") != 1:
        raise ValueError(f"{name}: interval {interval!r} is not like '(0, 1]'")
    lo, hi = (float(v) for v in text[1:-1].split(","))
    if not isinstance(value, Real):
        return False
    above = value >= lo if text[0] == "[" else value > lo
    below = value <= hi if text[-1] == "]" else value < hi
    return bool(above and below)


def require_choice(config: Any, prefix: str = "", **choices: Iterable[str]) -> None:
    """Check name fields: ``require_choice(cfg, anchor=("current", "reference"))`` requires ``cfg.anchor`` to be
    one of them.

    Raises:
        ValueError: the first field holding another value (the choices listed, named with ``prefix``).
    """
    for name, options in choices.items():
        options = tuple(options)
        if getattr(config, name) not in options:
            raise ValueError(f"{prefix}{name}: expected one of {options}, received {getattr(config, name)!r}")


__all__ = [
    "require_choice",
    "require_counts",
    "require_integers_within",
    "require_non_negative",
    "require_positive",
    "require_within",
]
