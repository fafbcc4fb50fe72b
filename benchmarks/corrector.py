"""Corrective action-chunk execution on ``push`` (``--env`` another task; an image checkpoint renders its
camera), issue 16: replan-every-step vs open-loop 8 and 16 vs corrective (16-action chunks, guided and plain
replanning), with and without mid-episode perturbations, same checkpoint; success (95% Wilson), policy calls per
episode, triggers per episode, per-step alarm rate and the monitor's cost per control step over one policy call
(same run).

    MUJOCO_GL=egl .venv/bin/python benchmarks/corrector.py --policy CKPT --episodes 50 --out outputs/corrector/bench

``--breakdown`` (with ``--monitor``): instead, the CPU time of each part of one monitor step and of one policy call
on ``--num_envs`` rows of synthetic frames (thread CPU time, so that a loaded machine inflates it little), in each
trunk mode of ``--trunk exact,fast`` interleaved. ``--trunk fast`` (one mode) runs the cells with the cheaper image
trunk (``policies.common.conv_paths.set_trunk_mode``; like ``POLICYLINK_TRUNK=fast``). ``--replay STORE --trunk
exact,fast --cells CELL``: the alarms of one corrective cell on the store's recorded episodes in both modes.

Steps ((1) and (2) only when a corrective cell runs without ``--monitor``): (1) roll the policy open-loop with
16-action chunks on training seeds (unperturbed) and record the rollouts; (2) ``policylink finetune monitor`` on
them (train / calibration / test split of the successes); (3) evaluate every cell on held-out seeds.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np
import torch

from policylink.data.episode_meta import EpisodeMeta
from policylink.data.recorder import EpisodeRecorder
from policylink.evaluate.report import plot_monitor_trace, wilson_interval
from policylink.policies import load_policy
from policylink.policies.checkpoint import checkpoint_env_kwargs
from policylink.policies.common.conv_paths import set_trunk_mode
from policylink.policies.corrector.calibration import DetectorConfig
from policylink.policies.corrector.config import CorrectiveConfig
from policylink.runtime.executors import CorrectiveLog, ExecutorConfig, LatencyConfig, make_executor
from policylink.runtime.rollout import RecorderSubscriber, RegistryEnvFn, make_vector_env, plan_episodes, rollout
from policylink.sim.mujoco.perturbations import PerturbationConfig
from policylink.train.corrector import MonitorCmdConfig, train_and_calibrate

PERTURBED = PerturbationConfig(displacement=0.03, displacement_steps=(10, 30), force=2.0, force_probability=0.02)


def run_cell(policy, executor_cfg, n, seed, perturbation, num_envs, env="push", env_kwargs=None):
    """Episodes of one cell on ``env`` (``env_kwargs``: the checkpoint's ``obs_mode``...): ``(results, corrective
    log or None, executor)``."""
    policy.reseed(seed)
    kwargs = dict(env_kwargs or {}, **({"perturbation": perturbation} if perturbation is not None else {}))
    vec = make_vector_env(RegistryEnvFn(env, **kwargs), plan_episodes(n, seed, num_envs))
    ex = make_executor(policy, executor_cfg)
    log = CorrectiveLog() if executor_cfg.kind == "corrective" else None
    try:
        results = rollout(vec, ex, n, subscribers=[log] if log else [])
    finally:
        vec.close()
    return results, log, ex


def record_rollouts(policy, path, n, seed, num_envs, env="push", env_kwargs=None):
    """Open-loop 16 rollouts of the policy on unperturbed training seeds, recorded with success flags."""
    vec = make_vector_env(RegistryEnvFn(env, **(env_kwargs or {})), plan_episodes(n, seed, num_envs))
    ex = make_executor(policy, ExecutorConfig(n_action_steps=policy.spec.chunk_size))
    with EpisodeRecorder(path, env_spec=vec.envs[0].unwrapped.env_spec) as rec:
        rollout(vec, ex, n, subscribers=[RecorderSubscriber(rec, EpisodeMeta(source="policy"))])
    vec.close()


BASE_CELLS = {
    "every1": ExecutorConfig(n_action_steps=1),
    "open2": ExecutorConfig(n_action_steps=2),
    "open4": ExecutorConfig(n_action_steps=4),
    "open8": ExecutorConfig(n_action_steps=8),
    "open16": ExecutorConfig(n_action_steps=16),
    "ensemble": ExecutorConfig(kind="temporal_ensemble"),
    "ensemble4": ExecutorConfig(kind="temporal_ensemble", n_action_steps=4),  # a query every 4 steps
    # async every 4 steps with real-time chunking, zero simulated delay (reproducible): open-loop 4's budget
    "async4": ExecutorConfig(kind="async", n_action_steps=4, latency=LatencyConfig(mode="fixed", steps=0)),
}


def cell_config(name: str, monitor: str) -> ExecutorConfig:
    """A cell by name: a key of ``BASE_CELLS``, or ``corrective`` with optional ``:field=value;...`` overrides of
    :class:`CorrectiveConfig` and (``detector.field``) :class:`DetectorConfig`, e.g.
    ``corrective:monitor=DIR;short_horizon=1;short_dwell=8;guidance_scale=0;detector.persistence_m=1``."""
    if name in BASE_CELLS:
        return BASE_CELLS[name]
    kind, _, opts = name.partition(":")
    if kind != "corrective":
        raise ValueError(f"cell: expected one of {[*BASE_CELLS, 'corrective[:k=v;...]']}, received {name!r}")
    fields, det = {"monitor": monitor}, {}
    for kv in filter(None, opts.split(";")):
        k, v = kv.split("=")
        value = v if k in ("guidance_target", "monitor") else None if v == "none" else float(v) if "." in v else int(v)
        (det if k.startswith("detector.") else fields)[k.removeprefix("detector.")] = value
    return ExecutorConfig(kind="corrective", corrective=CorrectiveConfig(detector=DetectorConfig(**det), **fields))


def evaluate_cell(policy, name, cfg, args, pert_name, pert, out):
    """One cell's row of the results table."""
    c0 = time.perf_counter()
    results, log, ex = run_cell(policy, cfg, args.episodes, args.seed, pert, args.num_envs, args.env, args.env_kwargs)
    k = sum(r.success for r in results)
    lo, hi = wilson_interval(k, len(results))
    row = {"perturbation": pert_name, "executor": name, "success": k / len(results), "ci95": [lo, hi],
           "n": len(results), "calls_per_episode": float(np.mean([r.inferences for r in results])),
           "steps_per_episode": float(np.mean([r.n_steps for r in results]))}  # fmt: skip
    row["wall_s"] = time.perf_counter() - c0
    if log is not None:
        row.update(log.summary())
        ok = [r.index for r in results if r.success]
        row["alarm_rate_successes"] = log.summary(ok)["alarm_rate"] if ok else None
        row["monitor_cost_ratio"] = ex.monitor_cost_ratio()
        # its parts: the monitor scores all num_envs rows per step, a call plans only the rows that need a chunk
        row["monitor_ms_per_step"] = 1e3 * ex.monitor_s / max(ex.monitor_steps, 1)
        row["policy_ms_per_call"] = 1e3 * ex.policy_s / max(ex.policy_calls, 1)
        row["rows_per_call"] = ex.policy_rows / max(ex.policy_calls, 1)
        fired = [i for i in sorted(log.episodes) if log.episodes[i]["triggers"]]
        if fired:
            plot_monitor_trace(out / f"trace_{pert_name}.png", log.episodes[fired[0]]["trace"],
                               f"{args.env}, {pert_name}, episode {fired[0]}")  # fmt: skip
    return row


