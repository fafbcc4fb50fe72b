"""The ``--help`` text of a subcommand's config dataclass: its description, then every option with its type, its
default and the text of its docstring entry (built only when ``-h`` / ``--help`` is asked for)."""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import io
import re
import types
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from policylink.cli.commands import COMMANDS
from policylink.cli.flags import normalise_flags


def format_help(cls: type, prog: str, instance: Any = None) -> str:
    """The ``--help`` text of dataclass config ``cls``: its description, then every option with its type, its
    default and the help of its field (the ``Attributes:`` section of the class docstrings); a choice field
    (``policy``) lists its ``type`` choices and the fields of the type ``instance`` holds (default: a default
    instance, so the default type). A top-level command's description is its line of ``policylink --help``
    (:data:`~policylink.cli.commands.COMMANDS`), a subcommand's the first paragraph of ``cls``'s docstring."""
    import textwrap

    doc = _clean(inspect.getdoc(cls) or "").split("\n\n")[0].replace("\n", " ")
    words = prog.split()
    if len(words) == 2 and words[1] in COMMANDS:  # a command: the line 'policylink --help' shows for it
        doc = COMMANDS[words[1]][1]
    lines = [f"usage: {prog} [--config FILE.yaml] [--OPTION VALUE ...]", "", *textwrap.wrap(doc, 116), "", "options:"]
    lines += ["  --config FILE.yaml", "      a YAML file of these options; the flags after it override its values"]
    instance = instance if instance is not None else _default_instance(cls)
    hidden = set(getattr(cls, "hidden_options", ()))  # options a command sets itself (and refuses)
    for path, kind, default, text in (
        o for o in iter_options(cls, "", instance, all_choices=False) if o[0] not in hidden
    ):
        lines.append(f"  --{path} {kind}  (default: {default})")
        if text:
            lines += textwrap.wrap(text, 110, initial_indent=" " * 6, subsequent_indent=" " * 6)
    lines += ["", "Dashes and underscores are the same (--obs-mode, --obs_mode); lists take a,b or [a,b]; a bare"]
    lines += ["boolean flag means true."]
    return "\n".join(lines)


