"""Evaluation reports: per-cell eval info in LeRobot's shape, success-rate tables with 95% Wilson intervals
(markdown, CSV, JSON), a heat map and a bar plot (PNG), episode videos (mp4) and a static ``report.html``."""

from __future__ import annotations

import csv
import html
import json
import math
import platform
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

TABLE_FIELDS = (
    "policy",
    "env",
    "n_success",
    "n_episodes",
    "pc_success",
    "ci95_low",
    "ci95_high",
    "avg_sum_reward",
    "avg_max_reward",
    "avg_steps",
    "avg_stall_steps",
    "avg_calls",  # policy calls per episode (corrective execution's budget, issue 16)
    "eval_s",
)
_VERSIONED = ("policylink", "numpy", "torch", "gymnasium", "mujoco", "zarr", "ray", "matplotlib", "imageio", "av")


def wilson_interval(successes: int, n: int, z: float = 1.959963984540054) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion (Wilson 1927), as fractions in ``[0, 1]``.

    ``center = (p + z^2 / 2n) / (1 + z^2 / n)``, ``half = z sqrt(p (1 - p) / n + z^2 / 4n^2) / (1 + z^2 / n)``;
    ``z = 1.96`` gives 95%. With ``n = 0`` the interval is ``(0, 1)``.

    Raises:
        ValueError: ``successes`` outside ``[0, n]``.
    """
    if not 0 <= successes <= n:
        raise ValueError(f"successes: expected an integer in [0, n={n}], received {successes}")
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    denom = 1.0 + z * z / n
    center = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    low = 0.0 if successes == 0 else max(0.0, center - half)  # exact bounds at k = 0 and k = n (no round-off)
    high = 1.0 if successes == n else min(1.0, center + half)
    return low, high


# two-sided 97.5 % quantiles of Student's t for 1..10 degrees of freedom (more: the normal's 1.96 is within 1.4 %)
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228)


def seed_interval(values: Sequence[float]) -> tuple[float, float]:
    """Mean and half-width of the 95 % Student-t interval of per-training-seed results (e.g. success in %).

    ``half = t_{0.975, n-1} s / sqrt(n)`` with ``s`` the sample standard deviation; one value has half-width 0
    (no spread can be estimated; report it as a single seed).

    Raises:
        ValueError: ``values`` is empty.
    """
    if len(values) == 0:
        raise ValueError("values: expected at least one per-seed result, received none")
    n = len(values)
    mean = float(sum(values)) / n
    if n == 1:
        return mean, 0.0
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    t = _T975[n - 2] if n - 1 <= len(_T975) else 1.959963984540054
    return mean, t * sd / math.sqrt(n)


def markdown_table(summaries: Sequence[dict[str, Any]]) -> str:
    """N x M markdown table: one row per policy, one column per env, cells ``62.0% [48.1, 74.2] (n=50)``."""
    policies = list(dict.fromkeys(s["policy"] for s in summaries))
    envs = list(dict.fromkeys(s["env"] for s in summaries))
    cell = {(s["policy"], s["env"]): s for s in summaries}
    lines = ["| policy | " + " | ".join(envs) + " |", "|---" * (len(envs) + 1) + "|"]
    for p in policies:
        row = []
        for e in envs:
            s = cell.get((p, e))
            text = "-"
            if s is not None:
                text = f"{s['pc_success']:.1f}% [{s['ci95_low']:.1f}, {s['ci95_high']:.1f}] (n={s['n_episodes']})"
                text += f" ({s['n_errors']} env errors)" if s.get("n_errors") else ""
            row.append(text)
        lines.append(f"| {p} | " + " | ".join(row) + " |")
    return (
        "\n".join(lines) + "\n\nSuccess rate with its 95% Wilson score interval; n = episodes per cell; env errors = "
        "episodes whose environment process crashed or stopped answering (counted as failures; see eval_info.json).\n"
    )


def write_tables(out: str | Path, summaries: Sequence[dict[str, Any]]) -> dict[str, Path]:
    """Write ``results.json``, ``results.csv`` and ``results.md`` into ``out``; returns their paths by suffix."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "results.json", "csv": out / "results.csv", "md": out / "results.md"}
    paths["json"].write_text(json.dumps(list(summaries), indent=2))
    with paths["csv"].open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=TABLE_FIELDS, extrasaction="ignore")
        w.writeheader()
        w.writerows(summaries)
    paths["md"].write_text(markdown_table(summaries))
    return paths


BAR_YMAX = 112
"""Upper y limit (%) of the success bar plot: room above 100 % for the error bars."""


