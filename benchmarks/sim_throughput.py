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
Vectorised table (state, image, and state with each action repeated 8 times: the heavy case): total env steps/s
(sub-envs / median vector-step time) of one loop run on 1 plain env, a ``SyncVectorEnv``, an ``AsyncVectorEnv`` and
a ``ThreadVectorEnv`` of ``--vector-envs`` sub-envs in interleaved rounds, each vector env's fixed cost per step
(the same vector env over :class:`NullEnv` sub-envs: the task's observation and info, no physics), the parallelism
the machine gave 2 processes of bare physics in the same round (the ceiling of async / 1 env), and the load average
at each round.
"""

from __future__ import annotations

import argparse
import datetime
import json
import multiprocessing
import os
import platform
import sys
import time

import gymnasium as gym
import mujoco
import numpy as np

from policylink.adapters.registry import make_env
from policylink.runtime.vector_env import make_vector_env

TASKS = ("reach", "push", "pick_place", "insert", "multitask")


def time_env(env, steps: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Seconds inside ``env.step`` for each of ``steps`` random-action steps, and seconds of bare ``mj_step``
    doing the same physics, interleaved step by step (both see the same machine load): two float64 ``(steps,)``,
    and which went first, bool ``(steps,)`` (True: the env).

    Before each env step the physics state is copied to a shadow ``MjData`` (untimed); the shadow gets the
    controls of this step and runs ``mj_step(nstep=n_substeps)`` (timed). The order alternates: whichever runs
    second replays the same physics right after the first (primed caches and branch predictors), which favours
    it; on even steps the env goes first (the shadow then takes the controls the env wrote), on odd steps the raw
    step does, with the controls the env's own action path computes beforehand (untimed; checked equal to what
    the step then writes). Resets are untimed.
    """
    rng = np.random.default_rng(seed)
    low, high = env.action_space.low, env.action_space.high
    actions = rng.uniform(low, high, (steps, len(low))).astype(np.float32)
    spec = mujoco.mjtState.mjSTATE_INTEGRATION
    state = np.empty(mujoco.mj_stateSize(env.model, spec))
    shadow = mujoco.MjData(env.model)
    env.reset(seed=seed)
    env_times, raw_times, env_first = np.empty(steps), np.empty(steps), np.arange(steps) % 2 == 0
    for i, a in enumerate(actions):
        if not env_first[i]:
            env._apply_action(env._clipped_action(a))  # the controls this step will write (a pure function of state)
            controls = env.data.ctrl.copy()
        mujoco.mj_getState(env.model, env.data, state, spec)
        mujoco.mj_setState(env.model, shadow, state, spec)
        if env_first[i]:
            t0 = time.perf_counter()
            _, _, terminated, truncated, _ = env.step(a)
            t1 = time.perf_counter()
            shadow.ctrl[:] = env.data.ctrl
            mujoco.mj_step(env.model, shadow, nstep=env.n_substeps)
            t2 = time.perf_counter()
            env_times[i], raw_times[i] = t1 - t0, t2 - t1
        else:
            shadow.ctrl[:] = controls
            t0 = time.perf_counter()
            mujoco.mj_step(env.model, shadow, nstep=env.n_substeps)
            t1 = time.perf_counter()
            _, _, terminated, truncated, _ = env.step(a)
            t2 = time.perf_counter()
            env_times[i], raw_times[i] = t2 - t1, t1 - t0
            if not np.array_equal(env.data.ctrl, controls):
                raise RuntimeError(f"{env.name}: step {i} wrote other controls than its action path computed")
        if terminated or truncated:
            env.reset()
    return env_times, raw_times, env_first


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


def time_loop(env, steps: int, batch: int | None) -> np.ndarray:
    """Seconds of each of ``steps`` random-action ``env.step`` calls, float64 ``(steps,)``: a plain env
    (``batch=None``; resets when an episode ends, untimed) or a vector env of ``batch`` sub-envs (SAME_STEP autoreset
    inside ``step``: a step that ends an episode includes its reset, an outlier the median ignores)."""
    rng = np.random.default_rng(0)
    space = env.action_space if batch is None else env.single_action_space
    shape = space.shape if batch is None else (batch, *space.shape)
    actions = rng.uniform(space.low, space.high, (steps, *shape)).astype(np.float32)
    times = np.empty(steps)
    for i, a in enumerate(actions):
        t0 = time.perf_counter()
        out = env.step(a)
        times[i] = time.perf_counter() - t0
        if batch is None and (out[2] or out[3]):
            env.reset()
    return times


class NullEnv(gym.Env):
    """A task's spaces, observation and info with no physics and no rendering: ``step`` returns the reset's
    observation again (truncating at ``max_episode_steps``). Vector envs of it measure their own fixed cost per
    step (dispatch, pipes, pickling, batching, info merging)."""

    def __init__(self, name: str, obs_mode: str):
        env = make_env(name, obs_mode=obs_mode)
        self.observation_space, self.action_space = env.observation_space, env.action_space
        self._obs, self._info = env.reset(seed=0)
        self._max_steps, self._t = env.max_episode_steps, 0
        env.close()

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        """The stored reset observation and info."""
        self._t = 0
        return self._obs, dict(self._info)

    def step(self, action):
        """The stored observation, reward 0, not terminated, truncated at the task's episode length."""
        self._t += 1
        return self._obs, 0.0, False, self._t >= self._max_steps, dict(self._info)


class _NullEnvFn:
    """Picklable ``() -> NullEnv`` (AsyncVectorEnv builds it in the worker)."""

    def __init__(self, name: str, obs_mode: str):
        self.name, self.obs_mode = name, obs_mode

    def __call__(self) -> NullEnv:
        return NullEnv(self.name, self.obs_mode)


def _raw_physics_worker(name: str, seconds: float, parties: int) -> int:
    """Child process: bare ``mj_step(nstep=n_substeps)`` of ``name``'s model (no Python per step, no IPC) for
    ``seconds`` of wall clock, started together with its ``parties - 1`` siblings; returns the control steps done."""
    env = make_env(name)
    env.reset(seed=0)
    model, data, n = env.model, env.data, env.n_substeps
    _BARRIERS[parties].wait()
    count, end = 0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        mujoco.mj_step(model, data, nstep=n)
        count += 1
    return count


def cpu_scaling(pool, name: str, seconds: float = 0.3) -> float:
    """The parallelism this machine gives two processes right now: raw-physics steps of 2 processes running at
    once for ``seconds`` / those of 1 process alone for as long (2.0 = two free cores; ~1.0 = one core's worth,
    e.g. a box shared with other work). The ceiling of what ``AsyncVectorEnv`` with 2 sub-envs gains over 1 env."""
    (one,) = pool.starmap(_raw_physics_worker, [(name, seconds, 1)])
    two = pool.starmap(_raw_physics_worker, [(name, seconds, 2)] * 2)  # the barrier makes it one task per worker
    return sum(two) / one


def vector_rows(name: str, mode: str, n: int, steps: int, rounds: int, pool) -> dict:
    """1 env, ``SyncVectorEnv``, ``AsyncVectorEnv`` and :class:`ThreadVectorEnv` of ``n`` sub-envs (total steps/s =
    ``n`` / median vector-step time), the vector envs' fixed cost per step (median step time over :class:`NullEnv`
    sub-envs, seconds), the 2-process CPU scaling and the 1-minute load average, measured in ``rounds`` interleaved
    rounds (each sees the same machine load); returns the per-round values of each. ``mode``: an obs mode, or
    ``<obs mode>x<k>`` for the heavy case (each control step repeated ``k`` times: :class:`RepeatAction`)."""
    obs_mode, _, repeat = mode.partition("x")
    fn = RepeatedEnvFn(name, obs_mode, int(repeat or 1))
    null = _NullEnvFn(name, obs_mode)
    envs = {
        "one": fn(),
        "sync": make_vector_env(fn, n),
        "async": make_vector_env(fn, n, asynchronous=True),
        "threads": make_vector_env(fn, n, threads=True),
        "sync_fixed_cost_s": make_vector_env(null, n),
        "async_fixed_cost_s": make_vector_env(null, n, asynchronous=True),
        "threads_fixed_cost_s": make_vector_env(null, n, threads=True),
    }
    timed = ("one", "sync", "async", "threads")
    extra = [f"{k}_{s}" for k in timed for s in ("wall", "cpu_us", "wait_us")]
    runs: dict[str, list[float]] = {k: [] for k in (*envs, *extra, "cpu_scaling", "load")}
    try:
        for key, env in envs.items():
            env.reset(seed=0)
            time_loop(env, 5, None if key == "one" else n)  # warm-up (first frames, worker start)
        for _ in range(rounds):
            runs["load"].append(os.getloadavg()[0])
            for key, env in envs.items():
                pids = [os.getpid(), *(p.pid for p in getattr(env, "processes", ()))]  # async: + its workers
                cpu0, wait0 = schedstat(pids)
                times = time_loop(env, steps, None if key == "one" else n)
                cpu1, wait1 = schedstat(pids)
                batch = 1 if key == "one" else n
                if key.endswith("_fixed_cost_s"):
                    runs[key].append(float(np.median(times)))
                else:
                    runs[key].append(batch / float(np.median(times)))
                    runs[f"{key}_wall"].append(batch * steps / float(times.sum()))
                    runs[f"{key}_cpu_us"].append((cpu1 - cpu0) / 1e3 / (batch * steps))
                    runs[f"{key}_wait_us"].append((wait1 - wait0) / 1e3 / (batch * steps))
            runs["cpu_scaling"].append(cpu_scaling(pool, name))
    finally:
        for env in envs.values():
            env.close()
    return runs


def schedstat(pids: list[int]) -> tuple[int, int]:
    """Nanoseconds every thread of processes ``pids`` has run on a CPU and waited in a run queue (ready, no CPU
    free) so far (Linux ``/proc/<pid>/task/<tid>/schedstat``); ``(0, 0)`` where it cannot be read."""
    cpu = wait = 0
    for pid in pids:
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                    run, queued, _ = f.read().split()
            except (OSError, ValueError):
                continue
            cpu, wait = cpu + int(run), wait + int(queued)
    return cpu, wait


class RepeatAction(gym.Wrapper):
    """The heavy-work case of the vectorised table: each ``step`` applies its action ``repeat`` times (frame skip:
    ``repeat`` x the physics and Python of one control step; the reward is the last step's; stops early at an
    episode's end). Benchmark only."""

    def __init__(self, env: gym.Env, repeat: int):
        super().__init__(env)
        self.repeat = int(repeat)

    def step(self, action):
        """``repeat`` control steps with ``action``; the last one's result."""
        for _ in range(self.repeat):
            out = self.env.step(action)
            if out[2] or out[3]:
                break
        return out


class RepeatedEnvFn:
    """Picklable ``() -> env`` of task ``name`` (``obs_mode``), wrapped in :class:`RepeatAction` when ``repeat``
    > 1."""

    def __init__(self, name: str, obs_mode: str, repeat: int = 1):
        self.name, self.obs_mode, self.repeat = name, obs_mode, int(repeat)

    def __call__(self) -> gym.Env:
        env = make_env(self.name, obs_mode=self.obs_mode)
        return RepeatAction(env, self.repeat) if self.repeat > 1 else env


def overhead_row(name: str, steps: int, image_steps: int, repeats: int) -> dict:
    """One task's single-env numbers: raw and env (state) steps/s (1 / median step time, best of ``repeats``
    paired runs), the adapter overhead (median over runs of the median paired ratio, both orders; and of the
    env-first and raw-first steps alone) and the image env's steps/s."""
    env = make_env(name)
    raw, wrapped, overheads, env_first, raw_first = [], [], [], [], []
    for r in range(repeats):
        env_s, raw_s, first = time_env(env, steps, seed=r)
        wrapped.append(float(np.median(env_s)))
        raw.append(float(np.median(raw_s)))
        overheads.append(step_overhead(env_s, raw_s))
        env_first.append(step_overhead(env_s[first], raw_s[first]))
        raw_first.append(step_overhead(env_s[~first], raw_s[~first]))
    img_env = make_env(name, obs_mode="image")
    img_sps = 1.0 / float(np.median(time_env(img_env, image_steps)[0]))
    img_env.close()
    env.close()
    return {
        "substeps": env.n_substeps,
        "raw_steps_per_s": 1.0 / min(raw),
        "env_steps_per_s": 1.0 / min(wrapped),
        "overhead": float(np.median(overheads)),
        "overhead_runs": overheads,
        "overhead_env_first": float(np.median(env_first)),
        "overhead_env_first_runs": env_first,
        "overhead_raw_first": float(np.median(raw_first)),
        "overhead_raw_first_runs": raw_first,
        "image_steps_per_s": img_sps,
    }


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark, print the tables and optionally write them as markdown (+ the numbers as JSON next to
    it, same name with ``.json``). Returns 0."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", default=",".join(TASKS), help="comma-separated env names")
    parser.add_argument("--steps", type=int, default=2000, help="control steps per timed run")
    parser.add_argument("--image-steps", type=int, default=500, help="control steps of the rendering run")
    parser.add_argument("--repeats", type=int, default=3, help="paired raw/env runs (overhead: their median)")
    parser.add_argument("--vector-envs", type=int, default=2, help="sub-envs in the vectorised rows (0 skips)")
    parser.add_argument("--vector-rounds", type=int, default=5, help="interleaved rounds of the vectorised rows")
    parser.add_argument(
        "--vector-modes",
        default="state,image,statex8",
        help="obs modes of the vectorised rows (<mode>x<k>: each step repeated k times)",
    )
    parser.add_argument("--out", default=None, help="markdown file to write (and its .json)")
    args = parser.parse_args(argv)
    load_start = os.getloadavg()[0]
    rows, vec = {}, {}
    for name in args.tasks.split(","):
        rows[name] = overhead_row(name, args.steps, args.image_steps, args.repeats)
        print(_overhead_line(name, rows[name]), flush=True)
    if args.vector_envs:
        ctx = multiprocessing.get_context("forkserver")  # no fork: a parent holding an EGL context hangs children
        barriers = {k: ctx.Barrier(k) for k in (1, 2)}
        with ctx.Pool(2, initializer=_set_barriers, initargs=(barriers,)) as pool:
            for name in args.tasks.split(","):
                for mode in args.vector_modes.split(","):
                    obs_mode, _, repeat = mode.partition("x")
                    base = (args.steps if obs_mode == "state" else args.image_steps) // 4
                    steps = base // max(1, int(repeat or 1) // 4)
                    runs = vector_rows(name, mode, args.vector_envs, steps, args.vector_rounds, pool)
                    vec[f"{name}/{mode}"] = runs
                    print(_vector_line(name, mode, runs), flush=True)
    load = f"load average {load_start:.1f} at start, {os.getloadavg()[0]:.1f} at end ({os.cpu_count()} CPUs)"
    tables = _tables(rows, vec, args.vector_envs)
    print(tables)
    if args.out:
        cmd = "MUJOCO_GL=egl .venv/bin/python benchmarks/sim_throughput.py " + " ".join(sys.argv[1:])
        _write(args, cmd, load, tables, rows, vec)
    return 0


