"""``policylink finetune loop``: learn from experience, no new demos. Per round: (a) record the current policy's
rollouts (rewards, success, true terminations) into the replay buffer through the one rollout loop, (b) train
the chunk critic on the whole buffer, (c) Q-VGM from the current policy, (d) evaluate on held-out seeds; with
``--baselines`` also best-of-N reranking of the base policy with the round's critic, filtered BC of the base
on the buffer's successes and advantage-weighted flow matching of the base with the round's critic. Writes
``rounds.csv``, ``rounds.md`` and ``rounds.png``; a re-run resumes after the last finished stage.

Example::

    policylink finetune loop --policy outputs/qvgm/base_s0/checkpoints/last --env push --rounds 3 --episodes 50 \
        --out outputs/qvgm/loop_s0
"""

from __future__ import annotations

import csv
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from policylink.policies.serialization import load_json, save_json
from policylink.train.qvgm import CriticCmdConfig, QVGMCmdConfig, finetune_policy, train_critic

BASELINES = ("rerank", "bc", "awr")
SET_BY_LOOP = {"critic": ("policy", "buffer", "out"), "qvgm": ("policy", "buffer", "critic", "out", "method", "base",
                                                              "round")}  # fmt: skip


@dataclass
class LoopConfig:
    """Learn from experience without new demos: each round records the current policy's rollouts into one replay
    buffer, trains a chunk critic on it, fine-tunes the policy with Q-VGM and evaluates it on held-out seeds (a
    re-run resumes). The --critic.* and --qvgm.* options tune those steps; their policy, buffer, critic, out,
    method, base and round are set by the loop per round and are refused when given.

    Attributes:
        policy: base flow checkpoint (the few-shot policy).
        env: registered env of its training data.
        rounds: learn-from-experience rounds R.
        episodes: rollouts recorded per round (the buffer grows by this many).
        out: run folder (buffer.zarr, round_NN/{critic,policy,...}, rounds.csv/md/png).
        record_seed: reset seed of the first recorded rollout (round r uses record_seed + (r - 1) * episodes).
        demos: episode store (with rewards) the buffer starts from, e.g. the base policy's own training demos
            (no new demos: the data the few-shot policy was trained on); empty = the policy's rollouts only.
        eval_episodes: held-out evaluation rollouts after each round.
        eval_seed: reset seed of the first held-out rollout.
        num_envs: parallel envs for recording and evaluation (0 = one per episode).
        baselines: also evaluate ``rerank`` (best-of-N of the base with the round's critic), ``bc`` (filtered
            BC: the base fine-tuned on the buffer's successful episodes) and/or ``awr`` (the base fine-tuned by
            flow matching weighted with the round's critic's advantage, ``finetune qvgm --method awr``).
        rerank_n: samples per chunk of the reranking baseline.
        critic: ``policylink finetune critic`` options (policy, buffer and out are set per round).
        qvgm: ``policylink finetune qvgm`` options (policy, buffer, critic, out and method are set per round).
    """

    policy: str = ""
    env: str = ""
    rounds: int = 3
    episodes: int = 50
    out: str = "outputs/finetune/loop"
    record_seed: int = 10_000
    demos: str = ""
    eval_episodes: int = 50
    eval_seed: int = 100_000
    num_envs: int = 0
    baselines: list[str] = field(default_factory=list)
    rerank_n: int = 32
    critic: CriticCmdConfig = field(default_factory=CriticCmdConfig)
    qvgm: QVGMCmdConfig = field(default_factory=QVGMCmdConfig)

    hidden_options: ClassVar[tuple[str, ...]] = tuple(f"{k}.{n}" for k, names in SET_BY_LOOP.items() for n in names)