def _cpu_ms(fn, calls: int = 5) -> float:
    """CPU milliseconds of this thread per call of ``fn`` (mean of ``calls`` calls)."""
    t0 = time.thread_time()
    for _ in range(calls):
        fn()
    return (time.thread_time() - t0) / calls * 1e3


def monitor_breakdown(policy, monitor_dir: str, rows: int, reps: int = 12, modes: tuple[str, ...] = ("exact",)) -> dict:
    """CPU ms (medians over ``reps`` interleaved repetitions) of the parts of a corrective monitor step on ``rows``
    rows of new synthetic frames, in each trunk mode of ``modes`` (``policies.common.conv_paths.set_trunk_mode``,
    interleaved): ``policy.update_observation`` + ``policy.embed`` (the encoder pass of every row's new frame), the
    image trunk per frame at batch 1, 2 and ``rows``, each trunk layer at batch ``rows``, the monitor's MLP + score
    and detector; ``predict_action_chunk`` for 1-3 rows with cached latents (a policy call without its frames) and
    for all ``rows`` rows with their new frames (what replanning every step pays).
    Derived per mode (``ratios``): ``e_row`` (embed ms per row), the monitor step (embed + scores + detector) over
    a call that plans ``n`` rows and encodes their frames (``U(n) + n e_row``), the same per row (monitor step /
    ``rows`` over call / ``n``), and over the all-rows call."""
    from policylink.policies.common import conv_paths
    from policylink.policies.common.frame_features import pixel_affine
    from policylink.policies.corrector.monitor import load_monitor
    from policylink.runtime.executors import CorrectiveExecutor

    feats = policy.spec.observation_features
    key = next(k for k, f in feats.items() if f.dtype == "uint8")
    rng = np.random.default_rng(0)

    def frame(f):
        if f.dtype == "uint8":
            return rng.integers(0, 256, (rows, *f.shape), dtype=np.uint8)
        return rng.standard_normal((rows, *f.shape)).astype(f.dtype)

    obs = [{k: frame(f) for k, f in feats.items()} for _ in range(4)]
    monitor, thresholds = load_monitor(monitor_dir)
    ex = CorrectiveExecutor(policy, cell_config("corrective:guidance_scale=0", monitor_dir), monitor, thresholds)
    for t in range(2 * ex.k):
        ex.act(obs[t % 4])
    z = np.asarray(policy.embed(), np.float32)
    enc = policy.model.encoder.image_encoder(key)
    scale, shift = pixel_affine(policy.processors.normalizer, key, "cpu")
    frames = {b: torch.from_numpy(obs[0][key][:b]) for b in sorted({1, 2, rows})}
    x = enc.crop(frames[rows].permute(0, 3, 1, 2)).contiguous()
    x = torch.addcmul(shift.view(1, 3, 1, 1), x.float(), scale.view(1, 3, 1, 1))
    layer_in = [x]
    with torch.no_grad():
        for m in enc.trunk:
            layer_in.append(m(layer_in[-1]))
    step = [0]

    def embed() -> None:
        step[0] += 1
        policy.update_observation(obs[step[0] % 4])
        policy.embed()

    def plan(n: int, fresh: bool = False):
        def call() -> None:
            if fresh:  # new frames for every row: the call encodes them
                step[0] += 1
                policy.update_observation(obs[step[0] % 4])
            else:
                policy._latent_ok[:] = True  # latents cached: the call's U-Net alone
            policy.predict_action_chunk(env_ids=list(range(n)))

        return call

    jobs = {
        "embed_all_rows": (embed, 1),
        **{f"frame_batch{b}": ((lambda b=b: enc.forward_pixels(frames[b], scale, shift)), b) for b in frames},
        "trunk": (lambda: enc.trunk(x), 1),
        "pool_out": (lambda: enc.out(enc.pool(layer_in[-1])), 1),
        **{f"layer{i}_{type(m).__name__}": ((lambda m=m, h=layer_in[i]: m(h)), 1) for i, m in enumerate(enc.trunk)},
        "monitor_scores": (lambda: ex._scores(z), 1),
        "detector": (lambda: ex.detector.update(np.zeros(rows), ex.queue.offset.copy(), ex._t >= ex.k), 1),
        **{f"policy_call_{n}_rows": (plan(n), 1) for n in (1, 2, 3) if n <= rows},
        "policy_call_all_rows_with_frames": (plan(rows, fresh=True), 1),
    }

    def run(mode: str, fn) -> float:
        conv_paths.set_trunk_mode(mode)
        try:
            return fn()
        finally:
            conv_paths.set_trunk_mode("exact")

    with torch.no_grad():
        for mode in modes:  # warm-up: conv path choices (per mode), caches
            for fn, _ in jobs.values():
                run(mode, fn)
    res: dict[str, dict[str, list[float]]] = {m: {k: [] for k in jobs} for m in modes}
    for _ in range(reps):
        with torch.no_grad():
            for name, (fn, per) in jobs.items():
                calls = 1 if name.startswith("policy_call") else 5
                for mode in modes:
                    res[mode][name].append(run(mode, lambda fn=fn, c=calls: _cpu_ms(fn, c)) / per)
    out = {m: {k: float(np.median(v)) for k, v in r.items()} for m, r in res.items()}
    return {"rows": rows, "reps": reps, "cpu_ms": out, "ratios": {m: _ratios(o, rows) for m, o in out.items()},
            "load": os.getloadavg()[0]}  # fmt: skip


