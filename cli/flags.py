"""The one flag rewriter of every ``policylink`` subcommand (:func:`normalise_flags`) and the field lookups it
shares with the parser and the help: a dataclass field's type by dotted path, list item types."""

from __future__ import annotations

import dataclasses
import json
import sys
import types
import typing
from collections.abc import Sequence
from typing import Any


def normalise_flags(cls: type, argv: Sequence[str]) -> list[str]:
    """The one flag rewriter of every subcommand, for the fields of dataclass ``cls``:

    - ``--obs-mode x`` -> ``--obs_mode x`` (dashed spellings of field names, dotted paths too);
    - a renamed flag -> its current name, with a one-line deprecation notice on stderr (``cls.renamed_flags``: old
      -> new path; an old path ending in ``.`` renames a whole section: ``{"advantage.": "objective."}``);
    - a bare boolean flag (last, or followed by another flag) -> ``--flag=true``;
    - a comma list for a list field -> draccus' bracket form: ``--envs a,b`` -> ``--envs ["a", "b"]`` for
      lists of str (quoted, so ``{env}`` placeholders and ``label=ref`` stay plain strings), ``[1,2]`` otherwise;
    - a str field's value that YAML (draccus reads every value as YAML) would not read back as that text, such as
      ``--train_config {policy}_{env}_state.yaml`` (a broken flow mapping) or ``true`` -> a single-quoted YAML
      string (``null`` stays None).

    Other values, ``--``, ``-h`` and bracketed lists are left as they are.
    """
    args = list(argv)
    out: list[str] = []
    list_type: Any = None
    str_value = False
    for i, a in enumerate(args):
        if list_type is not None and not a.startswith(("--", "[")):
            a = _bracket(a, list_type)
        elif str_value and not a.startswith("--"):
            a = _yaml_text(a)
        list_type, str_value = None, False
        if a.startswith("--") and len(a) > 2:
            key, eq, value = a[2:].partition("=")
            key = _renamed(cls, key.replace("-", "_"))
            a = "--" + key + eq + value
            kind = _field_type(cls, key)
            if kind is bool and not eq and (i + 1 == len(args) or args[i + 1].startswith("--")):
                a += "=true"
            elif _list_item(kind) is not None:
                if eq and not value.startswith("["):
                    a = f"--{key}={_bracket(value, _list_item(kind))}"
                elif not eq:
                    list_type = _list_item(kind)
            elif kind is str:
                if eq:
                    a = f"--{key}={_yaml_text(value)}"
                else:
                    str_value = True
        out.append(a)
    return out


def default_type_flags(cls: type, args: Sequence[str], doc: Any = None) -> list[str]:
    """``args`` plus ``--FIELD.type NAME`` for each choice field of dataclass ``cls`` (``policy``, ``objective``)
    whose default is not its base's default type (``objective`` of ``finetune advantage train``: ``advantage``),
    when neither ``args`` nor the config mapping ``doc`` choose a type: so ``--objective.label_dropout 0.1`` sets
    an option of the default's type (draccus would decode a section without ``type`` as the base's default)."""
    import draccus

    try:
        instance = cls()
    except Exception:  # a config with required fields: no defaults to keep
        return list(args)
    doc = doc if isinstance(doc, dict) else {}
    extra = []
    for f in dataclasses.fields(cls):
        value = getattr(instance, f.name)
        if not isinstance(value, draccus.ChoiceRegistry):
            continue
        name = value.get_choice_name(type(value))
        flag = f"--{f.name}.type"
        chosen = any(a == flag or a.startswith(flag + "=") for a in args)
        chosen = chosen or isinstance(doc.get(f.name), dict) and "type" in doc[f.name]
        base = _field_type(cls, f.name)
        default = base.default_choice_name() if hasattr(base, "default_choice_name") else None
        if not chosen and name != default:
            extra += [flag, name]
    return [*extra, *args]


def _renamed(cls: type, key: str) -> str:
    """``key`` under its current name when ``cls.renamed_flags`` lists it (or its section), else ``key``; a renamed
    key prints ``--old is deprecated, use --new`` on stderr (the alias is kept for one release)."""
    renamed: dict[str, str] = getattr(cls, "renamed_flags", {})
    new = renamed.get(key)
    if new is None:
        section = max((old for old in renamed if old.endswith(".") and key.startswith(old)), key=len, default=None)
        new = None if section is None else renamed[section] + key[len(section) :]
    if new is None:
        return key
    print(f"policylink: --{key} is deprecated (kept for one release), use --{new}", file=sys.stderr)
    return new


def _yaml_text(value: str) -> str:
    """``value`` as draccus should read it for a str field: unchanged when YAML reads it as that text (``push``,
    ``outputs/x``) or as null (an optional field's None), else single-quoted (``'{policy}_{env}.yaml'``, ``'a: b'``,
    ``'true'``, which YAML would turn into a mapping, an error or a bool)."""
    import yaml

    try:
        plain = yaml.safe_load(value) in (value, None)
    except yaml.YAMLError:
        plain = False
    return value if plain else "'" + value.replace("'", "''") + "'"


def _bracket(value: str, item: Any) -> str:
    """``a,b`` as draccus' list form: JSON strings for ``list[str]``, ``[a,b]`` for other item types."""
    items = [x for x in value.split(",") if x]
    return json.dumps(items) if item is str else f"[{','.join(items)}]"


def _field_type(cls: type, dotted: str) -> Any:
    """The type of field ``dotted`` (``a.b``) of dataclass ``cls``, ``Optional`` unwrapped; None if unknown.
    A field of a choice type (``policy``) is also looked up in its registered subclasses (``policy.language``
    exists on the VLA's config only), so their bare boolean flags work too."""
    current: Any = cls
    for part in dotted.split("."):
        if not dataclasses.is_dataclass(current):
            return None
        choices = getattr(current, "get_known_choices", None)
        candidates = [current, *(choices().values() if callable(choices) else ())]
        hints = next((h for h in map(typing.get_type_hints, candidates) if part in h), None)
        if hints is None:
            return None
        current = hints[part]
        args = [a for a in typing.get_args(current) if a is not type(None)]
        if typing.get_origin(current) in (typing.Union, types.UnionType) and args:
            current = args[0]
    return current


def _list_item(kind: Any) -> Any:
    """The item type of a list/tuple/Sequence field type (``Any`` when unparameterised), else None."""
    if typing.get_origin(kind) not in (list, tuple, Sequence):
        return None
    args = typing.get_args(kind)
    return args[0] if args else Any