def run_loop(cfg: LoopConfig) -> list[dict[str, Any]]:
    """Run (or resume) the rounds; returns the per-round rows (also written to ``out/rounds.csv``).

    Raises:
        FileNotFoundError: ``demos`` given but not found.
        ValueError: a bad option (:func:`check_loop`), all found before anything is recorded or written.
    """
    train_doc = check_loop(cfg)
    env_kwargs = _env_kwargs(train_doc)
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    buffer = str(out / "buffer.zarr")
    if cfg.demos and not Path(buffer).exists():
        from policylink.data.merge import MergeConfig, merge

        merge(MergeConfig(inputs=[cfg.demos], out=buffer))
    state_file = out / "rounds.json"
    rows: list[dict[str, Any]] = load_json(state_file) if state_file.exists() else []
    if not rows:
        rows.append({"round": 0, "method": "base", **_evaluate(cfg, cfg.policy, env_kwargs)})
    current = cfg.policy
    for r in range(1, cfg.rounds + 1):
        rdir = out / f"round_{r:02d}"
        if any(row["round"] == r and row["method"] == "qvgm" for row in rows):
            current = str(rdir / "policy")
            continue
        rec = _record(cfg, current, buffer, cfg.record_seed + (r - 1) * cfg.episodes, env_kwargs)
        critic_dir = train_critic(replace(cfg.critic, policy=cfg.policy, buffer=buffer, out=str(rdir / "critic")))
        q = replace(cfg.qvgm, policy=current, buffer=buffer, critic=str(critic_dir), out=str(rdir / "policy"))
        current = str(finetune_policy(replace(q, method="qvgm", base=cfg.policy, round=r)))
        new = [{"round": r, "method": "qvgm", "buffer_success": rec, **_evaluate(cfg, current, env_kwargs)}]
        if "bc" in cfg.baselines:
            bc = replace(q, policy=cfg.policy, method="bc", only_success=True, out=str(rdir / "filtered_bc"))
            new.append({"round": r, "method": "filtered_bc", **_evaluate(cfg, str(finetune_policy(bc)), env_kwargs)})
        if "awr" in cfg.baselines:
            awr = replace(q, policy=cfg.policy, method="awr", out=str(rdir / "awr"))
            new.append({"round": r, "method": "awr", **_evaluate(cfg, str(finetune_policy(awr)), env_kwargs)})
        if "rerank" in cfg.baselines:
            new.append({"round": r, "method": "rerank", **_evaluate(cfg, cfg.policy, env_kwargs, critic_dir)})
        rows.extend(new)
        save_json(state_file, rows)
    _report(out, rows)
    return rows


def check_loop(cfg: LoopConfig) -> dict[str, Any]:
    """Check every option of the loop, its ``critic`` and ``qvgm`` sections included, against the base policy and
    the demos store; reads, writes nothing. Returns the train section of the policy's checkpoint config.

    Raises:
        FileNotFoundError: ``demos`` given but not found.
        ValueError: an unregistered env or another env than the policy's, rounds/episodes < 1, an unknown
            baseline, a section option the loop sets, a bad ``critic.*``/``qvgm.*`` value, an ``out`` that is,
            lies in or contains the policy or the demos, a diffusion policy
            (:func:`~policylink.train.qvgm.load_base`), demos of another env or without rewards
            (:func:`~policylink.train.qvgm.open_buffer`).
    """
    from policylink.adapters.registry import available_envs
    from policylink.runtime.checks import require_output_folder
    from policylink.train.qvgm import load_base, open_buffer

    if cfg.env not in available_envs():
        raise ValueError(f"env: expected a registered env ({', '.join(available_envs())}), received {cfg.env!r}")
    if cfg.rounds < 1 or cfg.episodes < 1:
        raise ValueError(f"rounds, episodes: expected >= 1, received {cfg.rounds}, {cfg.episodes}")
    unknown = [b for b in cfg.baselines if b not in BASELINES]
    if unknown:
        raise ValueError(f"baselines: expected a subset of {BASELINES}, received unknown {unknown}")
    for section, names in SET_BY_LOOP.items():
        sub, default = getattr(cfg, section), type(getattr(cfg, section))()
        for name in (n for n in names if getattr(sub, n) != getattr(default, n)):
            raise ValueError(f"{section}.{name}: expected no value (the loop sets it per round), received "
                             f"{getattr(sub, name)!r}")  # fmt: skip
        sub.validate(f"{section}.")
    require_output_folder(cfg.out, policy=cfg.policy, demos=cfg.demos)
    _, spec, model, _, train_doc = load_base(cfg.policy, require_flow=True)
    cfg.qvgm.qvgm_config().validate(model.sampler.num_steps)
    cfg.critic.check_horizon(spec, "critic.")
    trained_on = (train_doc.get("dataset") or {}).get("env")
    if trained_on and trained_on != cfg.env:
        raise ValueError(f"env: expected the policy's env {trained_on!r}, received {cfg.env!r}")
    if cfg.demos:
        open_buffer(cfg.demos, model, train_doc, field="demos").close()
    return train_doc


