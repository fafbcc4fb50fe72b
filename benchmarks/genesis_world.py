"""genesis-world backend: scene build time (cold and warm kernel cache), control steps/s against the same MuJoCo
task in the same run, and scripted-expert success on both backends over the same seeds.

Usage::

    MUJOCO_GL=egl .venv/bin/python benchmarks/genesis_world.py --seeds 100 --out benchmarks/results/genesis.md

The cold build runs in a subprocess whose ``HOME`` is an empty temporary folder (Genesis/Quadrants keep their
kernel cache in ``~/.cache``); the warm build runs in a second subprocess with the real cache, after a first one
has filled it. ``--no-cold`` skips the cold build (about 2-3 minutes on a 2-core CPU). (The script is not called
``genesis.py``: run as a script, its folder comes first on ``sys.path`` and it would shadow the package.)
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
from tqdm import tqdm

from policylink.adapters.registry import make_env
from policylink.evaluate.report import wilson_interval
from policylink.sim.experts import make_expert

PAIRS = (("genesis_reach", "reach"), ("genesis_pick_place", "pick_place"))
_BUILD_SCRIPT = (
    "import json, time; t = time.perf_counter(); "
    "from policylink.sim.genesis.scene import GantryScene; s = GantryScene(); "
    "print(json.dumps({'build_s': s.build_seconds, 'process_s': time.perf_counter() - t}))"
)


def build_in_subprocess(home: str | None) -> dict[str, float]:
    """Time ``GantryScene()`` in a fresh interpreter (``home`` replaces ``HOME`` when given). Returns seconds."""
    env = dict(os.environ)
    if home is not None:
        env["HOME"] = home
        env.pop("XDG_CACHE_HOME", None)
    out = subprocess.run([sys.executable, "-c", _BUILD_SCRIPT], env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def steps_per_second(env, actions: np.ndarray, seed: int) -> float:
    """Control steps per second of ``env`` over ``actions`` ``(T, A)`` from ``reset(seed)`` (resetting at ends)."""
    env.reset(seed=seed)
    t0 = time.perf_counter()
    for a in actions:
        _, _, terminated, truncated, _ = env.step(a)
        if terminated or truncated:
            env.reset()
    return len(actions) / (time.perf_counter() - t0)


def expert_success(env, seeds: int, label: str) -> tuple[int, float]:
    """Successes of the scripted expert over seeds ``0 .. seeds-1`` and the mean episode length (steps)."""
    wins, lengths = 0, []
    for seed in tqdm(range(seeds), desc=label, leave=False):
        expert = make_expert(env, seed=seed)
        obs, _ = env.reset(seed=seed)
        expert.reset(seed)
        steps, done = 0, False
        while not done:
            obs, _, terminated, truncated, info = env.step(expert.act(obs, env))
            steps, done = steps + 1, terminated or truncated
        wins += bool(info["is_success"])
        lengths.append(steps)
    return wins, float(np.mean(lengths))


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and write the markdown report. Returns 0."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=100, help="expert episodes per env and backend")
    parser.add_argument("--steps", type=int, default=300, help="random-action control steps for the steps/s rows")
    parser.add_argument("--no-cold", action="store_true", help="skip the cold-cache build (2-3 min)")
    parser.add_argument("--out", default="benchmarks/results/genesis.md", help="markdown report path")
    args = parser.parse_args(argv)
    given = sys.argv[1:] if argv is None else argv
    command = "MUJOCO_GL=egl .venv/bin/python benchmarks/genesis_world.py " + " ".join(given)

    builds = {}
    if not args.no_cold:
        with tempfile.TemporaryDirectory() as home:
            builds["cold (empty kernel cache)"] = build_in_subprocess(home)
            print("cold build:", builds["cold (empty kernel cache)"], flush=True)
    build_in_subprocess(None)  # fill the real cache
    builds["warm (kernel cache filled)"] = build_in_subprocess(None)
    print("warm build:", builds["warm (kernel cache filled)"], flush=True)

    from policylink.sim.genesis.scene import GantryScene

    scene = GantryScene()
    rows, success_rows = [], []
    for gname, mname in PAIRS:
        genv, menv = make_env(gname, scene=scene), make_env(mname)
        rng = np.random.default_rng(0)
        actions = rng.uniform(
            genv.action_space.low, genv.action_space.high, (args.steps, genv.env_spec.action.dim)
        ).astype(np.float32)
        g_sps, m_sps = steps_per_second(genv, actions, 0), steps_per_second(menv, actions, 0)
        rows.append(
            f"| {gname} / {mname} | {g_sps:.1f} | {g_sps * scene.n_substeps:.0f} | {m_sps:.0f} | {g_sps / m_sps:.4f} |"
        )
        for env, label in ((genv, gname), (menv, mname)):
            wins, mean_len = expert_success(env, args.seeds, label)
            lo, hi = wilson_interval(wins, args.seeds)
            success_rows.append(f"| {label} | {wins}/{args.seeds} | [{lo:.2f}, {hi:.2f}] | {mean_len:.1f} |")

    lines = [
        "# genesis-world backend (genesis-world 1.4.5, `gs.cpu`)",
        "",
        f"- command: `{command}`",
        "- machine: 2-core CPU, no GPU (shared with other jobs: absolute numbers are noisy, ratios less so)",
        f"- date: {datetime.date.today().isoformat()}",
        "- scene: the MuJoCo tasks' gantry (`sim/mujoco/assets/robot_gripper.xml`) + a free 4 cm cube; one control "
        f"step = {scene.n_substeps} physics steps of {scene.substep_s} s",
        "",
        "## Scene build (`GantryScene()`, fresh interpreter)",
        "",
        "| kernel cache | `scene.build()` (s) | import + init + build (s) |",
        "|---|---|---|",
        *[f"| {k} | {v['build_s']:.1f} | {v['process_s']:.1f} |" for k, v in builds.items()],
        "",
        f"## Control steps/s ({args.steps} random actions, resets at episode ends)",
        "",
        "| env (Genesis / MuJoCo) | Genesis steps/s | Genesis physics steps/s | MuJoCo steps/s | Genesis / MuJoCo |",
        "|---|---|---|---|---|",
        *rows,
        "",
        f"## Scripted expert success (seeds 0..{args.seeds - 1}, same episodes on both backends)",
        "",
        "| env | successes | 95 % Wilson | mean episode steps |",
        "|---|---|---|---|",
        *success_rows,
        "",
    ]
    with open(args.out, "w") as f:
        f.write("\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
