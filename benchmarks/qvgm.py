"""Q-VGM benchmark (issue 14): a few-shot flow policy improved from its own rollouts only, against same-critic
baselines (best-of-N reranking, filtered BC), plus the critic's ranking quality on held-out rollouts.

Per training seed: record ``--demos`` expert demos (``policylink record``), train a few-shot flow policy
(``policylink train``), run ``policylink finetune loop`` (rounds of record -> critic -> Q-VGM -> evaluate, with
the baselines), then score each round's critic on held-out rollouts of the base policy: Spearman correlation of
``Q(s_t, A_t)`` with the realised discounted return from ``t`` on. Appends a section to
``benchmarks/results/qvgm.md``.

    MUJOCO_GL=egl .venv/bin/python benchmarks/qvgm.py --env push --demos 20 --base-steps 1500 --rounds 2
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "qvgm.md"
POLICYLINK = str(ROOT / ".venv" / "bin" / "policylink")


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; returns 0. See ``--help``."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--env", default="push")
    ap.add_argument("--demos", type=int, default=20, help="expert demos of the few-shot base policy")
    ap.add_argument("--base-steps", type=int, default=1500, help="training steps of the base policy")
    ap.add_argument("--action-steps", type=int, default=8, help="executed steps per chunk (critic horizon)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--episodes", type=int, default=50, help="rollouts recorded per round")
    ap.add_argument("--eval-episodes", type=int, default=50, help="held-out evaluation seeds (from 100000)")
    ap.add_argument("--seeds", default="0", help="comma list of training seeds")
    ap.add_argument("--out", default=str(ROOT / "outputs" / "qvgm"))
    ap.add_argument("--loop-args", default="", help="extra options for policylink finetune loop")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    demos = out / f"{args.env}_demos{args.demos}.zarr"
    commands: list[str] = []
    t0 = time.perf_counter()
    if not demos.exists():
        _run(commands, POLICYLINK, "record", "--env", args.env, "--expert", "expert", "--episodes", str(args.demos),
             "--seed", "0", "--out", str(demos))  # fmt: skip
    summaries = []
    for seed in [int(s) for s in args.seeds.split(",")]:
        base = out / f"base_s{seed}"
        if not (base / "checkpoints" / "last").exists():
            config = f"configs/train/flow_{args.env}_state_fast.yaml"
            _run(commands, POLICYLINK, "train", "--config", config, "--dataset.path", str(demos),
                 "--policy.n_action_steps", str(args.action_steps), "--steps", str(args.base_steps),
                 "--output_dir", str(base), "--progress", "false", "--seed", str(seed))  # fmt: skip
        loop = out / f"loop_s{seed}"
        _run(commands, POLICYLINK, "finetune", "loop", "--policy", str(base / "checkpoints" / "last"), "--env",
             args.env, "--rounds", str(args.rounds), "--episodes", str(args.episodes), "--eval_episodes",
             str(args.eval_episodes), "--out", str(loop), "--baselines", "rerank,bc", "--qvgm.seed", str(seed),
             "--critic.seed", str(seed), *args.loop_args.split())  # fmt: skip
        rows = json.loads((loop / "rounds.json").read_text())
        rank = critic_ranking(loop, str(base / "checkpoints" / "last"), args.env, args.eval_episodes, args.rounds)
        summaries.append({"seed": seed, "rows": rows, "spearman": rank})
    _write(args, commands, summaries, time.perf_counter() - t0)
    return 0


def critic_ranking(loop: Path, base: str, env: str, episodes: int, rounds: int) -> dict[int, float]:
    """Spearman correlation of each round's critic ``Q(s_t, A_t)`` (mean of heads) with the realised discounted
    return from ``t`` to the episode's end, over every window of held-out rollouts of the base policy (seeds
    200000...), recorded once into ``loop/heldout.zarr``."""
    import torch
    from scipy.stats import spearmanr

    from policylink.data.buffer import EpisodeStore
    from policylink.policies.checkpoint import load_components
    from policylink.policies.critics import ChunkCritic
    from policylink.policies.finetune.transitions import build_transitions
    from policylink.train.loop import LoopConfig, _record

    heldout = loop / "heldout.zarr"
    if not heldout.exists():
        _record(LoopConfig(policy=base, env=env, episodes=episodes), base, str(heldout), 200_000, {})
    _, _, model, processors = load_components(base)
    out = {}
    for r in range(1, rounds + 1):
        critic = ChunkCritic.load(loop / f"round_{r:02d}" / "critic")
        cache = build_transitions(heldout, model, processors, critic.cfg.horizon, critic.cfg.gamma)
        with EpisodeStore(heldout, "r") as s:
            rewards, ends = s.array("reward")[:], s.episode_ends
        go = _return_to_go(rewards, ends, critic.cfg.gamma)
        starts = np.concatenate([[0], ends[:-1]])
        g = go[starts[cache.episode.numpy()] + cache.step.numpy()]
        with torch.no_grad():
            q = critic.actor_q(cache.state, cache.action).numpy()
        out[r] = float(spearmanr(q, g).statistic)
    return out


def _return_to_go(rewards: np.ndarray, ends: np.ndarray, gamma: float) -> np.ndarray:
    go = np.zeros(len(rewards), np.float64)
    start = 0
    for end in ends:
        acc = 0.0
        for i in range(int(end) - 1, start - 1, -1):
            acc = float(rewards[i]) + gamma * acc
            go[i] = acc
        start = int(end)
    return go


def _run(commands: list[str], *cmd: str) -> None:
    line = " ".join(cmd).replace(str(ROOT) + "/", "")
    commands.append(line)
    print("+", line, flush=True)
    env = {**os.environ, "MUJOCO_GL": os.environ.get("MUJOCO_GL", "egl"), "OMP_NUM_THREADS": "1"}
    subprocess.run(cmd, check=True, cwd=ROOT, env=env)


def _write(args, commands, summaries, wall_s) -> None:
    lines = [
        f"\n## {args.env} (state), {datetime.date.today()}: {len(summaries)} training seed(s), {args.rounds} rounds x "
        f"{args.episodes} rollouts, {args.eval_episodes} held-out seeds",
        "",
        f"Machine: {platform.machine()} {os.cpu_count()}-core CPU shared with other jobs (loaded); wall time "
        f"{wall_s / 60:.1f} min. Commands:",
        "",
        "```",
        *commands,
        "```",
        "",
        "| seed | round | method | success (held-out) | success of the round's recorded rollouts |",
        "|---|---|---|---|---|",
    ]
    for s in summaries:
        for r in s["rows"]:
            b = r.get("buffer_success")
            lines.append(f"| {s['seed']} | {r['round']} | {r['method']} | {r['success']:.0%} | "
                         f"{'' if b is None else f'{b:.0%}'} |")  # fmt: skip
    lines += ["", "Critic ranking (Spearman of Q with the realised discounted return, held-out base rollouts):", ""]
    for s in summaries:
        lines.append(f"- seed {s['seed']}: " + ", ".join(f"round {r}: {v:.2f}" for r, v in s["spearman"].items()))
    with RESULTS.open("a") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
