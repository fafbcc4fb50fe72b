"""The YAML configs shipped with policylink (``train/*.yaml``, ``eval/*.yaml``): package data, so a wheel carries them
and a config name resolves the same from an installed package as from a checkout (``--config
configs/train/diffusion_push_state.yaml`` with no such file under the working directory, or just
``--config diffusion_push_state``). Nothing here imports any other part of policylink."""

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