def _env_kwargs(train_doc: dict[str, Any]) -> dict[str, Any]:
    from policylink.adapters.obs_modes import obs_mode_env_kwargs

    d = train_doc.get("dataset") or {}
    return obs_mode_env_kwargs(d.get("obs_mode", "state"), int(d.get("image_size", 96)))


def load_eval_policy(path: str, critic_dir: str | Path | None = None, rerank_n: int = 32, seed: int = 0):
    """The checkpoint as a PolicyAdapter; with ``critic_dir`` a :class:`~policylink.policies.finetune.rerank.
    BestOfNPolicy` over it (the reference encoder is the checkpoint's own)."""
    from policylink.policies import load_policy
    from policylink.policies.checkpoint import load_components

    if critic_dir is None:
        return load_policy(path, device="cpu", seed=seed)
    from policylink.policies.critics import ChunkCritic
    from policylink.policies.finetune.rerank import BestOfNPolicy

    _, spec, model, processors = load_components(path)
    critic = ChunkCritic.load(critic_dir)
    return BestOfNPolicy(model, processors, spec, critic=critic, n=rerank_n, seed=seed)


def _evaluate(cfg: LoopConfig, path: str, env_kwargs: dict[str, Any], critic_dir=None) -> dict[str, Any]:
    """``{"success", "policy"}`` over ``eval_episodes`` held-out seeds (the rollout loop)."""
    results = _rollouts(cfg, load_eval_policy(path, critic_dir, cfg.rerank_n), cfg.eval_episodes, cfg.eval_seed,
                        env_kwargs, None)  # fmt: skip
    return {"success": float(np.mean([x.success for x in results])), "policy": path}


def _record(cfg: LoopConfig, path: str, buffer: str, seed: int, env_kwargs: dict[str, Any]) -> float:
    """Record ``cfg.episodes`` rollouts of ``path`` into ``buffer``; returns their success rate."""
    from policylink.data.recorder import EpisodeRecorder
    from policylink.runtime.rollout import RegistryEnvFn, env_spec_of

    env = RegistryEnvFn(cfg.env, **env_kwargs)()
    spec = env_spec_of(env)
    env.close()
    with EpisodeRecorder(buffer, env_spec=spec) as rec:
        results = _rollouts(cfg, load_eval_policy(path, seed=seed), cfg.episodes, seed, env_kwargs, rec)
    return float(np.mean([x.success for x in results]))


def _rollouts(cfg, policy, n: int, seed: int, env_kwargs, recorder):
    from policylink.runtime.executors import ExecutorConfig, make_executor
    from policylink.runtime.rollout import RegistryEnvFn, make_vector_env, plan_episodes, rollout

    vec = make_vector_env(RegistryEnvFn(cfg.env, **env_kwargs), plan_episodes(n, seed, cfg.num_envs or n))
    executor = make_executor(policy, ExecutorConfig())
    try:
        return rollout(vec, executor, n, recorder=recorder, source="policy")
    finally:
        executor.close()
        vec.close()


def _report(out: Path, rows: list[dict[str, Any]]) -> None:
    """``rounds.csv``, ``rounds.md`` (a table) and ``rounds.png`` (success per round and method)."""
    keys = ["round", "method", "success", "buffer_success", "policy"]
    with (out / "rounds.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    lines = ["| round | method | success | buffer success |", "|---|---|---|---|"]
    for r in rows:
        b = r.get("buffer_success")
        lines.append(f"| {r['round']} | {r['method']} | {r['success']:.0%} | {'' if b is None else f'{b:.0%}'} |")
    (out / "rounds.md").write_text("\n".join(lines) + "\n")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(5, 3.5))
    base = [r["success"] for r in rows if r["method"] == "base"]
    for method in dict.fromkeys(r["method"] for r in rows if r["method"] != "base"):
        pts = [(0, base[0])] + [(r["round"], r["success"]) for r in rows if r["method"] == method]
        ax.plot(*zip(*pts), marker="o", label=method)
    ax.set_xlabel("round")
    ax.set_ylabel("success (held-out seeds)")
    ax.set_ylim(0, 1)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "rounds.png", dpi=100)
    plt.close(fig)


__all__ = ["LoopConfig", "check_loop", "load_eval_policy", "run_loop"]
