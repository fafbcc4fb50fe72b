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
- ``flow, <executor>`` (:data:`CORRECTIVE_KEYS`): with ``--corrective DIR [DIR ...]``, each
  ``DIR/corr_<task>/bench/results.json`` (``benchmarks/corrector.py --env metaworld/<task>``: replan every step,
  corrective, open-loop 4; a task found in several folders is taken from the last), each cell also carrying
  ``calls_per_episode``; the corrective table beside it (``--state_evals``: the flow row's evals, for the open-loop 4
  calls of tasks whose corrector run had no open-loop cell), with the mean over the tasks where both executors ran.
  Improvement attempts (:data:`CORRECTIVE_VARIANTS`): the corrective cell of ``DIR/corr_<task>/bench_<variant>/``,
  an extra row compared with the same task's replan-every-step cell. Image rows: ``--evals outputs/mw_img/eval
  --policies flow_image``.

Rows already in ``<out>.json`` for policies not named in ``--policies`` are kept (other runs, e.g. the image
policies' rows collected from another ``--evals`` folder, share the files), so each run only rewrites its own rows.

    .venv/bin/python benchmarks/metaworld_mt10.py [--data outputs/mw/data] [--evals outputs/mw/eval]
        [--policies flow diffusion act vla_mt10] [--corrective outputs/mw_img outputs/mwcorr]
        [--out benchmarks/results/metaworld_mt10]
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
    "flow_image": "flow_image (corner2 camera 64x64 + hand and gripper, no object or goal state)",
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


CORRECTIVE_ROWS = {"every1": "replan every step", "open4": "open-loop 4", "corrective": "corrective"}
"""``benchmarks/corrector.py`` cell (its executor name up to the first ``:``) -> its row in the corrective table."""
CORRECTIVE_KEYS = {
    "replan every step": "flow, replan every step",
    "open-loop 4": "flow, open-loop 4 (corrector.py's run)",
    "corrective": "flow, corrective (16-step chunks)",
}
"""Corrective table row -> its policy key in the JSON and the main table."""


CORRECTIVE_VARIANTS = {
    "h4": "short_horizon 4",  # 4 actions per chunk (not 2) in the start phase and after an alarm
    "start48": "short_start 48",  # the first 48 steps (not 12) at 2 actions per chunk
}
"""Improvement attempt (``corr_<task>/bench_<variant>/`` folder suffix) -> what it changed from the corrective cell;
its row in the JSON is ``flow, corrective (16-step chunks, <what>)``."""


def _cells(path: Path) -> dict[str, dict[str, float | int]]:
    """Corrective table row -> ``{"success", "episodes", "calls_per_episode"}`` of one ``corrector.py``
    ``results.json`` (unperturbed cells only)."""
    out: dict[str, dict[str, float | int]] = {}
    for cell in json.loads(path.read_text())["cells"]:
        row = CORRECTIVE_ROWS.get(cell["executor"].split(":")[0])
        if row is None or cell["perturbation"] != "none":
            continue
        out[row] = {"success": cell["success"], "episodes": int(cell["n"]),
                    "calls_per_episode": cell["calls_per_episode"]}  # fmt: skip
    return out


def corrective_results(roots: list[Path]) -> dict[str, dict[str, dict[str, float | int]]]:
    """Executor row -> task -> ``{"success", "episodes", "calls_per_episode"}`` from each
    ``<root>/corr_<task>/bench/results.json`` (``benchmarks/corrector.py --env metaworld/<task>`` output, unperturbed
    cells only; a task in several roots is taken from the last), plus one row per :data:`CORRECTIVE_VARIANTS` entry
    found (``<root>/corr_<task>/bench_<variant>/results.json``, its corrective cell); a task without a file is left
    out."""
    out: dict[str, dict[str, dict[str, float | int]]] = {row: {} for row in CORRECTIVE_ROWS.values()}
    for root in roots:
        for task in MT10_TASKS:
            path = root / f"corr_{task}" / "bench" / "results.json"
            if path.exists():
                for row, c in _cells(path).items():
                    out[row][task] = c
            for variant, label in CORRECTIVE_VARIANTS.items():
                path = root / f"corr_{task}" / f"bench_{variant}" / "results.json"
                if path.exists() and "corrective" in (cells := _cells(path)):
                    out.setdefault(f"corrective, {label}", {})[task] = cells["corrective"]
    return out


def open_loop_calls(evals: Path, task: str) -> dict[str, float | int] | None:
    """The state flow row's cell on ``task`` (``<evals>/flow_<task>/results.json``: open-loop 4, one env per
    episode) with its ``calls_per_episode``; None when it was not run."""
    path = evals / f"flow_{task}" / "results.json"
    if not path.exists():
        return None
    (c,) = json.loads(path.read_text())
    return {"success": c["pc_success"] / 100.0, "episodes": int(c["n_episodes"]), "calls_per_episode": c["avg_calls"]}


def _goal(every: dict[str, float | int], corr: dict[str, float | int], digits: int = 0) -> str:
    """The goal column: corrective within 3 points of replan-every-step at <= 30 % of its calls."""
    gap = 100 * (corr["success"] - every["success"])
    share = corr["calls_per_episode"] / every["calls_per_episode"]
    met = "met" if gap >= -3 and share <= 0.3 else "not met"
    return f"{gap:+.{digits}f} points at {100 * share:.0f} % of the calls: {met}"


def corrective_markdown(rows: dict[str, dict[str, dict[str, float | int]]], evals: Path) -> str:
    """Per task: success % [Wilson 95 %] and policy calls per episode of replan-every-step, corrective and open-loop
    4 (``corrector.py``'s own cell, else the flow row's, marked ``*``), and the goal: corrective within 3 points of
    replan-every-step at <= 30 % of its calls; then one row per improvement attempt (``corrective, <what>`` rows) and
    the mean over the tasks where both executors ran (success, calls per episode; the share is of the mean calls)."""

    def cell(c: dict[str, float | int] | None, mark: str = "") -> str:
        if c is None:
            return "not run"
        lo, hi = wilson_interval(round(c["success"] * c["episodes"]), int(c["episodes"]))
        return f"{100 * c['success']:.0f} [{100 * lo:.0f}, {100 * hi:.0f}]{mark}, {c['calls_per_episode']:.1f}"

    lines = ["| task | replan every step | corrective | open-loop 4 | corrective vs every step |"]
    lines.append("|---|---|---|---|---|")
    every_row, corr_row = rows["replan every step"], rows["corrective"]
    for task in MT10_TASKS:
        every, corr = every_row.get(task), corr_row.get(task)
        if every is None and corr is None:
            continue
        open4, mark = rows["open-loop 4"].get(task), ""
        if open4 is None:
            open4, mark = open_loop_calls(evals, task), "*"
        goal = _goal(every, corr) if every is not None and corr is not None else "-"
        lines.append(f"| {task} | {cell(every)} | {cell(corr)} | {cell(open4, mark)} | {goal} |")
    for row, cells in rows.items():
        for task, corr in cells.items() if row.startswith("corrective, ") else ():
            every = every_row.get(task)
            goal = _goal(every, corr) if every is not None else "-"
            lines.append(f"| {task}, {row.removeprefix('corrective, ')} | {cell(every)} | {cell(corr)} | - | {goal} |")
    both = [t for t in MT10_TASKS if t in every_row and t in corr_row]
    if both:
        mean = {name: {"success": sum(r[t]["success"] for t in both) / len(both),
                       "calls_per_episode": sum(r[t]["calls_per_episode"] for t in both) / len(both)}
                for name, r in (("every", every_row), ("corr", corr_row))}  # fmt: skip
        pct = {k: f"{100 * m['success']:.1f}, {m['calls_per_episode']:.1f}" for k, m in mean.items()}
        lines.append(f"| mean ({len(both)}/10 tasks) | {pct['every']} | {pct['corr']} | - | "
                     f"{_goal(mean['every'], mean['corr'], 1)} |")  # fmt: skip
    return "\n".join(lines)


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
    p.add_argument("--corrective", nargs="+", default=None, help="folders of corr_<task>/bench/results.json")
    p.add_argument("--state_evals", default="outputs/mw/eval", help="the flow row's evals (open-loop 4 calls)")
    args = p.parse_args()
    out_json = Path(args.out + ".json")
    table = json.loads(out_json.read_text()) if out_json.exists() else {}
    table["expert"] = expert_results(Path(args.data))
    for policy in args.policies:
        table[policy] = policy_results(Path(args.evals), policy)
    corrective = corrective_results([Path(d) for d in args.corrective]) if args.corrective else {}
    for row, cells in corrective.items():  # calls per episode ride along in the JSON
        key = CORRECTIVE_KEYS.get(row) or f"flow, corrective (16-step chunks, {row.removeprefix('corrective, ')})"
        table[key] = cells
    out_json.write_text(json.dumps(table, indent=2) + "\n")
    text = markdown(table)
    if corrective:
        text += "\n\nCorrective execution:\n\n" + corrective_markdown(corrective, Path(args.state_evals))
    Path(args.out + ".table.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
