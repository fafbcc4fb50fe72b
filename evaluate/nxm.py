"""N policies x M environments x seeded episodes, on a local process pool or a Ray cluster; per-cell
``eval_info.json`` in LeRobot's shape, combined tables, plots, videos and an HTML report; ``policylink eval``.

Episode ``i`` of every cell resets with seed ``seed + i`` (shared across policies, so cells are comparable).
A cell is split into shards of ``shard_episodes`` episodes; each shard is one task (a process or a Ray task)
that reseeds the policy with ``seed + first_episode``, so results depend on the config only, not on the
back-end or the number of workers.
"""

from __future__ import annotations

import json
import re
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from policylink.adapters.config_checks import require_counts
from policylink.adapters.schema import IncompatibleSpecError
from policylink.evaluate import report
from policylink.evaluate.refs import (  # noqa: F401 - ENV_PLACEHOLDER re-exported for callers
    ENV_PLACEHOLDER,
    checkpoint_env_kwargs_of,
    labelled,
    policy_ref_for,
    reference_label,
    require_policy_refs,
    unique_labels,
    warn_recorded_seed_overlap,
    with_gap,
)
from policylink.evaluate.resume import load_done, run_settings, shard_plan
from policylink.policies import load_policy
from policylink.runtime.checks import cell_problems, limit_threads
from policylink.runtime.executors import ExecutorConfig, ExecutorConfigError, make_executor
from policylink.runtime.instructions import InstructionEnvFn, instruction_problems
from policylink.runtime.rollout import (
    EpisodeResult,
    RegistryEnvFn,
    VideoSubscriber,
    env_spec_of,
    make_vector_env,
    plan_episodes,
    rollout,
)
from policylink.sim.isolated.process import EnvProcessError

EVAL_INFO = "eval_info.json"


@dataclass
class EvalConfig:
    """``policylink eval``.

    Attributes:
        policies: checkpoint folders, server addresses (``tcp://host:port``, ``xpl://host:port``) or registry
            names; ``{env}`` in a reference is replaced by each env's name (one checkpoint per env, e.g.
            ``ckpt/{env}/flow``). ``label=ref`` names a policy; otherwise a checkpoint ``<run>/checkpoints/last`` is
            labelled ``<run>`` (``<run>/checkpoints/<step>``: ``<run>_<step>``), other references by themselves.
        envs: environment registry names.
        episodes: episodes per (policy, env) cell.
        seed: episode ``i`` resets with ``seed + i`` in every cell (default 100000: away from the seeds ``record``
            uses, ``0..N-1``; a warning names any overlap with the seeds a checkpoint's demos were recorded with).
        workers: parallel tasks (processes, or Ray CPUs for a local Ray cluster); 0 runs inline.
        out: output folder (cells, tables, plots, videos, report.html).
        ray_address: ``None`` for the local process pool; ``auto``, ``local`` (start one here) or an address;
            ``workers`` then caps the Ray tasks in flight (0 = no cap).
        num_envs: vector envs in each worker's shard (one shard = a run of episodes of one (policy, env) cell).
        shard_episodes: episodes per shard (the unit of work of a worker, of resuming and of Ray tasks).
        videos: the first ``videos`` episodes of each cell are saved as mp4 (captioned with seed, step and
            outcome), plus the first failed episode of the shards holding them when none of them failed.
        device: torch device for checkpoints: ``"auto"`` (CUDA when present), ``"cpu"`` or ``"cuda[:N]"``.
        cfg_scale: classifier-free guidance weight ``w`` for every checkpoint (0 = unconditional, 1 = conditional,
            > 1 guided); None = each checkpoint's own ``policy.cfg_scale``. Only checkpoints trained with advantage
            conditioning accept ``w != 1``.
        resume: reuse the shards already written in ``out`` (a changed ``episodes`` count keeps the shards it
            still needs and runs the others; a changed ``videos`` count re-runs the shards whose videos change);
            false discards them.
        env_kwargs: keyword arguments of every env factory (``obs_mode``...; mid-episode perturbations of the MuJoCo
            tasks: ``{perturbation: {displacement: 0.03, force: 2.0}}``, fields of ``PerturbationConfig``).
        executor: chunk execution (:class:`ExecutorConfig`), including simulated latency.
        gap: a reality gap for every env, which must all be MuJoCo tasks (another env refuses the kwarg): a preset
            name (``worn_gantry``...) or a YAML file (:mod:`policylink.sim.mujoco.gap`); the same as
            ``env_kwargs: {gap: NAME}``. None: nominal sim.
        instructions: a JSON file goal key (``"red/left"``) -> list of instructions: each episode keeps the env's
            goal and tells the policy one of the file's instructions for it (:mod:`policylink.runtime.instructions`).

    Raises:
        ValueError: ``episodes``, ``num_envs`` or ``shard_episodes`` < 1, ``workers`` or ``videos`` < 0; ``gap``
            and a different ``env_kwargs`` gap.
    """

    policies: list[str] = field(default_factory=list)
    envs: list[str] = field(default_factory=list)
    episodes: int = 50
    seed: int = 100_000
    workers: int = 2
    out: str = "outputs/eval"
    ray_address: str | None = None
    num_envs: int = 1
    shard_episodes: int = 10
    videos: int = 2
    device: str = "auto"
    cfg_scale: float | None = None
    resume: bool = True
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    executor: ExecutorConfig = field(default_factory=ExecutorConfig)
    gap: str | None = None
    instructions: str | None = None

    def __post_init__(self) -> None:
        require_counts(self, episodes=1, workers=0, num_envs=1, shard_episodes=1, videos=0, seed=0)
        self.env_kwargs = with_gap(self.env_kwargs, self.gap)


