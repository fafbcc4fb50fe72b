"""Per-call time of an image policy's observation path before/after the lean path of issue 19, in one run.

*Before* (``policy.frame_cache = False``): each call converts the whole window (``B x n_obs_steps`` uint8
frames) to float, divides by 255, normalises, rescales to ``[-1, 1]`` and runs the ResNet-18 on every frame.
*After* (default): the new frame of each row goes through one folded affine and the ResNet once; the window's
older frame keeps its features. Both policies hold the same weights and seed, see the same observations and run
alternately, step by step (a new chunk at every control step, as async / real-time chunking replans):
``update_observation`` + ``embed`` (the observation path) then ``predict_action_chunk`` (the whole call).

    .venv/bin/python benchmarks/obs_path.py --reps 15
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch
from inference_latency import IMAGE, IMAGE_SIDE, STATE, STATE_DIM, _ours, machine_line

RESULTS = Path(__file__).resolve().parent / "results" / "obs_path.md"


def run(batch: int, reps: int, down: list[int]) -> dict[str, np.ndarray]:
    """Times (ms) per step of both policies at ``batch``: ``{"<name>_obs": (reps,), "<name>_call": (reps,)}``,
    plus ``"max_diff"``, the largest action difference between the two (units), and frames encoded per call."""
    policies = {"before": _ours("diffusion", "image", down)[0], "after": _ours("diffusion", "image", down)[0]}
    policies["before"].model.load_state_dict(policies["after"].model.state_dict())
    policies["before"].frame_cache = False
    rng = np.random.default_rng(0)
    out = {f"{n}_{part}": [] for n in policies for part in ("obs", "call")}
    max_diff = 0.0
    with torch.inference_mode():
        for step in range(reps + 1):  # step 0: warm-up (conv path measurement, first window)
            obs = {
                STATE: rng.random((batch, STATE_DIM), dtype=np.float32),
                IMAGE: rng.integers(0, 256, (batch, IMAGE_SIDE, IMAGE_SIDE, 3), dtype=np.uint8),
            }
            chunks = {}
            for name, policy in policies.items():
                t0 = time.perf_counter()
                policy.update_observation(obs)
                policy.embed()
                t1 = time.perf_counter()
                chunks[name] = policy.predict_action_chunk()
                t2 = time.perf_counter()
                if step:
                    out[f"{name}_obs"].append(1e3 * (t1 - t0))
                    out[f"{name}_call"].append(1e3 * (t2 - t0))
            max_diff = max(max_diff, float(np.abs(chunks["before"] - chunks["after"]).max()))
    result = {k: np.array(v) for k, v in out.items()}
    result["max_diff"] = max_diff
    result["frames_after"] = policies["after"]._frames.encoded_frames / (reps + 1)
    return result


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and write ``benchmarks/results/obs_path.md``. See ``--help``."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=15, help="timed steps per batch size")
    ap.add_argument("--batches", default="1,8", help="comma list of batch sizes")
    ap.add_argument("--down-dims", default="256,512,1024", help="U-Net channels per level")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    down = [int(d) for d in args.down_dims.split(",")]
    load_start = os.getloadavg()[0]
    rows = []
    for b in (int(x) for x in args.batches.split(",")):
        r = run(b, args.reps, down)
        for part, label in (("obs", "observation path (update + embed)"), ("call", "whole call (+ sampling)")):
            before, after = np.median(r[f"before_{part}"]), np.median(r[f"after_{part}"])
            rows.append(
                f"| {b} | {label} | {before:.1f} | {after:.1f} | {after / before:.2f}x | "
                f"{2 * b} | {r['frames_after']:.1f} | {r['max_diff']:.1e} |"
            )
            print(rows[-1], flush=True)
    load = f"load average {load_start:.1f} at start, {os.getloadavg()[0]:.1f} at end"
    command = " ".join([".venv/bin/python benchmarks/obs_path.py", *(argv or sys.argv[1:])])
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(
        "# Image observation path: before / after the lean path (issue 19)\n\n"
        f"Command: `{command}`  \nMachine: {machine_line(args.threads)}; {load}; date "
        f"{datetime.date.today().isoformat()}.\n\n"
        "Diffusion Policy, one 96x96 camera through ResNet-18 (GroupNorm, spatial softmax, 84x84 centre crop) + "
        f"state, n_obs_steps 2, U-Net {down}, 10 DDIM steps; a new chunk at every step. Before = "
        "`frame_cache = False` (whole window to float, /255, normalise, *2-1, every frame encoded); after = one "
        "folded affine per new frame, encoded once. Same weights, seed and observations, alternating step by "
        f"step; p50 over {args.reps} steps.\n\n"
        "| batch | timed part | before p50 ms | after p50 ms | after / before | frames encoded per call before | "
        "after | max action difference |\n|---|---|---|---|---|---|---|---|\n" + "\n".join(rows) + "\n"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