def write_plots(out: str | Path, summaries: Sequence[dict[str, Any]]) -> dict[str, Path]:
    """Heat map of success rates (policies x envs) and a grouped bar plot with Wilson error bars (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out)
    policies = list(dict.fromkeys(s["policy"] for s in summaries))
    envs = list(dict.fromkeys(s["env"] for s in summaries))
    cell = {(s["policy"], s["env"]): s for s in summaries}
    rate = np.array([[cell[p, e]["pc_success"] if (p, e) in cell else np.nan for e in envs] for p in policies])
    fig, ax = plt.subplots(figsize=(1.6 + 1.3 * len(envs), 1.2 + 0.6 * len(policies)))
    im = ax.imshow(rate, vmin=0, vmax=100, cmap="viridis")
    ax.set_xticks(range(len(envs)), envs)
    ax.set_yticks(range(len(policies)), policies)
    for i in range(len(policies)):
        for j in range(len(envs)):
            if not np.isnan(rate[i, j]):
                ax.text(
                    j, i, f"{rate[i, j]:.0f}%", ha="center", va="center", color="white" if rate[i, j] < 60 else "black"
                )
    fig.colorbar(im, ax=ax, label="success rate (%)")
    ax.set_title("success rate")
    fig.tight_layout()
    heat = out / "success_heatmap.png"
    fig.savefig(heat, dpi=100)
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(2.7 + 0.6 * len(envs) * max(len(policies), 1), 3.2))  # + 1.2 in for the legend
    width = 0.8 / max(len(policies), 1)
    for i, p in enumerate(policies):
        xs = np.arange(len(envs)) + (i - (len(policies) - 1) / 2) * width
        ys = [cell[p, e]["pc_success"] if (p, e) in cell else 0.0 for e in envs]
        lo = [ys[k] - cell[p, e]["ci95_low"] if (p, e) in cell else 0.0 for k, e in enumerate(envs)]
        hi = [cell[p, e]["ci95_high"] - ys[k] if (p, e) in cell else 0.0 for k, e in enumerate(envs)]
        yerr = np.clip([lo, hi], 0.0, None)  # the interval holds the estimate; clip float round-off at 0 / 100 %
        ax.bar(xs, ys, width, yerr=yerr, capsize=3, label=p)
    ax.set_xticks(range(len(envs)), envs)
    ax.set_ylim(0, BAR_YMAX)  # headroom above 100 % for the error bars and caps
    ax.set_yticks(range(0, 101, 20))
    ax.axhline(100, color="0.6", lw=0.8, ls=":")
    ax.set_ylabel("success rate (%), 95% Wilson")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)  # beside, not on the bars
    fig.tight_layout()
    bars = out / "success_bars.png"
    fig.savefig(bars, dpi=100)
    plt.close(fig)
    return {"heatmap": heat, "bars": bars}


def plot_monitor_trace(path: str | Path, trace: Sequence[tuple[int, float, float, bool]], title: str = "") -> Path:
    """PNG of one episode's corrective monitor: smoothed deviation score and its threshold per control step, each
    trigger marked (``trace`` as :attr:`policylink.runtime.executors.CorrectiveExecutor.trace`: ``(step, score,
    threshold, fired)``; infinite thresholds are not drawn). Returns ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps, score, thr, fired = (np.array(c) for c in zip(*trace, strict=True)) if trace else ([], [], [], [])
    fig, ax = plt.subplots(figsize=(6, 2.6))
    ax.plot(steps, score, label="score (EWMA of 1 - cos)")
    ax.step(steps, np.where(np.isfinite(thr), thr, np.nan), where="mid", label="threshold", color="tab:orange")
    for s in np.asarray(steps)[np.asarray(fired, bool)] if len(steps) else []:
        ax.axvline(s, color="tab:red", ls="--", lw=1)
    ax.set_xlabel("control step")
    ax.set_title(title or "corrective monitor (dashed: trigger)", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def package_versions() -> dict[str, str]:
    """Installed versions of the packages that shape results (``"-"`` when absent) and the Python version."""
    out = {"python": platform.python_version()}
    for name in _VERSIONED:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "-"
    return out


def write_report(out: str | Path, summaries: Sequence[dict[str, Any]], config: dict[str, Any]) -> Path:
    """Write the plots and a static ``report.html`` (table, plots, videos inline, config, package versions).

    Paths in the page are relative to ``out``, so the folder can be moved or served as is.
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    plots = write_plots(out, summaries)
    esc = html.escape
    rows = "".join(
        "<tr>" + "".join(f"<td>{esc(_fmt(s.get(k)))}</td>" for k in TABLE_FIELDS) + "</tr>" for s in summaries
    )
    videos = []
    for s in summaries:
        clips = "".join(
            f'<figure><video src="{esc(v)}" controls muted loop width="192"></video>'
            f"<figcaption>{esc(Path(v).stem)}</figcaption></figure>"
            for v in s["video_paths"]
        )
        if clips:
            videos.append(f"<h3>{esc(s['policy'])} on {esc(s['env'])}</h3><div class='row'>{clips}</div>")
    page = f"""<!doctype html>
<html><head><meta charset="utf-8"><title>policylink evaluation</title>
<style>body{{font-family:sans-serif;margin:2em}} table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:3px 8px;text-align:right}} .row{{display:flex;flex-wrap:wrap;gap:8px}}
figure{{margin:0}} pre{{background:#f4f4f4;padding:1em}}</style></head><body>
<h1>policylink evaluation</h1>
<h2>Success rates</h2>
<table><tr>{"".join(f"<th>{esc(k)}</th>" for k in TABLE_FIELDS)}</tr>{rows}</table>
<p>pc_success and its 95% Wilson score interval (ci95_low, ci95_high), in %; rewards and steps are averaged
over episodes, counting steps up to and including each episode's terminal step.</p>
<h2>Plots</h2><img src="{plots["heatmap"].name}" alt="success heat map"> <img src="{plots["bars"].name}"
alt="success bar plot">
<h2>Episodes</h2>{"".join(videos) or "<p>no videos recorded</p>"}
<h2>Configuration</h2><pre>{esc(json.dumps(config, indent=2, default=str))}</pre>
<h2>Package versions</h2><pre>{esc(json.dumps(package_versions(), indent=2))}</pre>
</body></html>
"""
    path = out / "report.html"
    path.write_text(page)
    return path


def cell_info(
    policy: str, env: str, tasks: Sequence[str], shards: dict[int, dict[str, Any]], out: Path, settings: dict[str, Any]
) -> dict[str, Any]:
    """A cell's eval info in LeRobot's shape (``per_episode``, ``per_task``, ``per_group``, ``overall``).

    Args:
        policy, env: the cell's labels (``env`` is the task group).
        tasks: the env's instructions (``task_id`` is an instruction's index there).
        shards: first episode -> ``{"episodes": [...], "video_paths": {index: path}, "eval_s": s}``.
        out: the evaluation folder; video paths are stored relative to it.
        settings: the configuration that produced the results.
    """
    eps = sorted((e for s in shards.values() for e in s["episodes"]), key=lambda e: e["index"])
    videos = {int(k): v for s in shards.values() for k, v in s["video_paths"].items()}
    rel = {k: str(Path(v).resolve().relative_to(out.resolve())) for k, v in videos.items()}
    by_task: dict[str, list[dict]] = {}
    for e in eps:
        by_task.setdefault(e["task"], []).append(e)
    per_task = []
    for name, group in by_task.items():
        task_id = list(tasks).index(name) if name in tasks else len(per_task)
        per_task.append(
            {
                "task_group": env,
                "task_id": task_id,
                "task": name,
                "metrics": {
                    "sum_rewards": [e["sum_reward"] for e in group],
                    "max_rewards": [e["max_reward"] for e in group],
                    "successes": [e["success"] for e in group],
                    "video_paths": [rel[e["index"]] for e in group if e["index"] in rel],
                },
            }
        )
    agg = aggregate_episodes(eps)
    video_list = [rel[k] for k in sorted(rel)]
    eval_s = float(sum(s["eval_s"] for s in shards.values()))
    return {
        "policy": policy,
        "env": env,
        "settings": settings,
        "per_episode": eps,
        "per_task": per_task,
        "per_group": {env: {**agg, "video_paths": video_list}},
        "overall": {**agg, "eval_s": eval_s, "eval_ep_s": eval_s / max(len(eps), 1), "video_paths": video_list},
    }


def aggregate_episodes(eps: list[dict[str, Any]]) -> dict[str, Any]:
    """Means over episode dicts: ``avg_sum_reward``, ``avg_max_reward``, ``pc_success`` (%), ``n_episodes``,
    ``avg_steps``, ``avg_stall_steps`` (NaN for no episode)."""
    n = len(eps)
    mean = (lambda key: float(np.mean([e[key] for e in eps]))) if n else (lambda key: float("nan"))
    return {
        "avg_sum_reward": mean("sum_reward"),
        "avg_max_reward": mean("max_reward"),
        "pc_success": 100.0 * mean("success") if n else float("nan"),
        "n_episodes": n,
        "avg_steps": mean("n_steps"),
        "avg_stall_steps": mean("stall_steps"),
        "avg_calls": float(np.mean([e.get("inferences", np.nan) for e in eps])) if n else float("nan"),
    }


def cell_summary(policy: str, env: str, cell: str, info: dict[str, Any]) -> dict[str, Any]:
    """One table row of a cell: success count and rate with its 95% Wilson interval (%), averages, eval_s."""
    o = info["overall"]
    k = sum(e["success"] for e in info["per_episode"])
    low, high = wilson_interval(k, o["n_episodes"])
    return {
        "policy": policy,
        "env": env,
        "cell": cell,
        "n_success": int(k),
        "n_episodes": o["n_episodes"],
        "n_errors": sum(1 for e in info["per_episode"] if e.get("error")),
        "pc_success": o["pc_success"],
        "ci95_low": 100.0 * low,
        "ci95_high": 100.0 * high,
        "avg_sum_reward": o["avg_sum_reward"],
        "avg_max_reward": o["avg_max_reward"],
        "avg_steps": o["avg_steps"],
        "avg_stall_steps": o["avg_stall_steps"],
        "avg_calls": o.get("avg_calls", float("nan")),
        "eval_s": o["eval_s"],
        "video_paths": o["video_paths"],
    }


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 1000 else f"{v:.0f}"
    return "" if v is None else str(v)