@dataclass
class ShardTask:
    """One unit of work: episodes ``first .. first + count - 1`` of one cell (picklable)."""

    cell: str
    policy_ref: Any
    env_fn: Callable[[], Any]
    first: int
    count: int
    seed: int
    num_envs: int
    max_episode_steps: int
    fps: float
    executor: ExecutorConfig
    video_episodes: list[int]
    video_dir: str
    device: str
    cfg_scale: float | None = None
    env_spec: Any = None  # the cell env's EnvSpec: the spec of an xpl:// policy that advertises none


def evaluate(
    policies: Sequence[Any],
    envs: Sequence[Any],
    *,
    episodes: int = 50,
    seed: int = 100_000,
    workers: int = 2,
    out: str | Path = "outputs/eval",
    ray_address: str | None = None,
    num_envs: int = 1,
    shard_episodes: int = 10,
    videos: int = 2,
    device: str = "auto",
    cfg_scale: float | None = None,
    resume: bool = True,
    env_kwargs: dict[str, Any] | None = None,
    executor: ExecutorConfig | None = None,
    progress: bool = True,
    write_report: bool = True,
    on_mismatch: str = "error",
    instructions: str | None = None,
) -> list[dict[str, Any]]:
    """Evaluate every policy on every env and write all outputs to ``out``; returns one summary per cell.

    Args:
        policies: references (name, checkpoint folder, ``tcp://`` address) or ``(label, ref)`` pairs where
            ``ref`` may also be a zero-argument callable returning a PolicyAdapter.
        envs: env registry names, or ``(label, env_fn)`` pairs with a zero-argument callable returning an
            EnvAdapter (picklable for workers).
        on_mismatch: what to do with a cell whose saved shards came from a different configuration (seed,
            executor, env kwargs...; see :func:`.eval_resume.result_settings`): ``"error"`` (raise ValueError)
            or ``"redo"`` (discard them and evaluate the cell again).
        The other arguments are those of :class:`EvalConfig`.

    Returns:
        Cell summaries (``policy``, ``env``, ``pc_success``, ``ci95_low``, ``ci95_high``, ``avg_sum_reward``,
        ``avg_max_reward``, ``avg_steps``, ``avg_stall_steps``, ``n_episodes``, ``eval_s``), policies-major.

    Raises:
        IncompatibleSpecError: one error listing every incompatible (policy, env) cell (contract, executor
            settings, or a policy that cannot be loaded), before anything runs.
        ValueError: bad counts, two policies (or envs) with the same label, or ``out`` holds results of a
            different configuration (with ``resume`` and ``on_mismatch="error"``), or an unknown ``on_mismatch``.
    """
    if on_mismatch not in ("error", "redo"):
        raise ValueError(f"on_mismatch: expected 'error' or 'redo', received {on_mismatch!r}")
    cfg = EvalConfig(
        policies=[],
        envs=[],
        episodes=episodes,
        seed=seed,
        workers=workers,
        out=str(out),
        ray_address=ray_address,
        num_envs=num_envs,
        shard_episodes=shard_episodes,
        videos=videos,
        device=device,
        cfg_scale=cfg_scale,
        resume=resume,
        env_kwargs=dict(env_kwargs or {}),
        executor=executor or ExecutorConfig(),
        instructions=instructions,
    )
    pols, env_fns = _resolve(cfg, policies, envs)
    specs = _check_cells(pols, env_fns, cfg, isolate=cfg.ray_address is None and cfg.workers > 0)
    out = Path(cfg.out)
    settings = run_settings(cfg)
    tasks, done_shards = _plan_shards(cfg, pols, env_fns, specs, out, on_mismatch)
    bars = _bars(pols, env_fns, cfg.episodes, done_shards, progress)
    _run_and_save(tasks, cfg, settings, done_shards, bars)
    summaries = _write_cells(pols, env_fns, specs, done_shards, out, settings)
    report.write_tables(out, summaries)
    if write_report:
        report.write_report(
            out, summaries, config={**settings, "policies": [p for p, _ in pols], "envs": list(env_fns)}
        )
    return summaries


