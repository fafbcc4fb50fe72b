"""Training throughput: samples/s of our Diffusion Policy against LeRobot's ``DiffusionPolicy`` (lerobot 0.4.4) at
the same architecture size (parameters counted and reported), batch, data and one DDPM timestep per sample, timed
pair by pair in one process, state-only and with 96x96 images.

Each library is timed two ways:

- ``model``: the optimizer step alone, on one batch prepared beforehand (forward + backward + clipping + optimizer
  + LR schedule). Ours is ``policylink.train.trainer.fit`` stepping the ``Optimization`` that ``policylink train``
  builds (AdamW, clip 10, cosine LR, EMA copy); LeRobot's is ``lerobot.scripts.lerobot_train.update_policy``
  (Adam, clip 10, cosine LR, no EMA: ours does the EMA update on top).
- ``data``: the same step fed by each library's own data path. Ours: ``training_batch`` over ``SequenceDataset``
  (in memory), synchronous in the training process, as ``policylink.train.imitation`` runs it. LeRobot's, as
  ``lerobot-train`` runs it: ``LeRobotDataset`` (``delta_timestamps``, PNG image features of the exported store)
  -> ``DataLoader`` (``EpisodeAwareSampler``, ``--workers`` processes, prefetch 2, pinned memory on CUDA) ->
  ``accelerate`` -> the policy's preprocessor. Each of its data blocks opens a new DataLoader iterator and takes
  its first batch untimed (worker start-up), then times its steps with the workers' prefetch in flight; the
  iterator is dropped after the block, so no worker runs during the other library's blocks.

Blocks alternate ours/LeRobot (order swapped every repeat); the tables give the median over repeats. Synthetic
episodes (smooth trajectories; images a moving square on a gradient, PNG-friendly like a render) are written to a
temporary episode store and exported to a LeRobot v3 folder with ``policylink.data.lerobot.export_lerobot``.

    .venv/bin/python benchmarks/train_throughput.py            # CPU sizes when no GPU; writes results/
    .venv/bin/python benchmarks/train_throughput.py --device cuda --amp
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from importlib.metadata import version
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _train_setups import (  # noqa: E402  (benchmarks/ is not a package)
    CROP_SIDE,
    DROP_LAST,
    HORIZON,
    IMAGE_SIDE,
    N_OBS,
    LeRobot,
    Ours,
    build_store,
)

os.environ.setdefault("HF_HUB_OFFLINE", "1")
RESULTS = Path(__file__).resolve().parent / "results" / "train_throughput.md"
MODES = ("state", "image")
PIPELINES = ("model", "model, per CPU-second", "data")
# per-device defaults: (down_dims, batch per mode, steps per block per mode, torch threads; 0 = torch's default).
# One thread on CPU: on a shared machine two OpenMP threads stall whenever another job holds a core (the same
# block then varies 10x); both libraries run with the same setting.
PRESETS = {
    "cpu": ("64,128,256", {"state": 64, "image": 16}, {"state": 5, "image": 2}, 1),
    "cuda": ("512,1024,2048", {"state": 64, "image": 64}, {"state": 20, "image": 10}, 0),
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse and complete the arguments (see :func:`resolve_args`). Exits with status 2 on a bad value."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="auto", help="auto (CUDA when present), cpu or cuda")
    ap.add_argument("--modes", default="state,image", help="comma list of: state (state + env state), image")
    ap.add_argument("--down-dims", default=None, help="U-Net channels per level, both libraries (CPU 64,128,256)")
    ap.add_argument("--batch", type=int, default=None, help="batch size (default per mode and device)")
    ap.add_argument("--steps", type=int, default=None, help="optimizer steps per timed block (default per mode)")
    ap.add_argument("--repeats", type=int, default=5, help="timed blocks per library and pipeline")
    ap.add_argument("--episode-length", type=int, default=60, help="steps per synthetic episode")
    ap.add_argument("--workers", type=int, default=None, help="LeRobot DataLoader workers (min(4, CPUs))")
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads (CPU 1; 0: torch's default)")
    ap.add_argument("--amp", action="store_true", help="bf16 autocast on CUDA, both libraries")
    ap.add_argument("--no-ema", action="store_true", help="train ours without its EMA copy (LeRobot keeps none)")
    ap.add_argument("--profile", action="store_true", help="also print the top ops of one model step of each")
    ap.add_argument("--out", default=str(RESULTS), help="markdown results ('' = none); JSON next to it")
    args = ap.parse_args(argv)
    try:
        return resolve_args(args)
    except ValueError as e:
        ap.error(str(e))


def resolve_args(args: argparse.Namespace) -> argparse.Namespace:
    """Fill the per-device defaults and check every value.

    Sets ``args.device`` (``"cpu"``/``"cuda"``), ``args.modes`` (list), ``args.down_dims`` (list of int),
    ``args.batches`` / ``args.block_steps`` (mode -> int) and ``args.workers``.

    Raises:
        ValueError: names the option, the expected and the received value (unknown device or mode, CUDA asked for
            but absent, U-Net levels not multiples of 8 or too many for the 16-step chunk, non-positive counts).
    """
    import torch

    if args.device not in ("auto", "cpu", "cuda"):
        raise ValueError(f"--device: expected auto, cpu or cuda, received {args.device!r}")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device: cuda requested, but torch.cuda.is_available() is False")
    args.device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    dims, batches, steps, threads = PRESETS[args.device]
    args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    bad = [m for m in args.modes if m not in MODES]
    if bad or not args.modes:
        raise ValueError(f"--modes: expected a comma list of {MODES}, received {bad or args.modes}")
    try:
        args.down_dims = [int(d) for d in (args.down_dims or dims).split(",")]
    except ValueError:
        raise ValueError(f"--down-dims: expected a comma list of ints, received {args.down_dims!r}") from None
    if any(d < 8 or d % 8 for d in args.down_dims) or HORIZON % 2 ** len(args.down_dims):
        raise ValueError(
            f"--down-dims: expected 1-4 levels, each a multiple of 8 (GroupNorm groups) with {HORIZON} divisible by "
            f"2 ** levels (LeRobot's rule), received {args.down_dims}"
        )
    args.batches = {m: args.batch or batches[m] for m in args.modes}
    args.block_steps = {m: args.steps or steps[m] for m in args.modes}
    args.workers = min(4, os.cpu_count() or 1) if args.workers is None else args.workers
    args.threads = threads if args.threads is None else args.threads
    for name, value in (
        ("--batch", args.batch), ("--steps", args.steps), ("--repeats", args.repeats),
        ("--episode-length", args.episode_length),
    ):  # fmt: skip
        if value is not None and value < 1:
            raise ValueError(f"{name}: expected an int >= 1, received {value}")
    if args.episode_length <= DROP_LAST:
        raise ValueError(f"--episode-length: expected > {DROP_LAST} (LeRobot drops the last {DROP_LAST}), received "
                         f"{args.episode_length}")  # fmt: skip
    if args.workers < 0 or args.threads < 0:
        raise ValueError(f"--workers/--threads: expected >= 0, received {args.workers}/{args.threads}")
    return args


def episodes_needed(batches: int, batch: int, length: int) -> int:
    """Episodes of ``length`` steps (at least 20) so that LeRobot's sampler (``length - 7`` anchors an episode)
    yields ``batches`` batches of ``batch`` within one epoch, +25 % (an epoch's end restarts the DataLoader)."""
    return max(20, math.ceil(1.25 * batches * batch / (length - DROP_LAST)))


# ------------------------------------------------------------------------------------------------ measurement
def block(lib: Any, fn, with_data: bool, device: str) -> tuple[float, float]:
    """``(wall seconds, CPU seconds of this process)`` that ``fn()`` takes (CUDA queue synchronised before and
    after), between ``lib.start(with_data)`` and ``lib.stop()``, which are not timed."""
    import torch

    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    lib.start(with_data)
    sync()
    t0, c0 = time.perf_counter(), time.process_time()
    fn()
    sync()
    seconds = time.perf_counter() - t0, time.process_time() - c0
    lib.stop()
    return seconds


def measure_mode(mode: str, tmp: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Build both libraries on one synthetic dataset of ``mode`` and time them pair by pair. Returns the raw
    samples/s per repeat, the data-only rates and the parameter counts."""
    from policylink.data.lerobot import export_lerobot

    b, k = args.batches[mode], args.block_steps[mode]
    episodes = episodes_needed(2 * k + 2, b, args.episode_length)  # a block reads within one DataLoader epoch
    t0 = time.perf_counter()
    store = build_store(tmp / f"{mode}.zarr", mode, episodes, args.episode_length)
    export_lerobot(store, tmp / f"{mode}_lerobot")
    print(f"[{mode}] {episodes} episodes x {args.episode_length} steps written + exported in "
          f"{time.perf_counter() - t0:.1f} s", flush=True)  # fmt: skip
    libs = [Ours(tmp / f"{mode}.zarr", mode, args), LeRobot(tmp / f"{mode}_lerobot", mode, args)]
    params = {lib.name: lib.parameters() for lib in libs}
    print(f"[{mode}] parameters {params}", flush=True)
    for lib in libs:  # warm-up: allocator, conv algorithm choices, first worker start
        for with_data in (False, True):
            block(lib, lambda lib=lib, d=with_data: lib.train(1, with_data=d), with_data, args.device)
    data = {
        lib.name: 2 * k * b / block(lib, lambda lib=lib: lib.data_only(2 * k), True, args.device)[0] for lib in libs
    }
    rates: dict[str, dict[str, list[float]]] = {p: {lib.name: [] for lib in libs} for p in PIPELINES}
    for r in range(args.repeats):
        for pipeline in ("model", "data"):
            for lib in libs if r % 2 == 0 else libs[::-1]:
                d = pipeline == "data"
                wall, cpu = block(lib, lambda lib=lib, d=d: lib.train(k, with_data=d), d, args.device)
                rates[pipeline][lib.name].append(k * b / wall)
                if not d and args.device == "cpu":
                    rates["model, per CPU-second"][lib.name].append(k * b / cpu)
        print(f"[{mode}] repeat {r + 1}/{args.repeats}: " + ", ".join(
            f"{p} {n} {v[-1]:.1f}" for p, d in rates.items() for n, v in d.items()), flush=True)  # fmt: skip
    profile = profile_step(libs, args.device) if args.profile else None
    return {"batch": b, "steps_per_block": k, "episodes": episodes, "params": params, "data_only": data,
            "samples_per_s": rates, "profile": profile}  # fmt: skip


def profile_step(libs: list[Any], device: str, top: int = 15) -> dict[str, str]:
    """torch.profiler table (top ``top`` ops by self time) of two model-only steps of each library."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    key = "self_cuda_time_total" if device == "cuda" else "self_cpu_time_total"
    out = {}
    for lib in libs:
        with profile(activities=acts) as prof:
            lib.train(2, with_data=False)
        out[lib.name] = prof.key_averages().table(sort_by=key, row_limit=top)
        print(f"--- profile: {lib.name}\n{out[lib.name]}", flush=True)
    return out


# ---------------------------------------------------------------------------------------------------- report
def machine_info(args: argparse.Namespace) -> dict[str, Any]:
    """CPU model (``lscpu``), core count, GPU name, torch / lerobot versions, threads, load average."""
    import torch

    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout if shutil.which("lscpu") else ""
    cpu = next((ln.split(":", 1)[1].strip() for ln in lscpu.splitlines() if ln.startswith("Model name")), "")

    return {
        "cpu": cpu or platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "gpu": torch.cuda.get_device_name(0) if args.device == "cuda" else None,
        "torch": torch.__version__,
        "lerobot": version("lerobot"),
        "threads": torch.get_num_threads(),
        "load_avg_1min": os.getloadavg()[0],
    }


def summarize(results: dict[str, Any]) -> dict[str, Any]:
    """Per mode and pipeline: median samples/s of each library, the ratio of the medians (ours / LeRobot) and the
    median of the per-repeat ratios (each repeat's two blocks ran back to back, so load from other jobs hits both
    alike)."""
    out = {}
    for mode, res in results.items():
        for pipeline, by_lib in res["samples_per_s"].items():
            if not by_lib["lerobot"]:
                continue
            med = {name: statistics.median(v) for name, v in by_lib.items()}
            paired = [a / b for a, b in zip(by_lib["policylink"], by_lib["lerobot"])]
            out[f"{mode}/{pipeline}"] = {**med, "ratio": med["policylink"] / med["lerobot"],
                                         "paired_ratio": statistics.median(paired)}  # fmt: skip
    return out


def markdown(args: argparse.Namespace, machine: dict, results: dict, summary: dict, argv: list[str]) -> str:
    """The results page."""
    cmd = " ".join([".venv/bin/python benchmarks/train_throughput.py", *argv])
    lines = [
        "# Training throughput: policylink Diffusion Policy vs LeRobot DiffusionPolicy", "",
        f"Command: `{cmd}`", "",
        f"Machine: {machine['cpu']} ({machine['cores']} cores), GPU: {machine['gpu'] or 'none'}; torch "
        f"{machine['torch']}, lerobot {machine['lerobot']}, {machine['threads']} torch threads, device "
        f"{args.device}, AMP {'bf16' if args.amp and args.device == 'cuda' else 'off'}. Load average (1 min) before: "
        f"{machine['load_avg_1min']:.2f}, after: {os.getloadavg()[0]:.2f}. Date: {datetime.date.today()}.", "",
        f"U-Net down_dims {args.down_dims}, kernel 5, 8 groups, time embedding 128, FiLM scale+bias; images: "
        f"ResNet-18 (GroupNorm, random init), random {CROP_SIDE}x{CROP_SIDE} crops of {IMAGE_SIDE}x{IMAGE_SIDE}, "
        f"32 spatial-softmax keypoints; n_obs_steps {N_OBS}, chunk {HORIZON} actions, 100 DDPM train timesteps "
        f"(one per sample). LeRobot DataLoader workers: {args.workers}. Ours {'without' if args.no_ema else 'with'} "
        "its EMA update (LeRobot has none). Samples/s are wall-clock; on CPU, 'model, per CPU-second' divides the "
        "model-only samples by the CPU time of this process instead (one torch thread: the work per sample, "
        "insensitive to the time the process waited for a core on a shared machine).", "",
        "| mode | batch | steps/block | repeats | params ours (total / image enc / U-Net) | params LeRobot |",
        "|---|---:|---:|---:|---|---|",
    ]  # fmt: skip
    fmt = lambda p: f"{p['total']:,} / {p['image_encoder']:,} / {p['unet']:,}"  # noqa: E731
    for mode, res in results.items():
        lines.append(f"| {mode} | {res['batch']} | {res['steps_per_block']} | {args.repeats} | "
                     f"{fmt(res['params']['policylink'])} | {fmt(res['params']['lerobot'])} |")  # fmt: skip
    lines += ["", "## Samples/s (median over repeats; min-max in brackets)", "",
              "| mode | pipeline | policylink | LeRobot | ratio of medians | median per-repeat ratio |",
              "|---|---|---:|---:|---:|---:|"]  # fmt: skip
    for mode, res in results.items():
        for pipeline, by_lib in res["samples_per_s"].items():
            if not by_lib["lerobot"]:
                continue
            s = summary[f"{mode}/{pipeline}"]
            ours, theirs = (
                f"{s[n]:.1f} [{min(by_lib[n]):.1f}-{max(by_lib[n]):.1f}]" for n in ("policylink", "lerobot")
            )
            lines.append(f"| {mode} | {pipeline} | {ours} | {theirs} | {s['ratio']:.2f} | {s['paired_ratio']:.2f} |")
    lines += ["", "## Data path alone (batches built and preprocessed, no training step)", "",
              "| mode | policylink samples/s | x its model-step rate | LeRobot samples/s | x its model-step rate |",
              "|---|---:|---:|---:|---:|"]  # fmt: skip
    for mode, res in results.items():
        d, s = res["data_only"], summary[f"{mode}/model"]
        lines.append(f"| {mode} | {d['policylink']:.0f} | {d['policylink'] / s['policylink']:.1f} | "
                     f"{d['lerobot']:.0f} | {d['lerobot'] / s['lerobot']:.1f} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; print the tables and write ``--out`` (+ ``.json``). Returns the exit status."""
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    machine = machine_info(args)
    print(machine, flush=True)
    tmp = Path(tempfile.mkdtemp(prefix="train_throughput_"))
    try:
        results = {mode: measure_mode(mode, tmp, args) for mode in args.modes}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    summary = summarize(results)
    page = markdown(args, machine, results, summary, argv)
    print(page)
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(page)
        raw = {"argv": argv, "machine": machine, "summary": summary, "results": results,
               "config": {k: v for k, v in vars(args).items() if k != "out"}}  # fmt: skip
        out.with_suffix(".json").write_text(json.dumps(raw, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
