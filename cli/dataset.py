"""``policylink dataset``: inspect, describe, convert and merge episode stores.

Examples::

    policylink dataset info outputs/data/push.zarr
    policylink dataset stats outputs/data/push.zarr --out outputs/data/push_stats.json
    policylink dataset export-lerobot outputs/data/push.zarr --out outputs/lerobot/push [--video true]
    policylink dataset import-lerobot outputs/lerobot/push --out outputs/data/push_back.zarr
    policylink dataset merge --inputs a.zarr,b.zarr --out all.zarr [--only_success true] [--overwrite true]
    policylink dataset view outputs/data/push.zarr --episode 3   # -> outputs/data/push.zarr.view/episode_0003/
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from policylink.data.merge import MergeConfig, merge

# name -> (module implementing main(argv), or None when handled here; one-line help)
SUBCOMMANDS: dict[str, tuple[str | None, str]] = {
    "info": (None, "episodes, steps, features (shape, dtype), fps, success rate, sources/qualities/tasks/reality gaps"),
    "stats": (None, "per-feature mean/std/min/max/q01/q99 (optionally written to JSON)"),
    "export-lerobot": (None, "write a LeRobot v3.0 dataset folder (parquet + images or mp4 videos)"),
    "import-lerobot": (None, "read a LeRobot v3.0 dataset folder into an episode store"),
    "merge": (None, "concatenate episode stores (same features) into a new store (--overwrite true to replace one)"),
    "advantage-report": (
        "policylink.cli.dataset_advantage",
        "advantage labels: fraction positive per task/source/quality, histogram, worst episodes",
    ),
    "view": (
        "policylink.cli.dataset_view",
        "one episode as an HTML page: camera mp4s and state/action/reward curves over time",
    ),
}


@dataclass
class InfoConfig:
    """``policylink dataset info PATH``: summary of an episode store (zarr format 2 or 3).

    Attributes:
        path: the episode store (.zarr folder); also the first positional argument.
    """

    path: str = ""


@dataclass
class StatsConfig:
    """``policylink dataset stats PATH``: per-feature statistics (images in [0, 1], channel-first).

    Attributes:
        path: the episode store (.zarr folder); also the first positional argument.
        out: JSON file to write the statistics to (LeRobot's stats.json layout); None: print only.
        keys: features to describe (None: every feature but done).
    """

    path: str = ""
    out: str | None = None
    keys: list[str] | None = None


@dataclass
class ExportConfig:
    """``policylink dataset export-lerobot PATH --out DIR``: LeRobot v3.0 folder.

    Attributes:
        path: the episode store (.zarr folder); also the first positional argument.
        out: the LeRobot dataset folder to write.
        video: cameras as mp4 video features instead of PNG image features.
        fps: frames per second of the dataset, Hz (None: the store's recorded control frequency).
    """

    path: str = ""
    out: str = ""
    video: bool = False
    fps: float | None = None


@dataclass
class ImportConfig:
    """``policylink dataset import-lerobot DIR --out PATH``: LeRobot v3.0 folder to an episode store.

    Attributes:
        path: the LeRobot v3.0 dataset folder; also the first positional argument.
        out: the episode store (.zarr folder) to write.
        zarr_format: 3 (default) or 2.
    """

    path: str = ""
    out: str = ""
    zarr_format: int = 3


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``policylink dataset <subcommand>``. Returns the exit code (2 on a usage error)."""
    import importlib

    from policylink.cli.app import parse_config, split_subcommand

    argv = sys.argv[1:] if argv is None else argv
    split = split_subcommand("policylink dataset", SUBCOMMANDS, argv, usage="[PATH] [--option value ...]")
    if isinstance(split, int):
        return split
    name, rest = split
    if rest and not rest[0].startswith("-"):  # positional PATH
        rest = ["--path", rest[0], *rest[1:]]
    module = SUBCOMMANDS[name][0]
    if module is not None:
        return int(importlib.import_module(module).main(rest) or 0)

    cls = {
        "info": InfoConfig,
        "stats": StatsConfig,
        "export-lerobot": ExportConfig,
        "import-lerobot": ImportConfig,
        "merge": MergeConfig,
    }[name]
    cfg = parse_config(cls, rest, prog=f"policylink dataset {name}")
    return {"info": info, "stats": stats, "export-lerobot": export, "import-lerobot": import_, "merge": merge}[name](
        cfg
    )


def info(cfg: InfoConfig) -> int:
    """Print a summary of the store at ``cfg.path``."""
    from policylink.data.buffer import EpisodeStore

    s = EpisodeStore(_required(cfg.path, "path"))
    metas = s.all_meta()
    lengths = s.episode_lengths
    print(f"{s.path}: zarr format {s.zarr_format}, {s.n_episodes} episodes, {s.n_steps} steps")
    if s.info.get("fps"):
        print(f"fps: {s.info['fps']} Hz" + (f", env: {s.info['env']}" if s.info.get("env") else ""))
    if len(lengths):
        print(f"episode length: min {lengths.min()}, mean {lengths.mean():.1f}, max {lengths.max()}")
    for k in s.keys:
        print(f"  {k:<32} {str(s.feature_dtype(k)):<8} {s.feature_shape(k)}")
    known = [m.success for m in metas if m.success is not None]
    if known:
        print(f"success rate: {np.mean(known):.3f} ({sum(known)}/{len(known)} with a known outcome)")
    for fld in ("source", "quality", "task"):
        counts = Counter(getattr(m, fld) for m in metas)
        print(f"{fld}: " + ", ".join(f"{v!r} x{n}" for v, n in counts.most_common()))
    gaps = Counter(_gap_name(m.gap) for m in metas)
    if set(gaps) - {"none"}:
        print("reality gap: " + ", ".join(f"{v!r} x{n}" for v, n in gaps.most_common()))
    return 0


def _gap_name(gap_json: str) -> str:
    """The name of an episode's reality gap (``EpisodeMeta.gap``: JSON, ``""`` for none): ``"none"``, its
    ``name`` field, or ``"unnamed"``."""
    if not gap_json:
        return "none"
    name = json.loads(gap_json).get("name")
    return name if isinstance(name, str) and name else "unnamed"


def stats(cfg: StatsConfig) -> int:
    """Compute and print per-feature statistics; write them as JSON when ``cfg.out`` is set."""
    from policylink.data.buffer import EpisodeStore
    from policylink.data.stats import compute_stats

    s = EpisodeStore(_required(cfg.path, "path"))
    st = compute_stats(s, keys=cfg.keys, progress=True)
    np.set_printoptions(precision=4, suppress=True, linewidth=120)
    for k, d in st.items():
        print(f"{k} (count {int(d['count'][0])})")
        for name in ("mean", "std", "min", "max", "q01", "q99"):
            print(f"  {name:<5} {np.asarray(d[name]).ravel()}")
    if cfg.out:
        from pathlib import Path

        Path(cfg.out).parent.mkdir(parents=True, exist_ok=True)
        Path(cfg.out).write_text(
            json.dumps({k: {n: np.asarray(v).tolist() for n, v in d.items()} for k, d in st.items()}, indent=2)
        )
        print(f"wrote {cfg.out}")
    return 0


def export(cfg: ExportConfig) -> int:
    """Export the store at ``cfg.path`` as a LeRobot v3.0 folder at ``cfg.out``."""
    from policylink.data.buffer import EpisodeStore
    from policylink.data.lerobot import export_lerobot

    s = EpisodeStore(_required(cfg.path, "path"))
    root = export_lerobot(s, _required(cfg.out, "out"), fps=cfg.fps, video=cfg.video, progress=True)
    print(
        f"exported {s.n_episodes} episodes, {s.n_steps} frames -> {root} (LeRobot v3.0"
        f"{', videos' if cfg.video else ', images in parquet'})"
    )
    return 0


def import_(cfg: ImportConfig) -> int:
    """Import the LeRobot v3.0 folder at ``cfg.path`` into a new store at ``cfg.out``."""
    from policylink.data.lerobot import import_lerobot

    s = import_lerobot(
        _required(cfg.path, "path"), _required(cfg.out, "out"), zarr_format=cfg.zarr_format, progress=True
    )
    print(f"imported {s.n_episodes} episodes, {s.n_steps} frames -> {s.path}")
    return 0


def _required(value: str, name: str) -> str:
    if not value:
        raise ValueError(f"{name}: expected a path, received none (pass --{name} ...)")
    return value


if __name__ == "__main__":
    raise SystemExit(main())