def _run_and_save(
    tasks: list, cfg: EvalConfig, settings: dict[str, Any], done_shards: dict[str, dict], bars: dict | None
) -> None:
    """Run the shard tasks; each finished shard is written to ``<out>/cells/<cell>/shards/<first>.json`` at once
    (a crash loses at most the shards in flight) and added to ``done_shards``; progress bars advance and close."""
    for task, result in _run_tasks(tasks, cfg):
        shards = Path(cfg.out) / "cells" / task.cell / "shards"
        shards.mkdir(parents=True, exist_ok=True)
        (shards / f"{task.first:06d}.json").write_text(json.dumps({"settings": settings, **result}))
        done_shards[task.cell][task.first] = result
        if bars is not None:
            bars[task.cell].update(task.count)
    for bar in (bars or {}).values():
        bar.close()


def _resolve(cfg: EvalConfig, policies: Sequence[Any], envs: Sequence[Any]) -> tuple[list, dict[str, Any]]:
    """Labelled policies and env constructors of an evaluation; fills ``cfg.env_kwargs`` from the checkpoints
    when no ``obs_mode`` is given (the keys given in ``env_kwargs`` are kept), checks the checkpoints exist and
    warns on recorded-seed overlap."""
    from policylink.adapters.registry import check_env_name

    pols = unique_labels("policies", [labelled(p) for p in policies])
    env_items = unique_labels("envs", [labelled(e) for e in envs])
    for _, ref in env_items:  # names and folders first: a typo is reported before any heavy import
        if isinstance(ref, str):
            check_env_name(ref, "envs")
    require_policy_refs(pols, [label for label, _ in env_items])
    if "obs_mode" not in cfg.env_kwargs:  # the checkpoints' obs_mode / image_size; keys the user set win
        cfg.env_kwargs = {**checkpoint_env_kwargs_of(pols, [label for label, _ in env_items]), **cfg.env_kwargs}
    warn_recorded_seed_overlap(
        [policy_ref_for(r, e) for _, r in pols if isinstance(r, str) for e, _ in env_items], cfg.seed, cfg.episodes
    )
    env_fns = {
        label: (ref if callable(ref) else RegistryEnvFn(str(ref), **_with_video_render(cfg)))
        for label, ref in env_items
    }
    if cfg.instructions:
        env_fns = {label: InstructionEnvFn(fn, cfg.instructions) for label, fn in env_fns.items()}
    return pols, env_fns


def _plan_shards(cfg: EvalConfig, pols, env_fns, specs, out: Path, on_mismatch: str):
    """``(tasks, done_shards)``: a :class:`ShardTask` per shard still to run, and each cell's saved shards."""
    tasks, done_shards = [], {}
    for p_label, p_ref in pols:
        for e_label in env_fns:
            cell = cell_name(p_label, e_label)
            cdir = out / "cells" / cell
            done_shards[cell] = load_done(cdir, cfg, on_mismatch)
            spec = specs[e_label]
            for first in range(0, cfg.episodes, cfg.shard_episodes):
                if first in done_shards[cell]:
                    continue
                count, vids = shard_plan(cfg, first)
                ref = policy_ref_for(p_ref, e_label)
                tasks.append(
                    ShardTask(
                        cell, ref, env_fns[e_label], first, count, cfg.seed, cfg.num_envs, spec.max_episode_steps,
                        spec.control_frequency, cfg.executor, vids, str(cdir / "videos"), cfg.device, cfg.cfg_scale,
                        spec,
                    )
                )  # fmt: skip
    return tasks, done_shards


