"""Chunk-inference latency of our Diffusion Policy and flow-matching policy on CPU, side by side with LeRobot's
``DiffusionPolicy`` model at the same sizes and steps when ``lerobot`` is importable.

Ours is timed end to end from raw observations (``ChunkPolicy.sample``: uint8/float conversion, normalisation,
encoder, sampler, unnormalisation); LeRobot's from already-normalised float tensors
(``DiffusionModel.generate_actions``), which favours LeRobot. Calls alternate between the models so that load
from other processes on a shared machine hits both alike. Weights are random (latency does not depend on them).

Our U-Net's convolutions run through the execution path measured fastest on this machine for each input shape
(:mod:`policylink.policies.common.conv_paths`); the measurement happens in the untimed warm-up call, and the
script prints (and writes) the CPU, the torch build, the load, the time the measurement took and the path
chosen per layer. ``--conv-path torch`` pins PyTorch's own convolution instead (the reference).

    .venv/bin/python benchmarks/inference_latency.py --reps 15
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import torch

from policylink.adapters.schema import ActionSpec, FeatureSpec, PolicySpec
from policylink.data.normalize import Normalizer
from policylink.policies.common import conv_paths
from policylink.policies.common.encoders import EncoderConfig
from policylink.policies.common.unet1d import GemmConv1d, UNetConfig
from policylink.policies.processing import processors_for
from policylink.policies.registry import make_config, make_policy

RESULTS = Path(__file__).resolve().parent / "results" / "inference_latency.md"
STATE, ENV_STATE, IMAGE = "observation.state", "observation.environment_state", "observation.images.front"
STATE_DIM, ENV_DIM, ACTION_DIM, IMAGE_SIDE = 6, 8, 2, 96


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and write ``benchmarks/results/inference_latency.md``. See ``--help``."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=30, help="timed calls per model and batch size")
    ap.add_argument("--batches", default="1,8", help="comma list of batch sizes")
    ap.add_argument("--down-dims", default="256,512,1024", help="U-Net channels per level (both libraries)")
    ap.add_argument("--variants", default="state,image", help="state (state + env state) and/or image")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    ap.add_argument("--models", default="diffusion,flow", help="ours: diffusion and/or flow")
    ap.add_argument("--conv-path", default=None, choices=conv_paths.PATHS, help="pin one conv path (default: measure)")
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    conv_paths.set_forced_path(args.conv_path)
    down = [int(d) for d in args.down_dims.split(",")]
    machine = machine_line(args.threads)
    print(machine, flush=True)
    lines, choice_lines, load_start = [], [], os.getloadavg()[0]
    for variant in args.variants.split(","):
        ours = {kind: _ours(kind, variant, down) for kind in args.models.split(",")}
        models = {kind: (p.sample, make_input) for kind, (p, make_input) in ours.items()}
        lerobot = _lerobot(variant, down)
        if lerobot is not None:
            models["lerobot_diffusion"] = lerobot
        for b in (int(x) for x in args.batches.split(",")):
            inputs = {name: make_input(b) for name, (_, make_input) in models.items()}
            times = {name: [] for name in models}
            with torch.inference_mode():
                for name, (fn, _) in models.items():  # warm-up (our first call measures the conv paths)
                    m0, t0 = conv_paths.SELECTOR.measured_seconds, time.perf_counter()
                    fn(inputs[name])
                    if name in ours:
                        first = time.perf_counter() - t0
                        measured = conv_paths.SELECTOR.measured_seconds - m0
                        choice_lines.append(
                            f"- {variant} {name} batch {b}: first call {first * 1e3:.0f} ms, of which path "
                            f"measurement {measured * 1e3:.0f} ms; " + layer_paths(ours[name][0], inputs[name])
                        )
                        print(choice_lines[-1], flush=True)
                for _ in range(args.reps):
                    for name, (fn, _) in models.items():
                        t0 = time.perf_counter()
                        fn(inputs[name])
                        times[name].append(1e3 * (time.perf_counter() - t0))
            base = np.median(times["lerobot_diffusion"]) if "lerobot_diffusion" in times else None
            for name, ts in times.items():
                p50, p99 = np.percentile(ts, 50), np.percentile(ts, 99)
                ratio = f"{p50 / base:.2f}x" if base else "-"
                row = f"| {variant} | {name} | {b} | {p50:.1f} | {p99:.1f} | {ratio} |"
                lines.append(row)
                print(row, flush=True)
    load = f"load average {load_start:.1f} at start, {os.getloadavg()[0]:.1f} at end ({os.cpu_count()} CPUs)"
    command = " ".join(["benchmarks/inference_latency.py", *(argv or sys.argv[1:])])
    _write(Path(args.out), command, down, args, lines, f"{machine}; {load}", choice_lines)
    return 0


def machine_line(threads: int) -> str:
    """CPU model, torch build (version, CPU capability, MKL, oneDNN), threads, Python."""
    cpu = platform.processor() or "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    onednn = next((w for w in torch.__config__.show().split() if w.startswith(("v2.", "v3."))), "?")
    return (
        f"CPU {cpu} ({os.cpu_count()} CPUs), torch {torch.__version__} (CPU capability "
        f"{torch.backends.cpu.get_cpu_capability()}, MKL {torch.backends.mkl.is_available()}, oneDNN "
        f"{onednn if torch.backends.mkldnn.is_available() else 'off'}), {threads} thread(s), "
        f"Python {platform.python_version()}"
    )


def layer_paths(policy, obs) -> str:
    """``path xN (C_in>C_out kK/sS Hlen, ...)`` over the U-Net's conv layers for ``obs``'s batch: the choices made."""
    seen: list[conv_paths.ConvKey] = []
    hooks = [
        m.register_forward_pre_hook(lambda mod, args: seen.append(conv_paths.conv_key(mod, args[0])))
        for m in policy.model.modules()
        if isinstance(m, GemmConv1d)
    ]
    try:
        policy.sample(obs, num_steps=1)
    finally:
        for h in hooks:
            h.remove()
    by_path: dict[str, Counter] = {}
    for key in seen:
        shape = f"{key.c_in}>{key.c_out} k{key.kernel}/s{key.stride} H{key.length}"
        by_path.setdefault(conv_paths.SELECTOR.path_for(key), Counter())[shape] += 1
    return "; ".join(
        f"{path} x{sum(c.values())} (" + ", ".join(k + (f" x{n}" if n > 1 else "") for k, n in c.items()) + ")"
        for path, c in sorted(by_path.items())
    )


def _features(variant: str) -> dict[str, FeatureSpec]:
    feats = {STATE: FeatureSpec("float32", (STATE_DIM,))}
    if variant == "state":
        feats[ENV_STATE] = FeatureSpec("float32", (ENV_DIM,))
    else:
        feats[IMAGE] = FeatureSpec("uint8", (IMAGE_SIDE, IMAGE_SIDE, 3), unit="rgb")
    return feats


def _ours(kind: str, variant: str, down: list[int]):
    feats = _features(variant)
    cfg = make_config(
        kind,
        observation_keys=list(feats),
        unet=UNetConfig(down_dims=down),
        encoder=EncoderConfig(vision_backbone="resnet18", crop_ratio=84 / 96, num_keypoints=32),
    )
    action = ActionSpec(names=("x", "y"), control_mode="ee_delta", units=("m", "m"), low=(-1, -1), high=(1, 1))
    spec = PolicySpec(feats, action, n_obs_steps=2, chunk_size=16, n_action_steps=8)
    stats = {k: {"min": np.zeros(f.shape[0]), "max": np.ones(f.shape[0])} for k, f in feats.items() if not f.is_image}
    stats["action"] = {"min": -np.ones(ACTION_DIM), "max": np.ones(ACTION_DIM)}
    modes = {k: ("identity" if f.is_image else "min_max") for k, f in feats.items()} | {"action": "min_max"}
    if variant == "image":
        stats[IMAGE] = {"mean": np.zeros((3, 1, 1))}
    chain = processors_for(cfg, feats, Normalizer(stats, modes))
    policy = make_policy(kind, spec=spec, processors=chain, config=cfg, device="cpu")

    def make_input(b: int) -> dict[str, np.ndarray]:
        rng = np.random.default_rng(0)
        out = {STATE: rng.random((b, 2, STATE_DIM), dtype=np.float32)}
        if variant == "state":
            out[ENV_STATE] = rng.random((b, 2, ENV_DIM), dtype=np.float32)
        else:
            out[IMAGE] = rng.integers(0, 256, (b, 2, IMAGE_SIDE, IMAGE_SIDE, 3), dtype=np.uint8)
        return out

    return policy, make_input


def _lerobot(variant: str, down: list[int]):
    try:
        from lerobot.configs.types import FeatureType, PolicyFeature
    except ImportError:
        return None
    DiffusionConfig, DiffusionModel = _lerobot_diffusion()
    inputs = {STATE: PolicyFeature(type=FeatureType.STATE, shape=(STATE_DIM,))}
    if variant == "state":
        inputs[ENV_STATE] = PolicyFeature(type=FeatureType.ENV, shape=(ENV_DIM,))
    else:
        inputs[IMAGE] = PolicyFeature(type=FeatureType.VISUAL, shape=(3, IMAGE_SIDE, IMAGE_SIDE))
    cfg = DiffusionConfig(
        input_features=inputs,
        output_features={"action": PolicyFeature(type=FeatureType.ACTION, shape=(ACTION_DIM,))},
        n_obs_steps=2,
        horizon=16,
        n_action_steps=8,
        down_dims=tuple(down),
        noise_scheduler_type="DDIM",
        num_inference_steps=10,
        crop_shape=(84, 84),
        pretrained_backbone_weights=None,
        use_group_norm=True,
        device="cpu",
    )
    model = DiffusionModel(cfg).eval()

    def make_input(b: int) -> dict[str, torch.Tensor]:
        g = torch.Generator().manual_seed(0)
        out = {STATE: torch.rand(b, 2, STATE_DIM, generator=g)}
        if variant == "state":
            out[ENV_STATE] = torch.rand(b, 2, ENV_DIM, generator=g)
        else:
            out["observation.images"] = torch.rand(b, 2, 1, 3, IMAGE_SIDE, IMAGE_SIDE, generator=g)
        return out

    return model.generate_actions, make_input


def _lerobot_diffusion():
    """LeRobot's ``DiffusionConfig`` and ``DiffusionModel``. ``lerobot.policies`` imports every policy's config,
    GR00T's included, whose module fails to import next to transformers >= 5 (a dataclass error in lerobot
    0.4.4's ``groot_n1.py``). GR00T is not used here, so its package is replaced by a stub before the import."""
    import types

    if "lerobot.policies" not in sys.modules:
        groot = types.ModuleType("lerobot.policies.groot")
        groot.__path__ = []
        config = types.ModuleType("lerobot.policies.groot.configuration_groot")
        config.GrootConfig = None
        sys.modules.update({groot.__name__: groot, config.__name__: config})
    from lerobot.policies.diffusion.configuration_diffusion import DiffusionConfig
    from lerobot.policies.diffusion.modeling_diffusion import DiffusionModel

    return DiffusionConfig, DiffusionModel


