"""``policylink dataset advantage-report PATH``: inspect a store's advantage labels (written by ``policylink
finetune advantage label``): fraction positive per task, source and quality, a histogram of the advantages with
each task's threshold, and the worst-labelled episodes (lowest mean advantage), as videos when the store has
camera frames.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from policylink.data.labels import DEFAULT_LABEL_SET, episode_starts, label_summary, read_labels


@dataclass
class AdvantageReportConfig:
    """``policylink dataset advantage-report PATH [--out DIR]``.

    Attributes:
        path: the labelled episode store.
        name: the label set (``finetune advantage label --name``).
        out: folder for ``advantage_hist.png`` and, for a store with camera frames, the worst episodes' videos
            (empty: print only).
        worst: how many worst-labelled episodes to list (and render); 0 lists none.
    """

    path: str = ""
    name: str = DEFAULT_LABEL_SET
    out: str = ""
    worst: int = 3


def advantage_report(cfg: AdvantageReportConfig) -> dict[str, Any]:
    """Print the report; returns ``{"by_task"|"by_source"|"by_quality": {group: (steps, fraction positive)},
    "worst": [episode indices], "files": [written paths]}``.

    Raises:
        LabelsError: the store has no (or stale) label set ``cfg.name``.
    """
    from policylink.data.buffer import EpisodeStore

    if not cfg.path:
        raise ValueError("path: expected an episode store path (policylink dataset advantage-report STORE.zarr)")
    if cfg.worst < 0:
        raise ValueError(f"worst: expected >= 0 episodes, received {cfg.worst}")
    store = EpisodeStore(cfg.path, "r")
    labels = read_labels(cfg.path, cfg.name)
    metas, ends = store.all_meta(), store.episode_ends
    out: dict[str, Any] = {}
    print(f"{cfg.path}: label set {cfg.name!r} ({labels.attrs.get('source', '?')}), {store.n_steps} steps, "
          f"{labels.label.mean():.3f} positive")  # fmt: skip
    for group in ("task", "source", "quality"):
        summary = label_summary(labels.label, ends, [getattr(m, group) or "-" for m in metas])
        out[f"by_{group}"] = summary
        print(f"by {group}:")
        for g, (steps, frac) in summary.items():
            print(f"  {g:<40} {steps:>8} steps  {frac:.3f} positive")
    starts = episode_starts(ends)
    mean_adv = np.array([labels.advantage[s:e].mean() for s, e in zip(starts, ends, strict=True)])
    worst = [int(i) for i in np.argsort(mean_adv)[: cfg.worst]]
    out["worst"] = worst
    print("worst-labelled episodes (lowest mean advantage):")
    for e in worst:
        m = metas[e]
        print(f"  episode {e}: mean A {mean_adv[e]:+.4f}, positive {labels.label[starts[e]:ends[e]].mean():.2f}, "
              f"success {m.success}, source {m.source}, quality {m.quality or '-'}")  # fmt: skip
    out["files"] = _write_files(cfg, store, labels, worst) if cfg.out else []
    return out


def _write_files(cfg: AdvantageReportConfig, store, labels, worst: list[int]) -> list[Path]:
    """The histogram (per-task thresholds as lines) and, when the store has camera frames, the worst episodes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.hist(labels.advantage, bins=60, color="0.6")
    for task, thr in dict(labels.attrs.get("thresholds", {})).items():
        ax.axvline(float(thr), color="tab:red", label=f"threshold {task or '(all)'}"[:40])
    ax.set_xlabel("advantage")
    ax.set_ylabel("steps")
    ax.legend(fontsize=7)
    fig.tight_layout()
    files = [out / "advantage_hist.png"]
    fig.savefig(files[0], dpi=100)
    plt.close(fig)
    cams = [k for k in store.keys if k.startswith("observation.images.")]
    if cams:
        from policylink.data.video import write_video

        fps = float(store.info.get("fps", 10.0))
        for e in worst:
            frames = store.get_episode(e, [cams[0]])[cams[0]]
            files.append(write_video(out / f"worst_episode_{e:04d}.mp4", list(frames), fps))
    for f in files:
        print(f"wrote {f}")
    if not cams and worst:
        print("no videos of the worst episodes: the store holds no camera frames (observation.images.*)")
    return files


__all__ = ["AdvantageReportConfig", "advantage_report"]
