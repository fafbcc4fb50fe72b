"""Saved shard results of an evaluation: the settings that decide each episode's result, which saved shards a
run can reuse (``resume``), and what happens when they came from another configuration.
"""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # evaluate imports this module
    from policylink.evaluate.nxm import EvalConfig


def run_settings(cfg: EvalConfig) -> dict[str, Any]:
    """The configuration of a run, saved with every shard and in ``eval_info.json``."""
    return {"episodes": cfg.episodes, "videos": cfg.videos, **result_settings(cfg)}


def result_settings(cfg: EvalConfig) -> dict[str, Any]:
    """The settings that determine each episode's result (compared on resume): the seed, the shard layout, the
    envs per task, the env kwargs and the executor. ``episodes`` and ``videos`` are not among them: episode ``i``
    of a cell has the same result whatever their values, so a changed count reuses the shards it still needs."""
    return {
        "seed": cfg.seed,
        "num_envs": cfg.num_envs,
        "shard_episodes": cfg.shard_episodes,
        "env_kwargs": {k: _setting(v) for k, v in cfg.env_kwargs.items()},
        "executor": json.loads(json.dumps(asdict(cfg.executor), default=str)),
        **({"instructions": cfg.instructions} if cfg.instructions else {}),
        **({"cfg_scale": cfg.cfg_scale} if cfg.cfg_scale is not None else {}),
    }


def _setting(value: Any) -> str:
    """An env kwarg as saved: a mapping as JSON with sorted keys (``{force: 2, displacement: 0.03}`` is the same
    setting in either order), anything else as ``str``."""
    if isinstance(value, Mapping):
        return json.dumps(value, sort_keys=True, default=str)
    return str(value)


def shard_plan(cfg: EvalConfig, first: int) -> tuple[int, list[int]]:
    """``(count, filmed episode indices)`` of the shard starting at episode ``first``."""
    count = min(cfg.shard_episodes, cfg.episodes - first)
    return count, [i for i in range(first, first + count) if i < cfg.videos]


def load_done(cdir: Path, cfg: EvalConfig, on_mismatch: str) -> dict[int, dict[str, Any]]:
    """The saved shards of cell folder ``cdir`` that this run can reuse, by first episode.

    A shard is reused when its result settings equal this run's, it starts a shard of this run with the same
    episode count, and it filmed every episode this run films (a film of a failure beyond them is kept); shards
    past ``episodes`` stay on disk unused. Without ``cfg.resume`` (or with ``on_mismatch="redo"`` and other
    result settings) the cell's saved shards and videos are deleted first.

    Raises:
        ValueError: saved shards of other result settings with ``on_mismatch="error"`` (names the settings).
    """
    shards = cdir / "shards"
    if shards.is_dir() and not cfg.resume:
        discard(cdir)
    if not shards.is_dir():
        return {}
    now = result_settings(cfg)
    saved = {int(f.stem): json.loads(f.read_text()) for f in sorted(shards.glob("*.json"))}
    for doc in saved.values():
        old = {k: doc["settings"].get(k) for k in now}
        if old == now:
            continue
        diff = sorted(k for k in now if old[k] != now[k])
        if on_mismatch == "redo":
            print(f"{cdir.name}: settings {diff} changed; evaluating the cell again", file=sys.stderr)
            discard(cdir)
            return {}
        raise ValueError(
            f"resume {cdir}: expected results of the same configuration, received different "
            f"{diff} (saved {[old[k] for k in diff]}, now {[now[k] for k in diff]}); "
            "use another --out or --resume false"
        )
    done = {}
    for first, doc in saved.items():
        if first % cfg.shard_episodes or first >= cfg.episodes:
            continue
        count, vids = shard_plan(cfg, first)
        if len(doc["episodes"]) == count and set(vids) <= {int(i) for i in doc.get("video_paths", {})}:
            done[first] = {k: v for k, v in doc.items() if k != "settings"}
    return done


def discard(cdir: Path) -> None:
    """Delete a cell's saved shards and videos (its other files are rewritten at the end of the run)."""
    for sub in ("shards", "videos"):
        shutil.rmtree(cdir / sub, ignore_errors=True)


__all__ = ["discard", "load_done", "result_settings", "run_settings", "shard_plan"]