_BARRIERS: dict = {}


def _set_barriers(barriers: dict) -> None:
    """Pool initializer: the start barriers (1 and 2 parties) reach the workers by inheritance, as they must."""
    _BARRIERS.update(barriers)


def _overhead_line(name: str, r: dict) -> str:
    return (
        f"| {name} | {r['substeps']} | {r['raw_steps_per_s']:,.0f} | {r['env_steps_per_s']:,.0f} | "
        f"{r['overhead'] * 100:+.1f}% | {r['overhead_env_first'] * 100:+.1f}% / "
        f"{r['overhead_raw_first'] * 100:+.1f}% | "
        f"{r['image_steps_per_s']:,.0f} |"
    )


def _vector_line(name: str, mode: str, runs: dict) -> str:
    m = {k: float(np.median(v)) for k, v in runs.items()}

    def ratio(a: str, b: str) -> str:  # median over rounds of the ratio within each round (same load)
        return f"{float(np.median(np.array(runs[a]) / np.array(runs[b]))):.2f}x"

    us = " / ".join(f"{m[f'{k}_fixed_cost_s'] * 1e6:,.0f}" for k in ("sync", "async", "threads"))
    cpu = " / ".join(f"{m[f'{k}_cpu_us']:,.0f}" for k in ("one", "sync", "async", "threads"))
    wait = " / ".join(f"{m[f'{k}_wait_us']:,.0f}" for k in ("one", "sync", "async", "threads"))
    return (
        f"| {name} | {mode} | {m['one']:,.0f} | {m['sync']:,.0f} | {m['async']:,.0f} | {m['threads']:,.0f} | "
        f"{ratio('sync', 'one')} | {ratio('async', 'one')} | {ratio('threads', 'one')} | {ratio('async', 'sync')} | "
        f"{ratio('threads', 'sync')} | {us} us | {cpu} | {wait} | {m['cpu_scaling']:.2f}x | "
        f"{min(runs['load']):.1f}-{max(runs['load']):.1f} |"
    )