def field_docs(cls: type) -> dict[str, str]:
    """Help text per field name of dataclass ``cls``, from the ``Attributes:`` sections of its docstring and its
    bases' (Google style: ``name: text`` or ``a, b: text``, continued on more-indented lines), rST roles removed."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        for names, text in _attribute_entries(klass.__dict__.get("__doc__") or ""):
            for name in names:
                docs[name] = _clean(text)
    return docs


def iter_options(cls: type, prefix: str, instance: Any, all_choices: bool):
    """Yield ``(path, type name, default, help)`` for every leaf option of ``cls`` (recursing into sections); also
    the flag list of :func:`~policylink.cli.app.flag_paths`."""
    import draccus

    docs = field_docs(cls)
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        kind, path = _unwrap(hints[f.name]), prefix + f.name
        value = getattr(instance, f.name, None) if instance is not None else None
        if isinstance(kind, type) and issubclass(kind, draccus.ChoiceRegistry):
            choices = kind.get_known_choices()
            current = type(value) if value is not None else None
            name = kind.get_choice_name(current) if current is not None else kind.default_choice_name()
            yield path + ".type", "{" + ",".join(choices) + "}", name, f"{docs.get(f.name, '')} Selects the type."
            for sub_name, sub in choices.items():
                if all_choices or sub_name == name:
                    yield from iter_options(sub, path + ".", value if sub is current else None, all_choices)
        elif dataclasses.is_dataclass(kind):
            yield from iter_options(kind, path + ".", value, all_choices)
        else:
            yield path, _type_name(kind), _default_text(f, value, instance), docs.get(f.name, "")


def help_instance(cls: type, args: Sequence[str], config_path: str | None) -> Any:
    """The config a run with ``config_path`` and ``args`` would use, so ``--help`` shows its values; when that does
    not parse, a default instance of ``cls`` whose top-level choice fields (``policy``) hold the type named by
    ``--FIELD.type NAME`` in ``args`` or by ``FIELD: {type: NAME}`` in the config file, so that ``--help`` lists
    that type's options (``policylink train --config vla.yaml --help``). Unreadable files and unknown names keep
    the default type (the run itself reports them)."""
    import draccus

    rest = [a for a in args if a not in ("-h", "--help")]
    if config_path:  # the values the run would use (file + flags), when they parse
        try:
            with contextlib.redirect_stderr(io.StringIO()):
                return draccus.parse(cls, config_path=config_path, args=normalise_flags(cls, rest))
        except (Exception, SystemExit):
            pass
    instance = _default_instance(cls)
    if instance is None:
        return None
    hints = typing.get_type_hints(cls)
    for name, type_name in chosen_types(args, config_path).items():
        kind = _unwrap(hints.get(name))
        if isinstance(kind, type) and issubclass(kind, draccus.ChoiceRegistry):
            try:
                instance = dataclasses.replace(instance, **{name: kind.get_choice_class(type_name)()})
            except (ValueError, KeyError, TypeError):
                pass
    return instance


def chosen_types(args: Sequence[str], config_path: str | None) -> dict[str, str]:
    """The type names chosen for top-level fields: ``FIELD: {type: NAME}`` in the YAML file ``config_path``, then
    ``--FIELD.type NAME`` / ``--FIELD.type=NAME`` in ``args`` (a flag wins over the file). A file that cannot be
    read or parsed chooses nothing (reading it is reported elsewhere)."""
    import yaml

    chosen: dict[str, str] = {}
    try:
        data = yaml.safe_load(Path(config_path).read_text()) if config_path else None
    except (OSError, yaml.YAMLError):
        data = None
    for key, value in (data or {}).items() if isinstance(data, dict) else ():
        if isinstance(value, dict) and isinstance(value.get("type"), str):
            chosen[key] = value["type"]
    for i, a in enumerate(args):
        key, eq, value = a[2:].partition("=")
        if a.startswith("--") and key.endswith(".type") and (eq or i + 1 < len(args)):
            chosen[key[: -len(".type")]] = value if eq else args[i + 1]
    return chosen


def _default_instance(cls: type) -> Any:
    """``cls()`` when every field has a default (the shown defaults are then the real ones), else None."""
    try:
        return cls()
    except Exception:
        return None


def _default_text(f: dataclasses.Field, value: Any, instance: Any) -> str:
    if instance is None:
        if f.default is not dataclasses.MISSING:
            value = f.default
        elif f.default_factory is not dataclasses.MISSING:
            value = f.default_factory()
        else:
            return "required"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value) if value else "[]"
    return "''" if value == "" else str(value)


def _type_name(kind: Any) -> str:
    if kind is bool:
        return "{true,false}"
    origin = typing.get_origin(kind)
    if origin is not None:
        args = [_type_name(a) for a in typing.get_args(kind)]
        return f"{getattr(origin, '__name__', str(origin))}[{', '.join(args)}]" if args else origin.__name__
    return getattr(kind, "__name__", str(kind))


def _unwrap(kind: Any) -> Any:
    """``X`` for ``X | None`` / ``Optional[X]``; other types unchanged."""
    args = [a for a in typing.get_args(kind) if a is not type(None)]
    if typing.get_origin(kind) in (typing.Union, types.UnionType) and len(args) == 1:
        return args[0]
    return kind


def _attribute_entries(doc: str) -> list[tuple[list[str], str]]:
    """``(names, text)`` of each entry of the ``Attributes:`` section of a raw docstring."""
    lines = inspect.cleandoc(doc).splitlines()
    entries: list[tuple[list[str], str]] = []
    inside, indent = False, None
    for line in lines:
        stripped = line.strip()
        if stripped == "Attributes:":
            inside, indent = True, None
            continue
        if not inside or not stripped:
            continue
        depth = len(line) - len(line.lstrip())
        if depth == 0:
            inside = False
            continue
        match = re.match(r"([A-Za-z_][\w]*(?:\s*,\s*[A-Za-z_][\w]*)*)\s*:\s*(.*)", stripped)
        if match and (indent is None or depth == indent):
            indent = depth
            entries.append(([n.strip() for n in match.group(1).split(",")], match.group(2)))
        elif entries:
            entries[-1] = (entries[-1][0], entries[-1][1] + " " + stripped)
    return entries


def _clean(text: str) -> str:
    """reStructuredText roles and literals as plain text: ``:class:`~a.B``` -> ``B``, ````x```` -> ``x``."""
    text = re.sub(r":\w+:`~?([^`]*)`", lambda m: m.group(1).rsplit(".", 1)[-1], text)
    return text.replace("``", "")