def _write(path: Path, command: str, down: list[int], args, lines: list[str], machine: str, choices) -> None:
    try:
        import lerobot

        lr = f"lerobot {lerobot.__version__}"
    except ImportError:
        lr = "lerobot not installed (no baseline column)"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        "# Chunk inference latency (CPU)\n\n"
        f"Command: `.venv/bin/python {command}`  \n"
        f"Machine: {machine}; no GPU; {lr}; date {datetime.date.today().isoformat()}.\n\n"
        f"Config: n_obs_steps 2, chunk 16, U-Net down_dims {down}, kernel 5, 10 DDIM steps (diffusion) / 10 Euler "
        "steps (flow); `state` = state (6) + environment state (8); `image` = state + one 96x96 camera through "
        "ResNet-18 (GroupNorm, spatial softmax, 84x84 centre crop). Ours: `ChunkPolicy.sample` from raw numpy "
        "observations; LeRobot: `DiffusionModel.generate_actions` on ready tensors. Ratio = p50 / LeRobot p50 "
        "(same run, calls interleaved).\n\n"
        "| variant | model | batch | p50 ms | p99 ms | vs LeRobot |\n|---|---|---|---|---|---|\n"
        + "\n".join(lines)
        + f"\n\nConv paths (pinned: {args.conv_path}; convs under 4M multiply-adds always run `torch`):\n\n"
        + "\n".join(choices)
        + "\n"
    )


if __name__ == "__main__":
    raise SystemExit(main())
