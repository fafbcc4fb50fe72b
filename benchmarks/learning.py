"""Learning benchmark: train Diffusion Policy and the flow-matching policy on scripted-expert demos and report
the success rate over held-out reset seeds.

For each ``(policy, task)`` it records demos when the store is missing (``policylink record``), trains with
``configs/train/<policy>_<task>_<variant>.yaml`` (``--steps`` overrides the config), then evaluates the EMA
checkpoint on ``--episodes`` seeds starting at 100000 (demos use seeds from 0). Results are appended to
``benchmarks/results/learning.md`` as they come, with the training budget and wall time.

    MUJOCO_GL=egl .venv/bin/python benchmarks/learning.py --tasks push,reach --policies diffusion,flow
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "learning.md"
EVAL_SEED = 100_000


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; returns 0. See ``--help``."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", default="push,reach", help="comma list of envs (push, reach, pick_place)")
    ap.add_argument("--policies", default="diffusion,flow", help="comma list: diffusion, flow")
    ap.add_argument("--variant", default="state", help="config suffix: state, state_fast, image")
    ap.add_argument("--steps", type=int, default=0, help="override the config's training steps (0 = keep)")
    ap.add_argument("--demos", type=int, default=0, help="demo episodes when recording (0 = per-task default)")
    ap.add_argument("--episodes", type=int, default=100, help="held-out evaluation episodes")
    ap.add_argument("--results", default=str(RESULTS), help="markdown file the rows are appended to")
    ap.add_argument(
        "--action-steps",
        default="",
        help="comma list of actions executed per chunk to evaluate each checkpoint with (default: the config's)",
    )
    ap.add_argument(
        "--eval-only",
        action="store_true",
        help="evaluate the existing output_dir/checkpoints/last of each config instead of training",
    )
    args = ap.parse_args(argv)
    os.environ.setdefault("MUJOCO_GL", "egl")
    from policylink.cli.app import parse_config
    from policylink.policies import load_policy
    from policylink.train.imitation import TrainConfig, evaluate_success, train

    results = Path(args.results)
    _header(results, " ".join([Path(sys.executable).name, "benchmarks/learning.py", *(argv or sys.argv[1:])]))
    for task in args.tasks.split(","):
        for kind in args.policies.split(","):
            name = f"{kind}_{task}_{args.variant}"
            overrides = ["--config", str(ROOT / "configs" / "train" / f"{name}.yaml"), "--progress", "false"]
            if args.steps:
                overrides += ["--steps", str(args.steps)]
            cfg = parse_config(TrainConfig, overrides)
            _record_if_missing(cfg.dataset, task, args.demos)
            t0 = time.perf_counter()
            ckpt = Path(cfg.output_dir) / "checkpoints" / "last" if args.eval_only else train(cfg)
            train_s = time.perf_counter() - t0
            loss = _last_loss(Path(cfg.output_dir) / "metrics.csv")
            policy = load_policy(ckpt, device=cfg.device)
            for n_exec in [int(n) for n in args.action_steps.split(",") if n] or [policy.spec.n_action_steps]:
                t1 = time.perf_counter()
                rate = evaluate_success(policy, cfg.dataset, args.episodes, EVAL_SEED, n_action_steps=n_exec)
                eval_s = time.perf_counter() - t1
                trained = "(existing)" if args.eval_only else f"{train_s / 60:.1f}"
                row = (
                    f"| {kind} | {task} | {cfg.dataset.obs_mode} | {_count(cfg.dataset.path)} | {cfg.steps} x "
                    f"{cfg.batch_size} | {list(cfg.policy.unet.down_dims)} | {loss[0]:.4f} | {loss[1]} | "
                    f"{trained} | **{100 * rate:.0f}%** ({args.episodes} seeds, {n_exec} of "
                    f"{policy.spec.chunk_size} executed) | {eval_s:.0f} |"
                )
                with results.open("a") as f:
                    f.write(row + "\n")
                print(row, flush=True)
    return 0


def _record_if_missing(dataset, task: str, demos: int) -> None:
    if Path(dataset.path).exists():
        return
    n = demos or (100 if task == "reach" else 200)
    cmd = [
        str(Path(sys.executable).parent / "policylink"),
        "record",
        "--env",
        task,
        "--expert",
        "expert",
        "--episodes",
        str(n),
        "--out",
        dataset.path,
        "--seed",
        "0",
        "--obs_mode",
        dataset.obs_mode,
        "--image_size",
        str(dataset.image_size),
    ]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _count(path: str) -> int:
    from policylink.data.buffer import EpisodeStore

    with EpisodeStore(path, "r") as s:
        return s.n_episodes


def _last_loss(metrics: Path) -> tuple[float, str]:
    import csv

    rows = list(csv.DictReader(metrics.open()))
    val = [r["val_loss"] for r in rows if r.get("val_loss")]
    return float(rows[-1]["loss"]), (f"{float(val[-1]):.4f}" if val else "-")


def _header(path: Path, command: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists():
        path.write_text(
            "# Learning results\n\nSuccess rate of the EMA checkpoint over held-out reset seeds "
            f"(from {EVAL_SEED}; demos use seeds 0..N-1), receding horizon (the config's n_action_steps of each "
            "16-action chunk).\n"
        )
    with path.open("a") as f:
        f.write(
            f"\n## Run of {datetime.date.today().isoformat()} ({platform.node() and '2-core CPU, no GPU'})\n\n"
            f"Command: `MUJOCO_GL=egl {command}`\n\n"
            "| policy | task | obs | demos | steps x batch | U-Net | final train loss | val loss | train min "
            "| success | eval s |\n|---|---|---|---|---|---|---|---|---|---|---|\n"
        )


if __name__ == "__main__":
    raise SystemExit(main())