def _tables(rows: dict, vec: dict, n: int) -> str:
    lines = [
        "| task | substeps | raw mj_step steps/s | env steps/s (state) | adapter overhead | "
        "env first / raw first | env steps/s (96x96 image) |",
        "|---|---|---|---|---|---|---|",
        *(_overhead_line(name, r) for name, r in rows.items()),
    ]
    if vec:
        lines += [
            "",
            f"| task | obs | 1 env steps/s | sync {n}, total steps/s | async {n}, total steps/s | threads {n}, total "
            "steps/s | sync / 1 | async / 1 | threads / 1 | async / sync | threads / sync | fixed cost / step (sync / "
            "async / threads) | CPU us / env step (1 / sync / async / threads) | run-queue wait us / env step | "
            "2-process CPU scaling | load average |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
            *(_vector_line(*key.split("/"), runs) for key, runs in vec.items()),
        ]
    return "\n".join(lines)


def _write(args, cmd: str, load: str, tables: str, rows: dict, vec: dict) -> None:
    """The markdown report at ``args.out`` and every number (per run, per round) in its ``.json`` twin."""
    with open(args.out, "w") as f:
        f.write(
            "# MuJoCo task throughput\n\n"
            f"Command: `{cmd}`\n\nMachine: {cpu_model()}, MuJoCo {mujoco.__version__}, no GPU (Mesa "
            f"llvmpipe EGL rendering); {load}. Date: {datetime.date.today().isoformat()}.\n\n"
            "Control steps are 0.1 s (10 Hz); `substeps` physics steps each. Adapter overhead = time in "
            "`env.step` / time in raw `mj_step(nstep=substeps)` on the same model and state, minus 1: the "
            f"median over steps of the paired per-step ratio, median of {args.repeats} runs of {args.steps} "
            "steps; the order alternates step by step (the second replays the first's physics with primed caches: "
            "'env first / raw first' = the same statistic over each half alone); steps/s columns = 1 / median "
            "per-step time (best run).\n\n"
            f"Vectorised table: the same loop (random actions) over 1 plain env, a `SyncVectorEnv`, an "
            f"`AsyncVectorEnv` and a `ThreadVectorEnv` of {args.vector_envs} sub-envs (the project's "
            "`make_vector_env`: SAME_STEP autoreset; async = one forkserver process per sub-env, pipes; threads = one "
            "thread per sub-env in this process, `runtime/thread_vector_env.py`); obs `statex8` = the state env with "
            "each step's action applied 8 times (`RepeatAction`: 8x the work per step, the heavy case). Total env "
            "steps/s = sub-envs / median vector-step time (the statistic of the table above: a step preempted by "
            f"another process is one outlier); ratios = median over {args.vector_rounds} interleaved rounds "
            f"({args.steps // 4} state, {args.steps // 8} statex8 or {args.image_steps // 4} image steps each) of the "
            "ratio within the round; load average = the 1-minute load at the start of each round (min-max). CPU us / "
            "env step = CPU time of every thread of the benchmark process and (async) its workers during the timed "
            "loop / env steps done (Linux schedstat; the work a step costs, whatever the load); run-queue wait = time "
            "those threads were ready to run but had no CPU, per env step (what the shared machine adds). Fixed "
            "cost / step = median step time of the same vector "
            "env over sub-envs that return the task's observation and info without physics or rendering "
            "(`NullEnv`). 2-process CPU scaling = raw `mj_step` steps of 2 processes running at once for 0.3 s / of 1 "
            "process alone for 0.3 s, in each round: the parallelism the machine offered "
            "(the ceiling of async / 1).\n\n" + tables + "\n"
        )
    meta = {"command": cmd, "cpu": cpu_model(), "cpus": os.cpu_count(), "mujoco": mujoco.__version__, "load": load}
    with open(os.path.splitext(args.out)[0] + ".json", "w") as f:
        json.dump(
            {"machine": meta, "date": datetime.date.today().isoformat(), "tasks": rows, "vector": vec}, f, indent=1
        )


if __name__ == "__main__":
    raise SystemExit(main())
