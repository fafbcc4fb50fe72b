"""Success per goal of ``policylink eval`` cells on ``multitask`` (benchmarks/results/vla.md): reads each cell's
``eval_info.json`` (per-instruction successes) and groups instructions by goal key (``<colour>/<side>``) with the
env's table and the instruction files.

    python benchmarks/vla_goals.py LABEL=EVAL_OUT [LABEL=EVAL_OUT ...] [--instructions FILE ...]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from policylink.sim.mujoco.multitask import GOALS, MultitaskEnv

GOAL_KEYS = list(MultitaskEnv.goal_keys)


def goal_table(files: list[str]) -> dict[str, str]:
    """Instruction -> goal key: the env's 18 instructions plus every instruction file's."""
    table = {t: "/".join(g) for t, g in GOALS.items()}
    for f in files:
        for key, texts in json.loads(Path(f).read_text()).items():
            table.update({t: key for t in texts})
    return table


def per_goal(eval_out: str, table: dict[str, str]) -> dict[str, tuple[int, int]]:
    """Goal key -> (successes, episodes) over every cell in ``eval_out``."""
    out = {k: (0, 0) for k in GOAL_KEYS}
    for info in Path(eval_out).glob("cells/*/eval_info.json"):
        for row in json.loads(info.read_text())["per_task"]:
            s, n = out[table[row["task"]]]
            succ = row["metrics"]["successes"]
            out[table[row["task"]]] = (s + int(sum(succ)), n + len(succ))
    return out


def main() -> None:
    """Print a markdown table: one row per labelled eval output, one column per goal, then all goals."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cells", nargs="+", help="LABEL=EVAL_OUT")
    ap.add_argument("--instructions", nargs="*", default=[])
    args = ap.parse_args()
    table = goal_table(args.instructions)
    print("| policy / instructions | " + " | ".join(GOAL_KEYS) + " | all |")
    print("|---" * (len(GOAL_KEYS) + 2) + "|")
    for cell in args.cells:
        label, _, path = cell.partition("=")
        goals = per_goal(path, table)
        s, n = sum(v[0] for v in goals.values()), sum(v[1] for v in goals.values())
        cols = [f"{100 * a / b:.0f}% ({a}/{b})" if b else "-" for a, b in goals.values()]
        print(f"| {label} | " + " | ".join(cols) + f" | **{100 * s / max(n, 1):.0f}%** ({s}/{n}) |")


if __name__ == "__main__":
    main()
