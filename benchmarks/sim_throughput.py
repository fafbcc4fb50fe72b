"""Control steps per second of the MuJoCo tasks, with and without rendering, and the adapter's overhead over
raw ``mujoco.mj_step`` on the same model in the same run.

Usage::

    MUJOCO_GL=egl .venv/bin/python benchmarks/sim_throughput.py --steps 2000 \
        --out benchmarks/results/sim_throughput.md

For each task: *env* = ``env.step(action)`` with random actions (``obs_mode="state"``, resets at episode
ends, excluded from the timing); *raw* = bare ``mj_step(model, data, nstep=n_substeps)`` redoing exactly the
physics of each env step (same model, state and actuator controls) on a shadow ``MjData``, interleaved step by
step so both see the same machine load; overhead = median over ``--repeats`` runs of env time / raw time - 1.
*image* = the env with one 96x96 camera (``obs_mode="image"``, fast rendering).
Vectorised rows: ``SyncVectorEnv`` and ``AsyncVectorEnv`` (state), total env steps/s.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
import time

import mujoco
import numpy as np

from policylink.adapters.registry import make_env
from policylink.runtime.rollout import RegistryEnvFn, make_vector_env

TASKS = ("reach", "push", "pick_place", "insert", "multitask")


def time_env(env, steps: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Seconds inside ``env.step`` for each of ``steps`` random-action steps, and seconds of bare ``mj_step``
    doing the same physics, interleaved step by step (both see the same machine load): two float64 ``(steps,)``.

    Before each env step the physics state is copied to a shadow ``MjData`` (untimed); after it, the shadow
    gets the controls the env wrote and runs ``mj_step(nstep=n_substeps)`` (timed). Resets are untimed.
    """
    rng = np.random.default_rng(seed)
    low, high = env.action_space.low, env.action_space.high
    actions = rng.uniform(low, high, (steps, len(low))).astype(np.float32)
    spec = mujoco.mjtState.mjSTATE_INTEGRATION
    state = np.empty(mujoco.mj_stateSize(env.model, spec))
    shadow = mujoco.MjData(env.model)
    env.reset(seed=seed)
    env_times, raw_times = np.empty(steps), np.empty(steps)
    for i, a in enumerate(actions):
        mujoco.mj_getState(env.model, env.data, state, spec)
        mujoco.mj_setState(env.model, shadow, state, spec)
        t0 = time.perf_counter()
        _, _, terminated, truncated, _ = env.step(a)
        t1 = time.perf_counter()
        shadow.ctrl[:] = env.data.ctrl
        mujoco.mj_step(env.model, shadow, nstep=env.n_substeps)
        t2 = time.perf_counter()
        env_times[i], raw_times[i] = t1 - t0, t2 - t1
        if terminated or truncated:
            env.reset()
    return env_times, raw_times


def step_overhead(env_times: np.ndarray, raw_times: np.ndarray) -> float:
    """Median over steps of ``env / raw - 1`` (paired per step: a step preempted by another process on a
    shared machine is one outlier, not a shift of a sum)."""
    return float(np.median(env_times / raw_times)) - 1.0


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``; ``platform.processor()`` elsewhere)."""
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or "unknown CPU"


def time_vector(name: str, n: int, asynchronous: bool, steps: int) -> float:
    """Total env steps per second of ``n`` sub-envs stepping ``steps`` times together."""
    venv = make_vector_env(RegistryEnvFn(name), n, asynchronous=asynchronous)
    try:
        venv.reset(seed=0)
        rng = np.random.default_rng(0)
        low, high = venv.single_action_space.low, venv.single_action_space.high
        t0 = time.perf_counter()
        for _ in range(steps):
            venv.step(rng.uniform(low, high, (n, len(low))).astype(np.float32))
        return n * steps / (time.perf_counter() - t0)
    finally:
        venv.close()


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark, print the table and optionally write it as markdown. Returns 0."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", default=",".join(TASKS), help="comma-separated env names")
    parser.add_argument("--steps", type=int, default=2000, help="control steps per timed run")
    parser.add_argument("--image-steps", type=int, default=500, help="control steps of the rendering run")
    parser.add_argument("--repeats", type=int, default=3, help="alternating raw/env repetitions (best kept)")
    parser.add_argument("--vector-envs", type=int, default=2, help="sub-envs in the vectorised rows (0 skips)")
    parser.add_argument("--out", default=None, help="markdown file to write")
    args = parser.parse_args(argv)
    load_start = os.getloadavg()[0]
    lines = [
        "| task | substeps | raw mj_step steps/s | env steps/s (state) | adapter overhead | "
        "env steps/s (96x96 image) | sync vec steps/s | async vec steps/s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name in args.tasks.split(","):
        env = make_env(name)
        raw, wrapped, overheads = [], [], []
        for r in range(args.repeats):
            env_s, raw_s = time_env(env, args.steps, seed=r)
            wrapped.append(np.median(env_s))
            raw.append(np.median(raw_s))
            overheads.append(step_overhead(env_s, raw_s))
        raw_sps, env_sps = 1.0 / min(raw), 1.0 / min(wrapped)
        overhead = float(np.median(overheads))
        img_env = make_env(name, obs_mode="image")
        img_sps = 1.0 / float(np.median(time_env(img_env, args.image_steps)[0]))
        img_env.close()
        sync = time_vector(name, args.vector_envs, False, args.steps // 4) if args.vector_envs else float("nan")
        asyn = time_vector(name, args.vector_envs, True, args.steps // 4) if args.vector_envs else float("nan")
        lines.append(
            f"| {name} | {env.n_substeps} | {raw_sps:,.0f} | {env_sps:,.0f} | {overhead * 100:+.1f}% | "
            f"{img_sps:,.0f} | {sync:,.0f} | {asyn:,.0f} |"
        )
        print(lines[-1], flush=True)
        env.close()
    table = "\n".join(lines)
    print(table)
    load = f"load average {load_start:.1f} at start, {os.getloadavg()[0]:.1f} at end ({os.cpu_count()} CPUs)"
    if args.out:
        cmd = "MUJOCO_GL=egl .venv/bin/python benchmarks/sim_throughput.py " + " ".join(sys.argv[1:])
        with open(args.out, "w") as f:
            f.write(
                "# MuJoCo task throughput\n\n"
                f"Command: `{cmd}`\n\nMachine: {cpu_model()}, MuJoCo {mujoco.__version__}, no GPU (Mesa "
                f"llvmpipe EGL rendering); {load}. Date: {datetime.date.today().isoformat()}.\n\n"
                "Control steps are 0.1 s (10 Hz); `substeps` physics steps each. Adapter overhead = time in "
                "`env.step` / time in raw `mj_step(nstep=substeps)` on the same model and state, minus 1: the "
                f"median over steps of the paired per-step ratio, median of {args.repeats} runs of {args.steps} "
                "steps; steps/s columns = 1 / median per-step time (best run). Vectorised columns: "
                f"{args.vector_envs} sub-envs, total steps/s.\n\n" + table + "\n"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
