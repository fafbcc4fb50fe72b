"""Advantage-conditioned fine-tuning benchmark (issue 15): on a mixed-quality corpus recorded with the experts'
quality knob, plain BC vs advantage-conditioned training (RECAP-style labels, classifier-free guidance sweep)
vs advantage-weighted regression, all flow policies with the same config and steps, evaluated on held-out seeds.

Every step is a ``policylink`` command (printed, and logged under ``--out``); finished steps are skipped on a
re-run (stores, checkpoints and eval cells that exist). Results: ``<out>/summary.json``.

    MUJOCO_GL=egl .venv/bin/python benchmarks/advantage.py --task push --demos 200 --steps 3000 --episodes 50
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EVAL_SEED = 100_000
MIX = (("expert", 0.3, 0), ("noisy", 0.4, 10_000), ("poor", 0.3, 20_000))  # quality, share, first seed


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; returns 0. See ``--help``."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--task", default="push")
    ap.add_argument("--demos", type=int, default=200, help="episodes in the mixed corpus (30/40/30 split)")
    ap.add_argument("--steps", type=int, default=3000, help="training steps of every policy")
    ap.add_argument("--episodes", type=int, default=50, help="held-out evaluation episodes")
    ap.add_argument("--scales", default="0,1,2", help="CFG weights w to evaluate the conditioned policy with")
    ap.add_argument(
        "--labels",
        default="value",
        help="label source: value (RECAP) or progress (ALTER, ablation: "
        "trains only the conditioned policy, evaluated next to the value run's cells)",
    )
    ap.add_argument("--seed", type=int, default=0, help="training seed")
    ap.add_argument("--awr", type=int, default=1, help="1: also train and evaluate the AWR baseline (value labels)")
    ap.add_argument("--with-bc", type=int, default=0, help="1: evaluate plain BC beside a progress-label run too")
    ap.add_argument("--out", default="outputs/advantage")
    ap.add_argument("--aggregate", action="store_true", help="only print mean and 95%% interval over the seeds' "
                    "summaries in --out (summary_<labels>_s<seed>.json) and write aggregate.json")  # fmt: skip
    args = ap.parse_args(argv)
    os.environ.setdefault("MUJOCO_GL", "egl")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.aggregate:
        return _aggregate(out)
    store = out / f"{args.task}_mixed.zarr"
    for quality, share, first in MIX:
        n = round(args.demos * share)
        _run(out, f"record_{quality}", ["record", "--env", args.task, "--expert", quality, "--episodes", str(n),
             "--seed", str(first), "--out", str(store)], skip=_recorded(store, quality))  # fmt: skip
    config = ROOT / "configs" / "train" / f"flow_{args.task}_state_fast.yaml"
    if not config.exists():
        config = config.with_name(f"flow_{args.task}_state.yaml")
    common = ["--config", str(config), "--dataset.path", str(store), "--steps", str(args.steps), "--progress",
              "false", "--torch_threads", "1", "--seed", str(args.seed), "--dataset.val_fraction", "0"]  # fmt: skip
    # labels from a value model (RECAP, the main result) or from task progress (ALTER, the ablation): own names
    tag = "" if args.labels == "value" else f"_{args.labels}"
    runs = {name: out / f"{name}{tag}_s{args.seed}" for name in ("adv", "awr")}
    runs["bc"] = out / f"bc_s{args.seed}"
    # value labels come from this seed's BC latents: one label set per seed (progress labels are seed-free)
    label_set = f"advantage{tag}" + (f"_s{args.seed}" if args.labels == "value" else "")
    _run(out, "train_bc", ["train", *common, "--output_dir", str(runs["bc"])], skip=_done(runs["bc"]))
    label_args = ["--dataset", str(store), "--source", args.labels, "--seed", str(args.seed), "--name", label_set]
    if args.labels == "value":
        label_args += ["--checkpoint", str(runs["bc"] / "checkpoints" / "last")]
    _run(out, f"label_{args.labels}", ["finetune", "advantage", "label", *label_args])
    _run(out, f"report{tag}", ["dataset", "advantage-report", str(store), "--name", label_set, "--out",
         str(out / f"report{tag}")])  # fmt: skip
    common += ["--advantage.labels", label_set]
    _run(out, f"train_adv{tag}", ["finetune", "advantage", "train", *common, "--output_dir", str(runs["adv"])],
         skip=_done(runs["adv"]))  # fmt: skip
    _run(out, f"train_awr{tag}", ["finetune", "advantage", "train", *common, "--loss", "awr", "--output_dir",
         str(runs["awr"])], skip=_done(runs["awr"]) or bool(tag) or not args.awr)  # fmt: skip
    policies = {"bc": runs["bc"] / "checkpoints" / "last"} if not tag or args.with_bc else {}
    if not tag and args.awr:
        policies["awr"] = runs["awr"] / "checkpoints" / "last"
    for w in args.scales.split(","):
        name = f"adv{tag}_w{w}"
        policies[name] = _with_cfg_scale(runs["adv"] / "checkpoints" / "last", float(w), out / f"{name}_s{args.seed}")
    refs = ",".join(f"{k}={v}" for k, v in policies.items())
    evaluation = [
        "eval",
        "--policies",
        refs,
        "--envs",
        args.task,
        "--episodes",
        str(args.episodes),
        "--seed",
        str(EVAL_SEED),
        "--workers",
        "1",
        "--num_envs",
        "10",
        "--videos",
        "0",
        "--out",
        str(out / f"eval{tag}_s{args.seed}"),
    ]
    _run(out, f"eval{tag}_s{args.seed}", evaluation)  # fmt: skip
    rows = json.loads((out / f"eval{tag}_s{args.seed}" / "results.json").read_text())
    for r in rows:
        print(f"{r['policy']:<10} {r['pc_success']:5.1f}%  [{r['ci95_low']:.0f}, {r['ci95_high']:.0f}]", flush=True)
    (out / f"summary_{args.labels}_s{args.seed}.json").write_text(json.dumps(rows, indent=1))
    return 0


def _aggregate(out: Path) -> int:
    """Per cell over training seeds (``summary_<labels>_s<seed>.json``): mean success with a 95 % Student-t
    interval, and the paired difference to plain BC of the same seed (mean, 95 % t-interval)."""
    from policylink.evaluate.report import seed_interval

    per_seed: dict[str, dict[str, float]] = {}  # seed -> cell -> success %
    for path in sorted(out.glob("summary_*_s*.json")):
        seed = path.stem.rsplit("_s", 1)[1]
        for row in json.loads(path.read_text()):
            per_seed.setdefault(seed, {})[row["policy"]] = float(row["pc_success"])
    names = list(dict.fromkeys(name for cells in per_seed.values() for name in cells))
    table = []
    for name in names:
        vals = [cells[name] for cells in per_seed.values() if name in cells]
        diffs = [cells[name] - cells["bc"] for cells in per_seed.values() if name in cells and "bc" in cells]
        mean, half = seed_interval(vals)
        d_mean, d_half = seed_interval(diffs) if diffs and name != "bc" else (0.0, 0.0)
        table.append({"policy": name, "seeds": len(vals), "per_seed": vals, "mean": mean, "ci95_half": half,
                      "minus_bc_mean": d_mean, "minus_bc_ci95_half": d_half})  # fmt: skip
        print(
            f"{name:<18} n={len(vals)} {mean:5.1f}% +- {half:4.1f}  vs BC {d_mean:+5.1f} +- {d_half:4.1f}  "
            f"{[round(v, 1) for v in vals]}"
        )
    (out / "aggregate.json").write_text(json.dumps(table, indent=1))
    return 0


def _with_cfg_scale(ckpt: Path, w: float, dest: Path) -> Path:
    """A copy of checkpoint ``ckpt`` whose recorded default CFG weight is ``w`` (``policy.cfg_scale``)."""
    if dest.exists():
        shutil.rmtree(dest)
    from policylink.policies.checkpoint import (
        CONFIG_FILE,
        LEGACY_CONFIG_FILE,
        LEGACY_TRAINING_STATE_FILE,
        TRAINING_STATE,
        read_checkpoint_config,
    )
    from policylink.policies.serialization import save_json

    skip = (f"{TRAINING_STATE}.*", LEGACY_TRAINING_STATE_FILE, LEGACY_CONFIG_FILE)
    shutil.copytree(ckpt, dest, ignore=shutil.ignore_patterns(*skip))
    doc = read_checkpoint_config(ckpt)
    doc["policy"]["cfg_scale"] = w
    save_json(dest / CONFIG_FILE, doc)
    return dest


def _recorded(store: Path, quality: str) -> bool:
    if not store.exists():
        return False
    from policylink.data.buffer import EpisodeStore

    return any(m.quality == quality for m in EpisodeStore(store, "r").all_meta())


def _done(run: Path) -> bool:
    return (run / "checkpoints" / "last" / "model.safetensors").exists()


def _run(out: Path, name: str, args: list[str], skip: bool = False) -> None:
    cmd = [str(Path(sys.executable).parent / "policylink"), *args]
    line = "policylink " + " ".join(args)
    if skip:
        print(f"[skip] {line}", flush=True)
        return
    print(f"[run] {line}", flush=True)
    t0 = time.time()
    with (out / f"{name}.log").open("w") as log:
        subprocess.run(cmd, check=True, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    print(f"[done {time.time() - t0:.0f}s] {name}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
