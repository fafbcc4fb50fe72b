"""The main job (``make demo`` / ``policylink demo``): record scripted demos, train Diffusion Policy and a
flow-matching policy on state observations, evaluate both on held-out seeds on every task, and write a report.

Every step is resumable: a store with enough episodes is reused, a finished checkpoint is reused, and
evaluation shards already written are kept, so an interrupted demo continues where it stopped. A changed
``eval_episodes`` keeps the episodes already evaluated and runs only the missing ones; a changed ``eval_seed``
evaluates the cells again.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from policylink.configs import CONFIG_ROOT

CONFIG_DIR = CONFIG_ROOT / "train"  # the shipped train configs: package data, found from a wheel install too
FAST_TEMPLATE = "{policy}_{env}_state_fast.yaml"
FULL_COMMAND = (
    'make demo DEMO_ARGS="--train_config {policy}_{env}_state.yaml --eval_episodes 100 --out outputs/demo_full"'
)
FAST_NOTE = (
    "These are the fast configs (2,000 steps on push, 1,000 on reach), and a rate is known only to within its "
    "interval: the README's 'What to expect' gives the measured ranges. Its 99% on push comes from the full "
    f"configs:\n  {FULL_COMMAND}"
)


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
        device: torch device: ``"auto"`` (CUDA when present), ``"cpu"`` or ``"cuda[:N]"``.
    """

    envs: list[str] = field(default_factory=lambda: ["push", "reach"])
    policies: list[str] = field(default_factory=lambda: ["diffusion", "flow"])
    demos: list[int] = field(default_factory=lambda: [200, 100])
    train_config: str = FAST_TEMPLATE
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
        ValueError: any bad setting (:func:`validate_demo`), before anything is recorded or trained.
    """
    from policylink.evaluate import report
    from policylink.evaluate.nxm import evaluate

    validate_demo(cfg)
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
        on_mismatch="redo",
    )
    page = eval_dir / "report.html"
    table = report.markdown_table(summaries)
    print("\n== success rates (policy x env), 95% Wilson intervals\n")
    print(table)
    if cfg.train_config == FAST_TEMPLATE:
        print(FAST_NOTE)
    print(f"report: {page}\ntotal time: {(time.perf_counter() - t0) / 60:.1f} min")
    return summaries


def validate_demo(cfg: DemoConfig) -> None:
    """Check every setting of ``cfg`` before any work starts (a missing train config must not surface after
    minutes of recording).

    Raises:
        UnknownNameError: (a ValueError) an unregistered env or an unknown policy type, checked first; the message
            names the field, the names and the closest one.
        ValueError: ``demos`` and ``envs`` differ in length, a count < 1 (``demos``, ``eval_episodes``), a
            negative ``steps``/``workers``/``videos``, or a train config template missing for some (policy, env);
            the message names the field, expected and received.
    """
    from policylink.adapters.registry import UnknownNameError, check_env_name, unknown_name_message
    from policylink.policies.registry import known_policy_types

    for env in cfg.envs:  # names first: `--envs pushh` is a typo, not a count mismatch
        check_env_name(env, "envs")
    types = sorted(known_policy_types())
    for policy in cfg.policies:
        if policy not in types:
            raise UnknownNameError(unknown_name_message("policies", policy, types))
    if len(cfg.demos) != len(cfg.envs):
        raise ValueError(
            f"demos: expected one count per env ({len(cfg.envs)}: {cfg.envs}), received {len(cfg.demos)}: {cfg.demos}"
        )
    bad = [n for n in cfg.demos if n < 1]
    if bad or cfg.eval_episodes < 1:
        raise ValueError(f"demos, eval_episodes: expected counts >= 1, received {cfg.demos}, {cfg.eval_episodes}")
    for name in ("steps", "workers", "videos"):
        if getattr(cfg, name) < 0:
            raise ValueError(f"{name}: expected >= 0, received {getattr(cfg, name)}")
    missing = [
        CONFIG_DIR.name + "/" + cfg.train_config.format(policy=p, env=e)
        for p in cfg.policies
        for e in cfg.envs
        if not (CONFIG_DIR / cfg.train_config.format(policy=p, env=e)).is_file()
    ]
    if missing:
        have = sorted(f.name for f in CONFIG_DIR.glob("*.yaml"))
        raise ValueError(
            f"train_config: expected a file under {CONFIG_DIR} for every (policy, env), missing {missing} "
            f"(--train_config {cfg.train_config!r}; available: {', '.join(have)})"
        )


def main(argv: list[str]) -> int:
    """``policylink demo [--envs push,reach] [--eval_episodes 50] [--out outputs/demo] ...``."""
    from policylink.cli.app import parse_config

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

    from policylink.configs import load_config
    from policylink.train.imitation import TrainConfig, train

    template = CONFIG_DIR / cfg.train_config.format(policy=policy, env=env)  # checked by validate_demo
    last = run_dir / "checkpoints" / "last"
    done = run_dir / "done.json"
    if done.is_file() and last.is_dir():
        print(f"== {policy} on {env}: reusing the trained checkpoint {last}")
        return last
    tcfg = draccus.decode(TrainConfig, load_config(template))  # the template with its base files merged
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
