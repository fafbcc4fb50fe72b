"""The ALOHA sim table (issue 33 item 6): collect what was run into ``benchmarks/results/aloha.json`` (policy ->
task -> ``{"success": fraction, "episodes": n}``, plus ``"expert"``) and ``aloha.table.md`` (Wilson 95 % intervals,
the ACT paper's numbers beside ours).

The runs are ``policylink`` commands (``benchmarks/results/aloha.md`` lists them): per task ``record`` 50 scripted
episodes (seeds 0-49), ``train`` ACT, ``eval`` 50 episodes on seeds 100000-100049 (unseen). This script reads:

- ``expert``: the scripted policy's success on the recorded episodes (``<data>/<task>.zarr``'s
  ``meta/episode_success``);
- ``<policy>``: each ``<evals>/<policy>_<task>/results.json`` (``policylink eval`` output).

Rows already in ``<out>.json`` for policies not named in ``--policies`` are kept.

    .venv/bin/python benchmarks/aloha.py [--data outputs/aloha/data] [--evals outputs/aloha/eval]
        [--policies act] [--out benchmarks/results/aloha]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from policylink.evaluate.report import wilson_interval
from policylink.sim.isolated.aloha import ALOHA_TASKS

PUBLISHED = {
    "transfer_cube": 0.90,
    "insertion": 0.50,
}
"""ACT's success on the sim tasks with 50 scripted demonstrations (Zhao et al. 2023, arXiv 2304.13705, the simulated
tasks' results; the ACT repository's README: "The success rate should be around 90% for transfer cube, and around
50% for insertion")."""

PUBLISHED_SOURCE = (
    "ACT, Zhao et al. 2023 (arXiv 2304.13705, sim tasks, scripted data; the ACT README's run): 50 scripted "
    "demonstrations of 400 steps, inputs the top camera at 480x640 and the 14 joint positions, ResNet18 + a "
    "transformer of width 512 (4 encoder, 7 decoder layers), chunks of 100 executed whole, 2000 epochs of batch 8 "
    "on a GPU, 50 evaluation episodes"
)

LABELS = {
    "expert": "expert (the scripted policy replayed in joint space, on the 50 recorded episodes)",
    "act": "act (ours: 14 joints + object poses, no camera; small ACT, chunks of 50, 10 executed)",
    "act_every1": "act, the same checkpoint replanning every step",
    "act_te": "act, the same checkpoint with temporal ensembling (ACT's, m = 0.01)",
    "act_image_te": (
        "act from images (ours: top camera 48x64 + 14 joints, no object poses; small conv trunk + small ACT, "
        "chunks of 50, 2400 x 32) with temporal ensembling"
    ),
}
"""Row labels that say more than the policy name."""


def expert_results(data: Path) -> dict[str, dict[str, float | int]]:
    """Task -> success fraction and episode count of the recorded scripted episodes."""
    import zarr

    out: dict[str, dict[str, float | int]] = {}
    for task in ALOHA_TASKS:
        path = data / f"{task}.zarr"
        if path.exists():
            flags = zarr.open_group(str(path), mode="r")["meta/episode_success"][:]
            out[task] = {"success": float((flags == 1).mean()), "episodes": int(len(flags))}
    return out


def policy_results(evals: Path, policy: str) -> dict[str, dict[str, float | int]]:
    """Task -> success fraction and episode count from ``<evals>/<policy>_<task>/results.json``."""
    out: dict[str, dict[str, float | int]] = {}
    for task in ALOHA_TASKS:
        path = evals / f"{policy}_{task}" / "results.json"
        if path.exists():
            (summary,) = json.loads(path.read_text())
            out[task] = {"success": summary["pc_success"] / 100.0, "episodes": int(summary["n_episodes"])}
    return out


def cell(c: dict[str, float | int] | None) -> str:
    """``"success % [Wilson 95 % low, high]"`` of one cell, or ``"not run"``."""
    if c is None:
        return "not run"
    n = int(c["episodes"])
    lo, hi = wilson_interval(round(c["success"] * n), n)
    return f"{100 * c['success']:.0f} [{100 * lo:.0f}, {100 * hi:.0f}]"


def markdown(table: dict[str, dict[str, dict[str, float | int]]]) -> str:
    """One row per policy (the published ACT row first), one column per task: success % [Wilson 95 %]."""
    lines = ["| policy | " + " | ".join(ALOHA_TASKS) + " |", "|" + "---|" * (len(ALOHA_TASKS) + 1)]
    published = " | ".join(f"{100 * PUBLISHED[t]:.0f} (50 episodes)" for t in ALOHA_TASKS)
    lines.append(f"| ACT, published ({PUBLISHED_SOURCE}) | {published} |")
    for policy, cells in table.items():
        label = LABELS.get(policy, policy)
        lines.append(f"| {label} | " + " | ".join(cell(cells.get(t)) for t in ALOHA_TASKS) + " |")
    return "\n".join(lines)


def main() -> None:
    """Collect the expert and policy rows, write ``<out>.json`` and ``<out>.table.md``."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", type=Path, default=Path("outputs/aloha/data"))
    p.add_argument("--evals", type=Path, default=Path("outputs/aloha/eval"))
    p.add_argument("--policies", nargs="+", default=["act"])
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/aloha"))
    args = p.parse_args()
    json_path = args.out.with_suffix(".json")
    table = json.loads(json_path.read_text()) if json_path.exists() else {}
    table["expert"] = expert_results(args.data) or table.get("expert", {})
    for policy in args.policies:
        rows = policy_results(args.evals, policy)
        if rows:
            table[policy] = rows
    json_path.write_text(json.dumps(table, indent=2) + "\n")
    args.out.with_suffix(".table.md").write_text(markdown(table) + "\n")
    print(markdown(table))


if __name__ == "__main__":
    main()