def _write_cells(pols, env_fns, specs, done_shards, out: Path, settings: dict[str, Any]) -> list[dict[str, Any]]:
    """Write each cell's ``eval_info.json``; return the cell summaries, policies-major."""
    summaries = []
    for p_label, _ in pols:
        for e_label in env_fns:
            cell = cell_name(p_label, e_label)
            info = report.cell_info(p_label, e_label, specs[e_label].tasks, done_shards[cell], out, settings)
            (out / "cells" / cell / EVAL_INFO).write_text(json.dumps(info, indent=2))
            summaries.append(report.cell_summary(p_label, e_label, cell, info))
    return summaries


def cell_name(policy: str, env: str) -> str:
    """Folder name of a cell: ``<policy>__<env>`` with unsafe characters replaced by ``_``."""
    return f"{_safe(policy)}__{_safe(env)}"


def run_shard(task: ShardTask) -> dict[str, Any]:
    """Run one shard (in a worker): returns ``{"episodes": [...], "video_paths": {index: path}, "eval_s": s}``.

    The policy is loaded here and reseeded with ``task.seed + task.first`` (``reseed`` when it has one, and the
    numpy/torch global generators), so a shard's result depends only on the task.
    """
    start = time.perf_counter()
    limit_threads(1)  # parallelism comes from workers, not from oversubscribed thread pools
    shard_seed = task.seed + task.first
    policy = load_policy(task.policy_ref, task.device, shard_seed, task.cfg_scale, env_spec=task.env_spec)
    limit_threads(1)
    np.random.seed(shard_seed % 2**32)
    if "torch" in sys.modules:
        sys.modules["torch"].manual_seed(shard_seed)
    if callable(getattr(type(policy), "reseed", None)):
        policy.reseed(shard_seed)
    num_envs = min(task.num_envs, task.count)
    vec = make_vector_env(
        task.env_fn, plan_episodes(task.count, task.seed, num_envs, task.first), task.max_episode_steps
    )
    executor = make_executor(policy, task.executor)
    # a shard that films also keeps its first failed episode, so a cell's videos show a failure when it has one
    video = VideoSubscriber(task.video_episodes, task.video_dir, fps=task.fps, failures=int(bool(task.video_episodes)))
    finished: list[EpisodeResult] = []
    try:
        results = rollout(vec, executor, task.count, subscribers=[video], progress=finished.append)
    except EnvProcessError as e:  # the env's process crashed or hung: its unfinished episodes are errors, not a hang
        results = crashed_shard_results(task, finished, f"{type(e).__name__}: {e}")
    finally:
        executor.close()
        vec.close()
        close = getattr(policy, "close", None)
        if callable(close):
            close()
    videos = {str(i): str(p) for i, p in sorted(video.paths.items())}
    return {"episodes": [r.to_dict() for r in results], "video_paths": videos, "eval_s": time.perf_counter() - start}


def crashed_shard_results(task: ShardTask, finished: list[EpisodeResult], error: str) -> list[EpisodeResult]:
    """A shard's results when its env process failed: the ``finished`` episodes, then every other planned episode
    (``task.first`` .. ``task.first + task.count - 1``, seed ``task.seed + index``) as a failure carrying ``error``
    (one line: the first line of the process error), sorted by index."""
    done = {r.index for r in finished}
    line = error.splitlines()[0] if error else "env process failed"
    lost = [
        EpisodeResult(index=i, seed=task.seed + i, task="", n_steps=0, sum_reward=0.0, max_reward=0.0,
                      success=False, error=line)
        for i in range(task.first, task.first + task.count)
        if i not in done
    ]  # fmt: skip
    return sorted([*finished, *lost], key=lambda r: r.index)


def _with_video_render(cfg: EvalConfig) -> dict[str, Any]:
    """``cfg.env_kwargs`` plus ``render_mode="rgb_array"`` when videos are filmed (unless set)."""
    kw = dict(cfg.env_kwargs)
    if cfg.videos > 0:
        kw.setdefault("render_mode", "rgb_array")
    return kw


def _check_cells(pols, env_fns, cfg: EvalConfig, isolate: bool) -> dict[str, Any]:
    """EnvSpec per env label; raises one IncompatibleSpecError listing every incompatible cell.

    With ``isolate`` the envs and policies are built in a short-lived forked process, so this process never
    initialises a GL context or torch's thread pools before forking its workers (neither survives a fork).
    """
    if isolate:
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(max_workers=1, mp_context=mp.get_context("fork")) as pool:
            specs, problems = pool.submit(_probe_cells, pols, env_fns, cfg).result()
    else:
        specs, problems = _probe_cells(pols, env_fns, cfg)
    if problems:
        raise IncompatibleSpecError(problems)
    return specs


