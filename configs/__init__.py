"""The YAML configs shipped with policylink (``train/*.yaml``, ``eval/*.yaml``): package data, so a wheel carries them
and a config name resolves the same from an installed package as from a checkout (``--config
configs/train/diffusion_push_state.yaml`` with no such file under the working directory, or just
``--config diffusion_push_state``). A config file may name a ``base`` file and hold only what differs from it
(:func:`load_config`). Nothing here imports any other part of policylink."""

from __future__ import annotations

from pathlib import Path

CONFIG_ROOT = Path(__file__).resolve().parent
"""The folder holding ``train/`` and ``eval/`` (``configs/`` of a checkout, ``policylink/configs/`` installed)."""

KINDS = ("train", "eval")


def shipped_config(name: str) -> Path | None:
    """The shipped config file that ``name`` names, else None. Accepted spellings (a ``.yaml`` suffix optional):
    ``configs/train/flow_push_state.yaml`` (the path in a checkout), ``train/flow_push_state.yaml``, and a bare
    ``flow_push_state`` (looked up under ``train/``, then ``eval/``)."""
    rel = Path(name)
    if rel.is_absolute() or ".." in rel.parts:
        return None
    parts = rel.parts[1:] if rel.parts[:1] == ("configs",) else rel.parts
    if not parts:
        return None
    stem = Path(*parts)
    candidates = [stem] if len(parts) > 1 else [Path(kind) / stem for kind in KINDS]
    for candidate in candidates:
        for path in (CONFIG_ROOT / candidate, CONFIG_ROOT / candidate.with_name(candidate.name + ".yaml")):
            if path.suffix in (".yaml", ".yml", ".json") and path.is_file():
                return path
    return None


def shipped_config_names(kind: str | None = None) -> list[str]:
    """``configs/<kind>/<name>.yaml`` of every shipped YAML config (of one ``kind``, or all), sorted."""
    kinds = KINDS if kind is None else (kind,)
    return sorted(f"configs/{k}/{p.name}" for k in kinds for p in (CONFIG_ROOT / k).glob("*.yaml"))


BASE_KEY = "base"
"""A config file's ``base: OTHER.yaml`` or ``base: [A.yaml, B.yaml]`` (relative to the file, or shipped config names):
the file is its bases merged in order with the file's own keys merged over them (:func:`load_config`), so a config is
the few lines that make it different."""


class ConfigFileError(ValueError):
    """A config file, or one of its bases, cannot be read, is not a YAML mapping, or its bases form a cycle; the
    message names the file (and the line and column for invalid YAML)."""


def merge(base: dict, over: dict) -> dict:
    """``over`` merged into ``base`` (new dict): mappings merge key by key, recursively; any other value (a list, a
    scalar, None) replaces the base's."""
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def load_config(path: str | Path, _chain: tuple[Path, ...] = ()) -> dict:
    """The mapping a YAML config file stands for: its ``base`` chain resolved and merged (:func:`merge`), the
    ``base`` key removed. A file without ``base`` is read as it is (an empty file is ``{}``).

    Raises:
        ConfigFileError: the file or a base is missing or unreadable (named, with the file that asked for it), is
            invalid YAML (file:line:column), is not a mapping, or the bases form a cycle.
    """
    import yaml

    path = Path(path).expanduser().resolve()
    if path in _chain:
        cycle = " -> ".join(str(p) for p in (*_chain, path))
        raise ConfigFileError(f"{path}: {BASE_KEY} files form a cycle: {cycle}")
    try:
        text = path.read_text()
    except OSError as e:
        asked = f" ({BASE_KEY} of {_chain[-1]})" if _chain else ""
        raise ConfigFileError(f"{path}{asked}: cannot read it ({e.strerror or e})") from None
    try:
        doc = yaml.safe_load(text)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(path)
        raise ConfigFileError(f"{where}: invalid YAML: {e.problem or e.context}") from None
    doc = {} if doc is None else doc
    if not isinstance(doc, dict):
        raise ConfigFileError(f"{path}: expected a YAML mapping of options, received a {type(doc).__name__}")
    bases = doc.pop(BASE_KEY, None)
    if bases is None:
        return doc
    bases = [bases] if isinstance(bases, str) else bases
    if not isinstance(bases, list) or not bases or not all(isinstance(b, str) and b for b in bases):
        raise ConfigFileError(f"{path}: {BASE_KEY}: expected a file name or a list of them, received {bases!r}")
    merged: dict = {}
    for base in bases:  # later bases override earlier ones; the file itself overrides them all
        base_path = path.parent / base
        if not base_path.exists() and shipped_config(base) is not None:
            base_path = shipped_config(base)
        merged = merge(merged, load_config(base_path, (*_chain, path)))
    return merge(merged, doc)


def has_base(path: str | Path) -> bool:
    """True when the YAML file at ``path`` names a ``base`` (a cheap top-level check; False when unreadable)."""
    import yaml

    try:
        doc = yaml.safe_load(Path(path).expanduser().read_text())
    except (OSError, yaml.YAMLError):
        return False
    return isinstance(doc, dict) and BASE_KEY in doc


def composed_file(path: str | Path, out_dir: str | Path) -> Path:
    """A file holding :func:`load_config` of ``path`` (bases merged) for readers of plain YAML (draccus), written
    into ``out_dir``; ``path`` itself when it has no base.

    Raises:
        ConfigFileError: as :func:`load_config`.
    """
    import yaml

    if not has_base(path):
        return Path(path)
    out = Path(out_dir) / Path(path).name
    out.write_text(yaml.safe_dump(_type_first(load_config(path)), sort_keys=False))
    return out


def _type_first(doc):
    """``doc`` with every mapping's ``type`` key first (a choice's type before its fields, as written by hand)."""
    if isinstance(doc, dict):
        keys = sorted(doc, key=lambda k: k != "type")
        return {k: _type_first(doc[k]) for k in keys}
    if isinstance(doc, list):
        return [_type_first(v) for v in doc]
    return doc
