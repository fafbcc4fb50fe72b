"""The MetaWorld MT10 table: collect what was run into ``benchmarks/results/metaworld_mt10.json`` (policy -> task ->
``{"success": fraction, "episodes": n}``, plus ``"expert"``) and ``metaworld_mt10.md`` (Wilson 95 % intervals,
published numbers beside ours).

The runs themselves are ``policylink`` commands (``benchmarks/results/metaworld_mt10.md`` lists them): per task,
``record`` 50 scripted episodes (seeds 0-49), ``train`` a policy from state, ``eval`` 50 episodes on seeds
100000-100049 (unseen). This script reads their outputs:

- ``expert``: the scripted policy's success on the recorded episodes (``<data>/<task>.zarr``, its
  ``meta/episode_success``);
- ``<policy>``: each ``<evals>/<policy>_<task>/results.json`` (``policylink eval`` output); a multi-task policy
  (one checkpoint for all ten tasks, e.g. ``vla_mt10``) is evaluated per task into the same layout.

Rows already in ``<out>.json`` for policies not named in ``--policies`` are kept (other runs, e.g. the image
policies' rows collected from another ``--evals`` folder, share the files), so each run only rewrites its own rows.

    .venv/bin/python benchmarks/metaworld_mt10.py [--data outputs/mw/data] [--evals outputs/mw/eval]
        [--policies flow diffusion act vla_mt10] [--out benchmarks/results/metaworld_mt10]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from policylink.evaluate.report import wilson_interval
from policylink.sim.isolated.metaworld import MT10_TASKS

PUBLISHED = [
    (
        "Multi-task multi-head SAC (Yu et al. 2019, arXiv 1910.10897, MT10 table)",
        0.88,
        "online RL, millions of environment steps per task, one multi-task network; v1 tasks with fixed goals "
        "(MT10 v1 'fixed'); success at the end of training; per-task numbers not in the table we cite",
    ),
]
"""Published MT10 means quoted beside ours (source, mean success, how the setting differs)."""


LABELS = {
    "vla_mt10": "vla_mt10 (one policy for all ten tasks, told the task by its instruction)",
}
"""Row labels that say more than the policy name (the multi-task row); other rows show the name."""


def expert_results(data: Path) -> dict[str, dict[str, float | int]]:
    """Task -> success fraction and episode count of the recorded scripted episodes."""
    import zarr

    out: dict[str, dict[str, float | int]] = {}
    for task in MT10_TASKS:
        path = data / f"{task}.zarr"
        if not path.exists():
            continue
        flags = zarr.open_group(str(path), mode="r")["meta/episode_success"][:]
        out[task] = {"success": float((flags == 1).mean()), "episodes": int(len(flags))}
    return out


def policy_results(evals: Path, policy: str) -> dict[str, dict[str, float | int]]:
    """Task -> success fraction and episode count from ``<evals>/<policy>_<task>/results.json``."""
    out: dict[str, dict[str, float | int]] = {}
    for task in MT10_TASKS:
        path = evals / f"{policy}_{task}" / "results.json"
        if not path.exists():
            continue
        (summary,) = json.loads(path.read_text())
        out[task] = {"success": summary["pc_success"] / 100.0, "episodes": int(summary["n_episodes"])}
    return out


def markdown(table: dict[str, dict[str, dict[str, float | int]]]) -> str:
    """The table: one row per policy, one column per task, success % [Wilson 95 %], the mean over run tasks."""
    head = "| policy | " + " | ".join(MT10_TASKS) + " | mean (tasks run) |"
    lines = [head, "|" + "---|" * (len(MT10_TASKS) + 2)]
    for policy, cells in table.items():
        row = []
        for task in MT10_TASKS:
            c = cells.get(task)
            if c is None:
                row.append("not run")
                continue
            k, n = round(c["success"] * c["episodes"]), int(c["episodes"])
            lo, hi = wilson_interval(k, n)
            row.append(f"{100 * c['success']:.0f} [{100 * lo:.0f}, {100 * hi:.0f}]")
        done = [c["success"] for c in cells.values()]
        mean = f"{100 * sum(done) / len(done):.1f} ({len(done)}/10)" if done else "-"
        lines.append(f"| {LABELS.get(policy, policy)} | " + " | ".join(row) + f" | {mean} |")
    for source, mean, _ in PUBLISHED:
        lines.append(f"| {source} | " + " | ".join(["-"] * len(MT10_TASKS)) + f" | {100 * mean:.0f} (10/10) |")
    notes = [f"- {source}: {how}." for source, _, how in PUBLISHED]
    return "\n".join(lines) + "\n\nPublished numbers and how their setting differs from ours:\n\n" + "\n".join(notes)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", default="outputs/mw/data")
    p.add_argument("--evals", default="outputs/mw/eval")
    p.add_argument("--policies", nargs="+", default=["flow"])
    p.add_argument("--out", default="benchmarks/results/metaworld_mt10")
    args = p.parse_args()
    out_json = Path(args.out + ".json")
    table = json.loads(out_json.read_text()) if out_json.exists() else {}
    table["expert"] = expert_results(Path(args.data))
    for policy in args.policies:
        table[policy] = policy_results(Path(args.evals), policy)
    out_json.write_text(json.dumps(table, indent=2) + "\n")
    Path(args.out + ".table.md").write_text(markdown(table) + "\n")
    print(markdown(table))


if __name__ == "__main__":
    main()
