"""``policylink finetune critic`` and ``policylink finetune qvgm``: train a chunk IQL critic on a replay buffer,
then fine-tune a flow policy with Q-VGM (or, as the same-buffer baseline, filtered BC) into an ordinary
checkpoint that loads, evaluates and serves with no critic.

Examples::

    policylink finetune critic --policy outputs/qvgm/base_s0/checkpoints/last --buffer outputs/qvgm/buf.zarr \
        --out outputs/qvgm/critic
    policylink finetune qvgm --policy outputs/qvgm/base_s0/checkpoints/last --buffer outputs/qvgm/buf.zarr \
        --critic outputs/qvgm/critic --out outputs/qvgm/qvgm_policy
    policylink finetune qvgm --method bc --only_success true ...   # filtered BC on the same buffer
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch

from policylink.adapters.capabilities import Prediction
from policylink.adapters.config_checks import require_counts, require_positive
from policylink.adapters.registry import UnknownNameError, unknown_name_message
from policylink.policies.critics import CriticConfig
from policylink.policies.finetune.qvgm import QVGMConfig
from policylink.policies.serialization import load_json, save_json
from policylink.train.objectives import available_objectives, objective_class, objective_loss
from policylink.train.qvgm_objectives import FINETUNE_QVGM, PolicyFinetune
from policylink.train.trainer import OptimConfig, Optimization, fit, tty_progress

FINETUNE_CRITIC = "finetune critic"
METHOD_OBJECTIVES = {"qvgm": "qvgm", "bc": "imitation", "awr": "critic_awr"}
"""``--method`` -> the registered objective it trains (any other method value names an objective directly)."""
METHODS = tuple(METHOD_OBJECTIVES)
OPTION_FLAGS = {"beta": "awr_beta", "max_weight": "awr_max_weight"}
"""An objective option -> the ``finetune qvgm`` flag that sets it, where the names differ."""
LINEAGE_FILE = "lineage.json"
SOURCE_FILE = "critic_source.json"


@dataclass(frozen=True)
class CriticCmdConfig(CriticConfig):
    """``policylink finetune critic``: an IQL chunk critic (objective ``iql``) on a replay buffer: the settings of
    :class:`~policylink.policies.critics.CriticConfig` (``gamma``, ``expectile``, ``n_heads``, ``hidden_dim``,
    ``n_layers``, ``polyak``, ``lr``) plus the job's. The critic's shape is not an option: its state and action
    widths come from the policy, its horizon from ``horizon``.

    Attributes:
        policy: checkpoint folder of the frozen policy whose encoder gives the critic's latents.
        buffer: episode store with per-step reward / done (/ terminated) of that policy's env.
        out: folder for critic.safetensors, critic.json and critic_metrics.csv.
        horizon: executed steps H per chunk transition (0 = the policy's n_action_steps).
        hidden_dim: width of each head's hidden layers.
        n_layers: hidden layers per head.
        steps: gradient steps.
        batch_size: transitions per step.
        seed: seed of the initialisation and of the batch draws.
        torch_threads: intra-op CPU threads (0 = torch's default).
    """

    state_dim: ClassVar[int] = 0  # type: ignore[misc]  # set by critic_config from the policy, not a flag
    action_dim: ClassVar[int] = 0  # type: ignore[misc]
    horizon: int = 0
    policy: str = ""
    buffer: str = ""
    out: str = "outputs/finetune/critic"
    steps: int = 3000
    batch_size: int = 256
    seed: int = 0
    torch_threads: int = 1

    def critic_config(self, state_dim: int = 1, action_dim: int = 1, horizon: int = 1) -> CriticConfig:
        """The :class:`~policylink.policies.critics.CriticConfig` of these options for the given shape."""
        settings = {f.name: getattr(self, f.name) for f in fields(CriticConfig)}
        return CriticConfig(**{**settings, "state_dim": state_dim, "action_dim": action_dim, "horizon": horizon})

    def validate(self, prefix: str = "") -> CriticCmdConfig:  # type: ignore[override]
        """Return self if every value is usable (no file is read). Raises ValueError naming the field (``prefix``
        before it: ``critic.`` in the loop), the expected and the received value."""
        require_counts(self, prefix, steps=1, batch_size=1, horizon=0, torch_threads=0)
        require_positive(self, "lr", prefix=prefix)
        self.critic_config().validate()
        return self

    def check_horizon(self, spec: Any, prefix: str = "") -> None:
        """Refuse a ``horizon`` longer than the policy's chunk (``spec.chunk_size``). Raises ValueError naming
        ``{prefix}horizon``."""
        if self.horizon > spec.chunk_size:
            raise ValueError(f"{prefix}horizon: expected <= {spec.chunk_size} (the policy's chunk_size), received "
                             f"{self.horizon}")  # fmt: skip


@dataclass(frozen=True)
class QVGMCmdConfig(QVGMConfig):
    """``policylink finetune qvgm``: fine-tune a flow policy on a replay buffer: the Q-VGM settings of
    :class:`~policylink.policies.finetune.qvgm.QVGMConfig` (``last_steps``, ``ascent_steps``, ``step_size``,
    ``trust_radius``, ``alpha``, ``bc_weight``, ``pessimism``, ``candidates``, ``anchor``, ``target``) plus the job's.

    Attributes:
        policy: checkpoint folder of the flow policy to improve (and the frozen reference of the critic).
        buffer: episode store (rollouts with rewards) of the policy's env.
        critic: folder written by ``policylink finetune critic`` (needed by method qvgm).
        out: checkpoint folder of the fine-tuned policy (an ordinary flow checkpoint + lineage.json).
        method: ``qvgm`` (velocity matching toward critic-improved chunks + lambda_bc x flow matching),
            ``bc`` (flow matching only: with only_success, the filtered-BC baseline) or ``awr`` (flow matching
            weighted by min(exp(A / awr_beta), awr_max_weight) with the critic's chunk advantage: the
            advantage-weighted baseline): the objectives qvgm, imitation and critic_awr; or the name of another
            objective registered for finetune qvgm (a plug-in), whose options take the flags of the same name.
        only_success: train on the buffer's successful episodes only.
        bc_only_success: method qvgm: the flow-matching term uses the successful episodes only while the
            velocity-matching term uses every episode (flow matching on a mostly failed buffer pulls the policy
            toward its failures).
        bc_buffer: method qvgm: an episode store for the flow-matching term instead of the buffer (e.g. the
            base policy's own training demos; with bc_only_success, its successful episodes).
        awr_beta: method awr: temperature on the batch-standardised advantage.
        awr_max_weight: method awr: weight cap w_max.
        steps: optimizer steps.
        batch_size: windows per step.
        lr: AdamW learning rate (constant).
        grad_clip: max gradient norm.
        seed: seed of the batch and noise draws.
        torch_threads: intra-op CPU threads (0 = torch's default).
        base: lineage: the original base checkpoint (default: policy).
        round: lineage: the loop round that produced this checkpoint.
    """

    policy: str = ""
    buffer: str = ""
    critic: str = ""
    out: str = "outputs/finetune/policy"
    method: str = "qvgm"
    only_success: bool = False
    bc_only_success: bool = False
    bc_buffer: str = ""
    awr_beta: float = 1.0
    awr_max_weight: float = 20.0
    steps: int = 500
    batch_size: int = 64
    lr: float = 1e-4
    grad_clip: float = 10.0
    seed: int = 0
    torch_threads: int = 1
    base: str = ""
    round: int = 0

    def qvgm_config(self) -> QVGMConfig:
        """The :class:`~policylink.policies.finetune.qvgm.QVGMConfig` part of these options."""
        return QVGMConfig(**{f.name: getattr(self, f.name) for f in fields(QVGMConfig)})

    def validate(self, prefix: str = "") -> QVGMCmdConfig:  # type: ignore[override]
        """Return self if every value is usable (no file is read; ``last_steps`` against the sampler's steps is
        checked once the policy is loaded). Raises ValueError naming the field (``prefix`` before it: ``qvgm.`` in
        the loop; the Q-VGM settings are always named ``qvgm.*``), the expected and the received value; an
        unknown ``method`` is an :class:`~policylink.adapters.registry.UnknownNameError` listing the choices."""
        self.objective(prefix)
        require_counts(self, prefix, steps=1, batch_size=1, torch_threads=0)
        require_positive(self, "lr", "grad_clip", "awr_beta", "awr_max_weight", prefix=prefix)
        self.qvgm_config().validate()
        return self

    def objective(self, prefix: str = "") -> str:
        """The registered objective ``method`` trains: :data:`METHOD_OBJECTIVES` (``qvgm``, ``bc`` -> ``imitation``,
        ``awr`` -> ``critic_awr``), else ``method`` itself when it names an objective ``finetune qvgm`` builds.

        Raises:
            UnknownNameError: naming ``{prefix}method``, the methods and those objectives.
        """
        choices = sorted({*METHODS, *available_objectives(FINETUNE_QVGM)})
        if self.method not in choices:
            raise UnknownNameError(unknown_name_message(f"{prefix}method", self.method, choices))
        return METHOD_OBJECTIVES.get(self.method, self.method)

    def objective_options(self, name: str) -> dict[str, Any]:
        """The options of objective ``name`` these flags set: each option's flag of the same name (or its
        :data:`OPTION_FLAGS` name); options without a flag keep the objective's default."""
        flags = {f.name for f in fields(self)}
        names = [f.name for f in fields(objective_class(name))]
        return {n: getattr(self, OPTION_FLAGS.get(n, n)) for n in names if OPTION_FLAGS.get(n, n) in flags}


def load_base(path: str, require_flow: bool) -> tuple[Any, Any, Any, Any, dict[str, Any]]:
    """``(config, spec, model, processors, train section of the checkpoint's config)`` of checkpoint ``path``
    (``processors``: its chain, whose ``normalizer`` holds the statistics).

    Raises:
        ValueError: ``require_flow`` and the checkpoint's sampler does not predict a velocity (a diffusion
            checkpoint), or an empty path.
        CheckpointError / FileNotFoundError: not a checkpoint folder.
    """
    from policylink.policies.checkpoint import load_components, read_checkpoint_config
    from policylink.policies.model import GenerativeChunkModel

    if not path:
        raise ValueError("policy: expected a checkpoint folder (--policy CKPT), received ''")
    cfg, spec, model, processors = load_components(path)
    prediction = model.sampler.prediction if isinstance(model, GenerativeChunkModel) else None
    if require_flow and prediction != Prediction.VELOCITY:
        what = "no sampler" if prediction is None else f"{prediction.value} prediction"
        raise ValueError(
            f"policy: expected a flow policy (velocity sampler) for Q-VGM, received a {cfg.type!r} checkpoint "
            f"({what}) at {path}"
        )
    doc = read_checkpoint_config(path) or {}
    return cfg, spec, model, processors, dict(doc.get("train") or {})


def open_buffer(path: str, model: Any, train_doc: dict[str, Any], field: str = "buffer", rewards: bool = True):
    """The store at ``path`` (option ``field``), checked against the policy
    (:func:`~policylink.policies.finetune.transitions.check_buffer`: rewards present when ``rewards``, same env as
    the policy's training data, its features)."""
    from policylink.data.buffer import EpisodeStore
    from policylink.policies.finetune.transitions import check_buffer

    if not path or not Path(path).exists():
        what = "an episode store with rewards" if rewards else "an episode store"
        raise FileNotFoundError(f"{field}: expected {what}, {path!r} not found")
    store = EpisodeStore(path, "r")
    check_buffer(store, (train_doc.get("dataset") or {}).get("env") or None, list(model.features), rewards, field)
    return store


def train_critic(cfg: CriticCmdConfig) -> Path:
    """Train and save a :class:`~policylink.policies.critics.ChunkCritic`; returns ``cfg.out``."""
    from policylink.policies.finetune.transitions import build_transitions
    from policylink.runtime.checks import require_output_folder
    from policylink.train.critic import IQL_OBJECTIVE, iql_optimization

    require_output_folder(cfg.out, policy=cfg.policy, buffer=cfg.buffer)
    _threads(cfg.validate().torch_threads)
    _, spec, model, processors, train_doc = load_base(cfg.policy, require_flow=False)
    cfg.check_horizon(spec)
    store = open_buffer(cfg.buffer, model, train_doc)
    horizon = cfg.horizon or spec.n_action_steps
    cache = build_transitions(store, model, processors, horizon, cfg.gamma)
    torch.manual_seed(cfg.seed)
    critic_config = cfg.critic_config(int(cache.state.shape[1]), spec.action.dim, horizon)
    objective = objective_loss(IQL_OBJECTIVE, None, asdict(critic_config), command=FINETUNE_CRITIC)
    critic = objective.critic
    run = iql_optimization(objective)
    rng = np.random.default_rng(cfg.seed)
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    every = max(cfg.steps // 20, 1)
    step_loss = lambda _: objective(cache.batch(rng.integers(0, len(cache), cfg.batch_size)))  # noqa: E731
    for done in fit(step_loss, run, cfg.steps, progress=tty_progress("critic")):
        if done.step % every == 0 or done.step == cfg.steps:
            rows.append({"step": done.step, **done.metrics})
    critic.save(out)
    _write_csv(out / "critic_metrics.csv", rows)
    save_json(out / SOURCE_FILE, {"policy": cfg.policy, "buffer": cfg.buffer})
    return out


def finetune_policy(cfg: QVGMCmdConfig) -> Path:
    """Fine-tune ``cfg.policy`` on ``cfg.buffer`` with ``cfg.method``; returns the checkpoint folder.

    Raises:
        ValueError: a bad option (:meth:`QVGMCmdConfig.validate`), an ``out`` that would replace an input or is a
            file, a diffusion checkpoint with qvgm, a bad buffer, no successful episode with ``only_success``, a
            missing critic or one that does not fit the policy (:func:`check_critic`).
    """
    from policylink.policies.checkpoint import save_checkpoint
    from policylink.runtime.checks import require_output_folder
    from policylink.train.losses import BatchFields, training_batch

    _threads(cfg.validate().torch_threads)
    require_output_folder(cfg.out, policy=cfg.policy, buffer=cfg.buffer, critic=cfg.critic, bc_buffer=cfg.bc_buffer)
    name = cfg.objective()
    requires = objective_class(name, "method", FINETUNE_QVGM).requires
    pcfg, spec, model, processors, train_doc = load_base(cfg.policy, require_flow="flow" in requires)
    store = open_buffer(cfg.buffer, model, train_doc)
    if "critic" in requires:
        if not cfg.critic:
            raise ValueError(f"critic: expected the folder of policylink finetune critic (--critic DIR) for method "
                             f"{cfg.method}, received ''")  # fmt: skip
        check_critic(cfg.critic, model, spec, (cfg.policy, cfg.base))
    ds = _windows(store, pcfg, model, processors, cfg.only_success, cfg.buffer)
    bc_ds = None  # Q-VGM's flow-matching term on other windows (batch["bc"])
    if name == "qvgm" and cfg.bc_buffer:
        bc_store = open_buffer(cfg.bc_buffer, model, train_doc, "bc_buffer", rewards=False)
        bc_ds = _windows(bc_store, pcfg, model, processors, cfg.bc_only_success, cfg.bc_buffer)
    elif name == "qvgm" and cfg.bc_only_success and not cfg.only_success:
        bc_ds = _windows(store, pcfg, model, processors, True, cfg.buffer)
    context = PolicyFinetune(pcfg, model, cfg.critic if "critic" in requires else "")
    loss_fn = objective_loss(name, context, cfg.objective_options(name), command=FINETUNE_QVGM, field="method")
    metrics_names = tuple(getattr(loss_fn, "metrics", ()))

    def step_loss(step: int) -> tuple[torch.Tensor, dict[str, float]]:
        model.train()
        rng = np.random.default_rng([cfg.seed, step])
        batch = training_batch(ds, rng.integers(0, len(ds), cfg.batch_size), BatchFields(), "cpu")
        if bc_ds is not None:
            batch["bc"] = training_batch(bc_ds, rng.integers(0, len(bc_ds), cfg.batch_size), BatchFields(), "cpu")
        batch["noise"] = loss_fn.draw(model, cfg.batch_size, torch.Generator().manual_seed(cfg.seed * 100003 + step))
        return loss_fn(model, batch, step)

    run = Optimization(model, OptimConfig("adamw", lr=cfg.lr, weight_decay=1e-6, grad_clip=cfg.grad_clip))
    rows, t0, acc = [], time.perf_counter(), {}
    every = max(cfg.steps // 10, 1)
    for done in fit(step_loss, run, cfg.steps, progress=tty_progress(f"finetune {cfg.method}")):
        for k, v in {"loss": done.loss.item(), **done.metrics}.items():
            acc[k] = acc.get(k, 0.0) + v
        if done.step % every == 0 or done.step == cfg.steps:
            n = every if done.step % every == 0 else done.step % every
            rows.append({"step": done.step, **{k: v / n for k, v in acc.items()}})
            acc = {}
    lineage = {
        "base": cfg.base or cfg.policy,
        "parent": cfg.policy,
        "buffer": cfg.buffer,
        "method": cfg.method,
        "critic": context.critic_path,
        "round": cfg.round,
        "steps": cfg.steps,
        "wall_s": round(time.perf_counter() - t0, 1),
        "metrics": list(metrics_names),
    }
    train_config = {**train_doc, "finetune": asdict(cfg)}
    out = save_checkpoint(
        cfg.out,
        model=model.eval(),
        spec=spec,
        train_config=train_config,
        processors=processors,
    )
    save_json(out / LINEAGE_FILE, lineage)
    _write_csv(out / "finetune_metrics.csv", rows)
    return out


def check_critic(path: str, model: Any, spec: Any, policies: Sequence[str] = ()) -> None:
    """Refuse a critic folder (``critic.json`` of ``policylink finetune critic``) whose state or action width, or
    horizon, does not fit the policy ``model`` / ``spec``: a critic trained for another env or policy. A critic
    trained with a policy path outside ``policies`` gets a one-line warning only (checkpoints get copied).

    Raises:
        FileNotFoundError: no ``critic.json`` in ``path``.
        ValueError: naming ``critic``, the policy's value and the critic's.
    """
    from policylink.policies.critics import CRITIC_CONFIG, critic_state_dim

    file = Path(path) / CRITIC_CONFIG
    if not file.is_file():
        raise FileNotFoundError(f"critic: expected {file} (policylink finetune critic --out)")
    saved = load_json(file)
    for name, want in (("state_dim", critic_state_dim(model)), ("action_dim", spec.action.dim)):
        if saved.get(name) != want:
            raise ValueError(f"critic: expected {name} {want} (the policy's), received {saved.get(name)} in "
                             f"{str(path)!r} (a critic of another env or policy?)")  # fmt: skip
    if not 1 <= int(saved.get("horizon", 0)) <= spec.chunk_size:
        raise ValueError(f"critic: expected horizon <= {spec.chunk_size} (the policy's chunk_size), received "
                         f"{saved.get('horizon')} in {str(path)!r}")  # fmt: skip
    source = Path(path) / SOURCE_FILE
    trained_with = load_json(source).get("policy") if source.is_file() else None
    known = {Path(p).resolve() for p in policies if p}
    if trained_with and known and Path(trained_with).resolve() not in known:
        print(f"warning: critic {str(path)!r} was trained with policy {trained_with!r}, not "
              f"{' / '.join(repr(p) for p in policies if p)}", file=sys.stderr)  # fmt: skip


def _windows(store, pcfg, model, processors, only_success: bool, path: str):
    """The training windows (:class:`~policylink.data.sampler.SequenceDataset`) of ``store`` for the policy
    config ``pcfg``: every episode, or the successful ones only.

    Raises:
        ValueError: ``only_success`` and the buffer holds no successful episode.
    """
    from policylink.data.sampler import SequenceDataset
    from policylink.policies.processing import window_horizon

    episodes = None
    if only_success:
        episodes = [i for i, m in enumerate(store.all_meta()) if m.success]
        if not episodes:
            raise ValueError(f"only_success: the buffer {path!r} holds no successful episode")
    return SequenceDataset(
        store,
        **processors.window_args(),
        horizon=window_horizon(pcfg.n_obs_steps, pcfg.chunk_size),
        obs_keys=list(model.features),
        episodes=episodes,
        processors=processors,
    )


def _threads(n: int) -> None:
    if n > 0:
        torch.set_num_threads(n)


def _write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    import csv

    if not rows:
        return
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


__all__ = [
    "METHODS",
    "METHOD_OBJECTIVES",
    "CriticCmdConfig",
    "QVGMCmdConfig",
    "check_critic",
    "finetune_policy",
    "load_base",
    "open_buffer",
    "train_critic",
]
