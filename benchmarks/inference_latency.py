"""Chunk-inference latency of our Diffusion Policy and flow-matching policy on CPU, side by side with LeRobot's
``DiffusionPolicy`` model at the same sizes and steps when ``lerobot`` is importable.

Ours is timed end to end from raw observations (``ChunkPolicy.sample``: uint8/float conversion, normalisation,
encoder, sampler, unnormalisation); LeRobot's from already-normalised float tensors
(``DiffusionModel.generate_actions``), which favours LeRobot. Calls alternate between the models so that load
from other processes on a shared machine hits both alike. Weights are random (latency does not depend on them).

    .venv/bin/python benchmarks/inference_latency.py --reps 30
"""

from __future__ import annotations

import argparse
import datetime
import sys
import time
from pathlib import Path

import numpy as np
import torch

from policylink.adapters.schema import ActionSpec, FeatureSpec, PolicySpec
from policylink.data.normalize import Normalizer
from policylink.policies.common.encoders import EncoderConfig
from policylink.policies.common.unet1d import UNetConfig
from policylink.policies.policy import make_chunk_policy
from policylink.policies.registry import make_config

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
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    down = [int(d) for d in args.down_dims.split(",")]
    lines = []
    for variant in args.variants.split(","):
        models = {kind: _ours(kind, variant, down) for kind in ("diffusion", "flow")}
        lerobot = _lerobot(variant, down)
        if lerobot is not None:
            models["lerobot_diffusion"] = lerobot
        for b in (int(x) for x in args.batches.split(",")):
            inputs = {name: make_input(b) for name, (_, make_input) in models.items()}
            times = {name: [] for name in models}
            with torch.inference_mode():
                for name, (fn, _) in models.items():  # warm-up
                    fn(inputs[name])
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
    _write(Path(args.out), " ".join(["benchmarks/inference_latency.py", *(argv or sys.argv[1:])]), down, args, lines)
    return 0


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
    policy = make_chunk_policy(kind, spec=spec, normalizer=Normalizer(stats, modes), config=cfg, device="cpu")

    def make_input(b: int) -> dict[str, np.ndarray]:
        rng = np.random.default_rng(0)
        out = {STATE: rng.random((b, 2, STATE_DIM), dtype=np.float32)}
        if variant == "state":
            out[ENV_STATE] = rng.random((b, 2, ENV_DIM), dtype=np.float32)
        else:
            out[IMAGE] = rng.integers(0, 256, (b, 2, IMAGE_SIDE, IMAGE_SIDE, 3), dtype=np.uint8)
        return out

    return policy.sample, make_input


def _lerobot(variant: str, down: list[int]):
    try:
        from lerobot.configs.types import FeatureType, PolicyFeature
        from lerobot.policies.diffusion.configuration_diffusion import DiffusionConfig
        from lerobot.policies.diffusion.modeling_diffusion import DiffusionModel
    except ImportError:
        return None
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


def _write(path: Path, command: str, down: list[int], args, lines: list[str]) -> None:
    import platform

    import torch as _t

    try:
        import lerobot

        lr = f"lerobot {lerobot.__version__}"
    except ImportError:
        lr = "lerobot not installed (no baseline column)"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        "# Chunk inference latency (CPU)\n\n"
        f"Command: `.venv/bin/python {command}`  \n"
        f"Machine: 2-core CPU, no GPU (shared with other jobs), {args.threads} torch thread(s); "
        f"{platform.python_version()}, torch {_t.__version__}, {lr}; date {datetime.date.today().isoformat()}.\n\n"
        f"Config: n_obs_steps 2, chunk 16, U-Net down_dims {down}, kernel 5, 10 DDIM steps (diffusion) / 10 Euler "
        "steps (flow); `state` = state (6) + environment state (8); `image` = state + one 96x96 camera through "
        "ResNet-18 (GroupNorm, spatial softmax, 84x84 centre crop). Ours: `ChunkPolicy.sample` from raw numpy "
        "observations; LeRobot: `DiffusionModel.generate_actions` on ready tensors. Ratio = p50 / LeRobot p50 "
        "(same run, calls interleaved).\n\n"
        "| variant | model | batch | p50 ms | p99 ms | vs LeRobot |\n|---|---|---|---|---|---|\n"
        + "\n".join(lines)
        + "\n"
    )


if __name__ == "__main__":
    raise SystemExit(main())