def _probe_cells(pols, env_fns, cfg: EvalConfig) -> tuple[dict[str, Any], list[str]]:
    specs = {}
    problems = []
    for label, fn in env_fns.items():
        env = fn()
        specs[label] = env_spec_of(env)
        if isinstance(fn, InstructionEnvFn):
            problems += [f"{label}: {p}" for p in instruction_problems(env, fn.table)]
        env.close()
    for p_label, ref in pols:
        loaded: dict[Any, Any] = {}
        for e_label, espec in specs.items():
            cell_ref = policy_ref_for(ref, e_label)
            key = cell_ref if isinstance(cell_ref, str) else id(cell_ref)
            if isinstance(cell_ref, str) and cell_ref.startswith("xpl://"):
                key = (cell_ref, e_label)  # its spec is the env's
            if key not in loaded:
                try:
                    policy = load_policy(cell_ref, cfg.device, cfg_scale=cfg.cfg_scale, env_spec=espec)
                except (ConnectionError, TimeoutError):
                    raise  # an unreachable server is not an incompatible cell: its own error, as it is
                except (KeyError, OSError, ValueError) as e:
                    loaded[key] = f"cannot load policy {cell_ref!r}: {e}"
                else:
                    loaded[key] = _executor_problem(policy, cfg.executor) or policy.spec
                    close = getattr(policy, "close", None)
                    if callable(close):
                        close()
            if isinstance(loaded[key], str):
                problems.append(f"{p_label} x {e_label}: {loaded[key]}")
                continue
            problems += cell_problems(p_label, loaded[key], e_label, espec, cfg.executor)
    return specs, problems


def _executor_problem(policy: Any, executor: ExecutorConfig) -> str | None:
    """Why ``executor`` cannot be built for the loaded ``policy`` (the corrective executor loads and checks its
    monitor against the policy), so a bad executor config is reported before any progress bar starts."""
    if executor.kind != "corrective":
        return None  # the other kinds depend on the spec only (executor_problems)
    try:
        make_executor(policy, executor).close()
    except ExecutorConfigError as e:
        return str(e)
    return None


def _run_tasks(tasks: list[ShardTask], cfg: EvalConfig):
    """Yield ``(task, result)`` as tasks finish (inline, process pool, or Ray)."""
    if not tasks:
        return
    if cfg.ray_address is not None:
        yield from _run_ray(tasks, cfg)
    elif cfg.workers <= 0:
        for t in tasks:
            yield t, run_shard(t)
    else:
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor, as_completed

        ctx = mp.get_context("fork")  # test doubles and registered names reach the workers as they are
        with ProcessPoolExecutor(max_workers=cfg.workers, mp_context=ctx) as pool:
            futures = {pool.submit(run_shard, t): t for t in tasks}
            for fut in as_completed(futures):
                yield futures[fut], fut.result()


def _run_ray(tasks: list[ShardTask], cfg: EvalConfig):
    """Shards as Ray tasks (1 CPU each), at most ``cfg.workers`` in flight (all at once when ``workers <= 0``)."""
    import ray

    from policylink.evaluate.ray_cluster import connect

    connect(cfg.ray_address, num_cpus=max(cfg.workers, 1))  # "local": a loopback-only cluster started here
    remote = ray.remote(num_cpus=1)(run_shard)
    limit = cfg.workers if cfg.workers > 0 else len(tasks)
    queue = list(tasks)
    pending: dict[Any, ShardTask] = {}
    while queue or pending:
        while queue and len(pending) < limit:
            t = queue.pop(0)
            pending[remote.remote(t)] = t
        ready, _ = ray.wait(list(pending), num_returns=1)
        for ref in ready:
            yield pending.pop(ref), ray.get(ref)


def _bars(pols, env_fns, episodes, done_shards, enabled):
    if not enabled:
        return None
    from tqdm.auto import tqdm

    bars = {}
    for i, cell in enumerate(cell_name(p, e) for p, _ in pols for e in env_fns):
        already = sum(len(s["episodes"]) for s in done_shards[cell].values())
        bars[cell] = tqdm(total=episodes, initial=already, desc=cell, position=i, unit="ep", leave=True)
    return bars


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("_") or "x"
