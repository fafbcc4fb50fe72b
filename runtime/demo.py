"""The main job (``make demo`` / ``policylink demo``): record scripted demos, train Diffusion Policy and a
flow-matching policy on state observations, evaluate both on held-out seeds on every task, and write a report.

Every step is resumable: a store with enough episodes is reused, a finished checkpoint is reused, and
evaluation cells already written are skipped, so an interrupted demo continues where it stopped.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs" / "train"


@dataclass
class DemoConfig:
    """``policylink demo``.

    Attributes:
        envs: tasks (registry names); each gets its own demonstrations and its own trained policies.
        policies: policy types to train and compare (``diffusion``, ``flow``).
        demos: expert episodes recorded per task (same order as ``envs``).
        train_config: train config template per (policy, env) under ``configs/train/``; ``{policy}`` and
            ``{env}`` are filled in.
        steps: optimizer steps per training run (0 = the template's own).
        eval_episodes: evaluation episodes per (policy, env) cell, on held-out seeds.
        eval_seed: first evaluation seed (recording uses seeds ``0..demos-1``, so these never overlap).
        workers: evaluation worker processes.
        videos: rollout videos saved per cell.
        out: output folder (data, runs, evaluation, report).
        device: ``auto`` (CUDA when present), ``cpu`` or ``cuda``.
    """

    envs: list[str] = field(default_factory=lambda: ["push", "reach"])
    policies: list[str] = field(default_factory=lambda: ["diffusion", "flow"])
    demos: list[int] = field(default_factory=lambda: [200, 100])
    train_config: str = "{policy}_{env}_state_fast.yaml"
    steps: int = 0
    eval_episodes: int = 50
    eval_seed: int = 100_000
    workers: int = 2
    videos: int = 2
    out: str = "outputs/demo"
    device: str = "auto"


def run_demo(cfg: DemoConfig) -> list[dict[str, Any]]:
    """Run the whole job; returns the evaluation summaries (one per policy x env cell).

    Raises:
        ValueError: ``demos`` and ``envs`` differ in length, or a train config template is missing.
    """
    from policylink.runtime import report
    from policylink.runtime.evaluate import evaluate

    if len(cfg.demos) != len(cfg.envs):
        raise ValueError(f"demos: expected one count per env ({len(cfg.envs)}), received {len(cfg.demos)}")
    out = Path(cfg.out)
    t0 = time.perf_counter()
    for env, n_demos in zip(cfg.envs, cfg.demos):
        store = _record(env, n_demos, out / "data" / f"{env}_state.zarr")
        for policy in cfg.policies:
            _train(cfg, policy, env, store, out / "runs" / f"{policy}_{env}")
    eval_dir = out / "eval"
    print(f"\n== evaluating {', '.join(cfg.policies)} on {', '.join(cfg.envs)}: {cfg.eval_episodes} held-out episodes")
    summaries = evaluate(
        [(policy, str(out / "runs" / f"{policy}_{{env}}" / "checkpoints" / "last")) for policy in cfg.policies],
        list(cfg.envs),
        episodes=cfg.eval_episodes,
        seed=cfg.eval_seed,
        workers=cfg.workers,
        out=eval_dir,
        videos=cfg.videos,
        device="cpu" if cfg.device == "auto" else cfg.device,
        env_kwargs={"obs_mode": "state"},
    )
    page = eval_dir / "report.html"
    table = report.markdown_table(summaries)
    print("\n== success rates (policy x env), 95% Wilson intervals\n")
    print(table)
    print(f"report: {page}\ntotal time: {(time.perf_counter() - t0) / 60:.1f} min")
    return summaries


def main(argv: list[str]) -> int:
    """``policylink demo [--envs push,reach] [--eval_episodes 50] [--out outputs/demo] ...``."""
    from policylink.runtime.cli import parse_config

    run_demo(parse_config(DemoConfig, argv, prog="policylink demo"))
    return 0


def _record(env: str, episodes: int, path: Path) -> Path:
    from policylink.data.buffer import EpisodeStore
    from policylink.runtime.record import RecordConfig, record

    have = 0
    if path.exists():
        with EpisodeStore(str(path), "r") as store:
            have = store.n_episodes
    if have >= episodes:
        print(f"== {env}: reusing {have} recorded episodes in {path}")
        return path
    print(f"== {env}: recording {episodes - have} scripted-expert episodes -> {path}")
    summary = record(RecordConfig(env=env, expert="expert", episodes=episodes - have, out=str(path), seed=have))
    print(f"   {summary}")
    return path


def _train(cfg: DemoConfig, policy: str, env: str, store: Path, run_dir: Path) -> Path:
    import draccus

    from policylink.runtime.train import TrainConfig, train

    template = CONFIG_DIR / cfg.train_config.format(policy=policy, env=env)
    if not template.is_file():
        raise ValueError(f"train_config: expected a file {template} for policy {policy!r} on {env!r}; not found")
    last = run_dir / "checkpoints" / "last"
    done = run_dir / "done.json"
    if done.is_file() and last.is_dir():
        print(f"== {policy} on {env}: reusing the trained checkpoint {last}")
        return last
    with open(template) as f:
        tcfg = draccus.load(TrainConfig, f)
    tcfg.dataset.path = str(store)
    tcfg.output_dir = str(run_dir)
    tcfg.device = cfg.device
    tcfg.resume = True
    if cfg.steps > 0:
        tcfg.steps = cfg.steps
    print(f"== training {policy} on {env} ({tcfg.steps} steps, config {template.name})")
    path = train(tcfg)
    done.write_text(json.dumps({"checkpoint": str(path), "steps": tcfg.steps}))
    return path


def _plain(cfg: DemoConfig) -> dict[str, Any]:
    return {k: getattr(cfg, k) for k in cfg.__dataclass_fields__}