def _ratios(ms: dict[str, float], rows: int) -> dict[str, float]:
    """The monitor step's cost against policy calls, from one mode's medians (see :func:`monitor_breakdown`)."""
    e_row = ms["embed_all_rows"] / rows
    step = ms["embed_all_rows"] + ms["monitor_scores"] + ms["detector"]
    out = {"e_row_ms": e_row, "monitor_step_ms": step}
    for n in (1, 2, 3):
        if f"policy_call_{n}_rows" in ms:
            call = ms[f"policy_call_{n}_rows"] + n * e_row
            out[f"step_over_call_{n}_rows"] = step / call
            out[f"per_row_over_call_{n}_rows"] = (step / rows) / (call / n)
    out["step_over_call_all_rows"] = step / ms["policy_call_all_rows_with_frames"]
    return out


def alarm_agreement(policy_ref: str, monitor_dir: str, store_path: str, cell: str, modes: tuple[str, str]) -> dict:
    """The corrective executor's alarms on a recorded trace in two trunk modes (``"exact:torch"`` also pins the
    conv path): the store's episodes replayed as batches of 10 rows (a shorter episode holds its last
    observation), policy reseeded per batch; per (row, step) fired flags and score / threshold compared."""
    from policylink.data.buffer import EpisodeStore
    from policylink.policies.common.conv_paths import set_forced_path
    from policylink.policies.corrector.monitor import load_monitor
    from policylink.runtime.executors import CorrectiveExecutor

    store = EpisodeStore(store_path)
    keys = [k for k in store.keys if k.startswith("observation.")]
    eps = [store.get_episode(i, keys) for i in range(store.n_episodes)]
    fired, ratio = {}, {}
    for mode in modes:
        trunk, _, path = mode.partition(":")
        set_trunk_mode(trunk)
        set_forced_path(path or None)
        policy, (monitor, thresholds) = load_policy(policy_ref, device="cpu"), load_monitor(monitor_dir)
        fired[mode], ratio[mode] = [], []
        for b in range(0, len(eps), 10):
            batch = eps[b : b + 10]
            policy.reseed(0)
            ex = CorrectiveExecutor(policy, cell_config(cell, monitor_dir), monitor, thresholds)
            with torch.no_grad():
                for t in range(max(len(e[keys[0]]) for e in batch)):
                    ex.act({k: np.stack([e[k][min(t, len(e[k]) - 1)] for e in batch]) for k in keys})
            fired[mode] += [f for tr in ex.trace for (_, _, _, f) in tr]
            ratio[mode] += [s / max(th, 1e-12) for tr in ex.trace for (_, s, th, _) in tr]
    set_trunk_mode("exact")
    set_forced_path(None)
    (a, b), (ra, rb) = (np.array(fired[m]) for m in modes), (np.array(ratio[m]) for m in modes)
    rel = np.abs(ra - rb) / np.maximum(np.abs(ra), 1e-12)
    return {"modes": list(modes), "row_steps": int(a.size), "alarms": [int(a.sum()), int(b.sum())],
            "disagree": int((a != b).sum()), "score_rel_diff_median": float(np.median(rel)),
            "score_rel_diff_p99": float(np.quantile(rel, 0.99))}  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--policy", required=True)
    p.add_argument("--env", default="push", help="registered task the policy was trained on")
    p.add_argument("--episodes", type=int, default=50)
    p.add_argument("--rollouts", type=int, default=120, help="training rollouts for the monitor")
    p.add_argument("--seed", type=int, default=100000)
    p.add_argument("--num_envs", type=int, default=10)
    p.add_argument("--out", default="outputs/corrector/bench")
    p.add_argument("--buffer", default=None, help="use this store instead of recording policy rollouts")
    p.add_argument("--monitor", default=None, help="use this monitor folder instead of training one")
    p.add_argument("--cells", default="every1,open8,open16,corrective,corrective:guidance_scale=0")
    p.add_argument("--perturbations", default="none,displace+force")
    p.add_argument("--breakdown", action="store_true", help="CPU time of a monitor step's parts (needs --monitor)")
    p.add_argument("--replay", default=None, help="store: alarm agreement of the two --trunk modes on its episodes")
    p.add_argument("--trunk", default="exact", help="trunk mode(s), comma-separated: exact, fast (breakdown: each)")
    args = p.parse_args()
    torch.set_num_threads(1)
    if args.replay:
        modes = tuple(args.trunk.split(","))
        if len(modes) != 2 or not args.monitor:
            raise SystemExit(f"--replay: expected --monitor and two --trunk modes, received {args.trunk!r}")
        print(json.dumps(alarm_agreement(args.policy, args.monitor, args.replay, args.cells, modes)))
        return
    if args.breakdown:
        if not args.monitor:
            raise SystemExit("--breakdown: expected --monitor DIR, received none")
        modes = tuple(args.trunk.split(","))
        policy = load_policy(args.policy, device="cpu")
        print(json.dumps(monitor_breakdown(policy, args.monitor, args.num_envs, modes=modes), indent=1))
        return
    set_trunk_mode(args.trunk)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    policy = load_policy(args.policy, device="cpu")
    args.env_kwargs = checkpoint_env_kwargs(args.policy) or {}  # an image checkpoint renders its camera
    t0 = time.perf_counter()
    summary = {"monitor": args.monitor}
    mon_dir = Path(args.monitor) if args.monitor else out / "monitor"
    if not args.monitor and "corrective" in args.cells:  # only a corrective cell needs a monitor
        buffer = Path(args.buffer) if args.buffer else out / "rollouts.zarr"
        if not buffer.exists():
            record_rollouts(policy, buffer, args.rollouts, 1000, args.num_envs, args.env, args.env_kwargs)
        summary = train_and_calibrate(MonitorCmdConfig(policy=args.policy, buffer=str(buffer), out=str(mon_dir)))
        print(json.dumps(summary, indent=2), flush=True)
    perts = {"none": None, "displace+force": PERTURBED}
    rows = []
    for pert_name in args.perturbations.split(","):
        for name in args.cells.split(","):
            row = evaluate_cell(policy, name, cell_config(name, str(mon_dir)), args, pert_name, perts[pert_name], out)
            rows.append(row)
            print(json.dumps(row), flush=True)
            (out / "results.json").write_text(json.dumps({"monitor": summary, "cells": rows}, indent=2))
    print(f"total {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
