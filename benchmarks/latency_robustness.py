"""Latency robustness (issue 34 item 3): success of asynchronous execution at 0 and 100 ms of injected inference
latency, from the rows ``benchmarks/deployment.py --jsonl`` writes, into ``benchmarks/results/sim2real.json``.

    python benchmarks/deployment.py --checkpoint CKPT --task push --n_action_steps 1 --modes async_inpaint \\
        --latencies 0,100 --seeds 100 --pacing 0 --tag final --jsonl outputs/lat/push.jsonl
    python benchmarks/latency_robustness.py --jsonl outputs/lat/push.jsonl outputs/lat/reach.jsonl --tag final \\
        --mode async+inpaint

Rows of one (task, injected latency, execution mode) whose tag starts with ``--tag`` (and whose task is one of
``--tasks``) are pooled (several invocations with different ``--first_seed`` make one cell). Prints a markdown
table with 95 % Wilson intervals of every pooled cell and, with ``--json``, writes ``--mode``'s figures of those
tasks into that file's ``"latency"`` key, ``{"reach": {"0": s, "100": s}, "push": {"0": s, "100": s}}`` (s the
success fraction), read-modify-write: other tasks and other keys (other benchmarks') are kept.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

from policylink.evaluate.report import wilson_interval


def pool(paths: list[str], tag: str, tasks: list[str] | None = None) -> dict[tuple[str, int, str], list[int]]:
    """``(task, latency_ms, mode) -> [successes, episodes]`` over the rows of ``paths`` whose tag starts with
    ``tag`` and whose task is in ``tasks`` (None: any; pacing rows skipped).

    Raises:
        FileNotFoundError: a path does not exist.
    """
    cells: dict[tuple[str, int, str], list[int]] = defaultdict(lambda: [0, 0])
    for path in paths:
        for line in Path(path).read_text().splitlines():
            row = json.loads(line)
            if "pacing" in row or not str(row.get("tag", "")).startswith(tag):
                continue
            if tasks is not None and row["task"] not in tasks:
                continue
            n = int(row["episodes"])
            cell = cells[(row["task"], int(round(row["latency_ms"])), row["mode"])]
            cell[0] += int(round(row["success"] * n))
            cell[1] += n
    return dict(cells)


def table(cells: dict[tuple[str, int, str], list[int]]) -> str:
    """Markdown: one line per cell with its success, 95 % Wilson interval and episodes."""
    lines = ["| task | injected (ms) | execution | success | 95 % Wilson | episodes |", "|---|---|---|---|---|---|"]
    for (task, lat, mode), (k, n) in sorted(cells.items()):
        lo, hi = wilson_interval(k, n)
        interval = f"{100 * lo:.0f}-{100 * hi:.0f} %"
        lines.append(f"| {task} | {lat} | {mode} | {100 * k / n:.0f} % ({k}/{n}) | {interval} | {n} |")
    return "\n".join(lines)


def latency_key(cells: dict[tuple[str, int, str], list[int]], mode: str) -> dict[str, dict[str, float]]:
    """``{"reach": {"0": s, "100": s}, "push": {...}}`` for ``mode`` (tasks and latencies present only).

    Raises:
        KeyError: no cell of ``mode``.
    """
    out: dict[str, dict[str, float]] = {}
    for (task, lat, m), (k, n) in sorted(cells.items()):
        if m == mode and lat in (0, 100):
            out.setdefault(task, {})[str(lat)] = round(k / n, 4)
    if not out:
        raise KeyError(f"--mode: no rows of {mode!r}; modes present: {sorted({m for _, _, m in cells})}")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jsonl", nargs="+", required=True, help="rows written by benchmarks/deployment.py --jsonl")
    ap.add_argument("--tag", default="", help="pool rows whose tag starts with this")
    ap.add_argument("--tasks", nargs="+", default=None, help="only these tasks (default: all)")
    ap.add_argument("--mode", default="async+inpaint", help="the execution label whose figures go to the JSON")
    ap.add_argument("--json", default=None, help="e.g. benchmarks/results/sim2real.json (only 'latency' replaced)")
    args = ap.parse_args()
    cells = pool(args.jsonl, args.tag, args.tasks)
    print(table(cells))
    if args.json:
        path = Path(args.json)
        data = json.loads(path.read_text()) if path.exists() else {}
        data["latency"] = {**data.get("latency", {}), **latency_key(cells, args.mode)}
        path.write_text(json.dumps(data, indent=2) + "\n")
        print(f"wrote {path} latency: {data['latency']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
