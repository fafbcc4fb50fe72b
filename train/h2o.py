"""``policylink finetune h2o``: an H2O-style critic (Niu et al. 2022, arXiv 2206.13464) on simulated episodes
(``--sim``: demonstrations or rollouts in nominal simulation) and robot episodes (``--real``: what
``policylink run --robot ... --record`` kept), and advantage labels from it for advantage-conditioned training.

One command, four steps, all optimisation through :func:`policylink.train.trainer.fit`, each loss a registered
objective (``h2o_discriminators``, :class:`DiscriminatorObjectiveConfig`; the critic's ``iql``,
:mod:`policylink.train.critic`, with per-transition weights):

1. per-step transitions ``(s, a, r, s', d)`` of every store (``observation.state``; ``d`` a true termination: the
   ``terminated`` field, else a rewarded step), normalised by the union's mean / std;
2. the dynamics discriminators ``D_sa``, ``D_sas`` (:mod:`policylink.policies.finetune.h2o`) on balanced real /
   simulated batches, then each simulated transition's dynamics ratio ``w`` (real transitions: 1);
3. a one-step IQL critic (:class:`~policylink.policies.critics.ChunkCritic` with ``H = 1``) whose Bellman and
   expectile errors are weighted by ``w``: simulated transitions the robot's dynamics would not produce count
   little, those it would count as much as the robot's own;
4. ``A(s, a) = mean_e Q_e(s, a) - V(s)`` on every step of a new store ``OUT/train.zarr`` (the simulated episodes,
   then the robot's, with the features they share, metadata and reality gap kept), labelled as ``advantage
   label`` does (:func:`~policylink.data.labels.binary_labels`: top ``positive_fraction`` per task positive, the
   last ``failure_window`` steps of failures negative) and then every operator takeover step (``deploy.source ==
   human``) positive, RECAP's rule for interventions.

Then ``policylink finetune advantage train --dataset.path OUT/train.zarr`` trains the conditioned policy.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch

from policylink.data.buffer import DONE_KEY, REWARD_KEY, EpisodeStore
from policylink.data.labels import DEFAULT_LABEL_SET, LabelConfig, binary_labels, write_labels
from policylink.data.recorder import TERMINATED_KEY
from policylink.policies.finetune.h2o import DiscriminatorConfig, DiscriminatorLoss, DynamicsDiscriminators
from policylink.train.critic import IQL_OBJECTIVE, iql_optimization
from policylink.train.objectives import ObjectiveConfig, objective_loss, register_objective
from policylink.train.trainer import OptimConfig, Optimization, fit, tty_progress

STATE_KEY = "observation.state"
SOURCE_KEY = "deploy.source"  # per-step who acted (real.deploy_recorder.DEPLOY_KEYS); 1 = human
HUMAN = 1
H2O_COMMAND = "finetune h2o"
DISCRIMINATOR_OBJECTIVE = "h2o_discriminators"


@dataclass(frozen=True)
class DiscriminatorObjectiveConfig(DiscriminatorConfig, ObjectiveConfig):
    """Objective ``h2o_discriminators``: the options are
    :class:`~policylink.policies.finetune.h2o.DiscriminatorConfig`'s (shape, width, input noise, weight clip,
    learning rate); trains the dynamics discriminators."""

    trains: ClassVar[tuple[str, ...]] = ("discriminators",)
    commands: ClassVar[tuple[str, ...]] = (H2O_COMMAND,)


class DiscriminatorObjective(DiscriminatorLoss):
    """H2O's discriminator loss (Niu et al. 2022, arXiv 2206.13464;
    :class:`~policylink.policies.finetune.h2o.DiscriminatorLoss`) for new :class:`DynamicsDiscriminators` (weights
    from torch's global generator) built from the options. Args: ``context`` (unused), ``**options``
    (:class:`DiscriminatorConfig` fields). Raises ValueError: a bad option (named ``h2o.<field>``)."""

    def __init__(self, context: Any = None, **options: Any):
        super().__init__(DynamicsDiscriminators(DiscriminatorConfig(**options)))


register_objective(DISCRIMINATOR_OBJECTIVE, DiscriminatorObjectiveConfig, DiscriminatorObjective)


@dataclass
class H2OCommand:
    """``policylink finetune h2o``: an H2O critic on simulated and robot episode stores (dynamics discriminators
    weight the simulated transitions), then advantage labels of the union for ``finetune advantage train``.

    Attributes:
        sim: simulated episode stores (nominal-sim demos or rollouts).
        real: robot episode stores (``policylink run --robot ... --record``).
        out: output folder: ``discriminators/``, ``critic/``, ``train.zarr`` (labelled), ``h2o.json`` (summary).
        disc_steps: optimizer steps of the dynamics discriminators.
        critic_steps: optimizer steps of the critic.
        batch_size: transitions per step (the discriminators: half real, half simulated).
        discriminator: :class:`DiscriminatorConfig` fields except the dimensions (``hidden_dim``, ``noise_std``,
            ``weight_min``, ``weight_max``, ``lr``).
        hidden_dim: width of each critic head's hidden layers (:class:`CriticConfig`).
        n_layers: hidden layers per critic head.
        gamma: per-step discount of the critic.
        expectile: IQL expectile tau of the critic, in (0, 1).
        positive_fraction: top fraction of steps per task labelled positive (:class:`LabelConfig`; RECAP: 0.3).
        failure_window: the last this-many steps of a failed episode are labelled negative.
        human_positive: force every operator-takeover step positive.
        labels: label-set name written in ``train.zarr``.
        seed: seeds the networks and the batches.
        torch_threads: CPU threads (0 = torch's default).

    Raises:
        ValueError: no ``sim`` / ``real`` / ``out``, a missing store, counts below 1 (each names the field).
    """

    sim: list[str] = field(default_factory=list)
    real: list[str] = field(default_factory=list)
    out: str = ""
    disc_steps: int = 2000
    critic_steps: int = 3000
    batch_size: int = 256
    discriminator: dict[str, Any] = field(default_factory=dict)
    hidden_dim: int = 256
    n_layers: int = 2
    gamma: float = 0.99
    expectile: float = 0.8
    positive_fraction: float = 0.3
    failure_window: int = 10
    human_positive: bool = True
    labels: str = DEFAULT_LABEL_SET
    seed: int = 0
    torch_threads: int = 1

    def __post_init__(self) -> None:
        for name in ("sim", "real"):
            paths = getattr(self, name)
            if isinstance(paths, str):
                setattr(self, name, [p for p in paths.split(",") if p])
        for name in ("disc_steps", "critic_steps", "batch_size"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name}: expected >= 1, received {getattr(self, name)}")

    def check(self) -> None:
        """Raise ValueError naming the first missing input (before anything is loaded)."""
        for name in ("sim", "real"):
            if not getattr(self, name):
                raise ValueError(
                    f"{name}: expected at least one episode store (--{name} A.zarr[,B.zarr]), received none"
                )
            for p in getattr(self, name):
                if not Path(p).exists():
                    raise ValueError(f"{name}: no episode store at {p!r}")
        if not self.out:
            raise ValueError("out: expected an output folder (--out DIR), received ''")


@dataclass
class Transitions:
    """Per-step transitions of a set of stores (``N`` steps, store order; float32 unless said).

    Attributes:
        state, next_state: ``(N, S)`` raw ``observation.state`` (the next state of an episode's last step is
            itself). action ``(N, A)``. reward ``(N,)``. terminal bool ``(N,)``. human bool ``(N,)``.
        episodes: episodes read per store (a store still being recorded is read as of the call).
    """

    state: np.ndarray
    action: np.ndarray
    next_state: np.ndarray
    reward: np.ndarray
    terminal: np.ndarray
    human: np.ndarray
    episodes: list[int] = field(default_factory=list)

    @classmethod
    def of_stores(cls, paths: list[str]) -> Transitions:
        """The transitions of ``paths`` concatenated. Raises ValueError naming a store without
        ``observation.state``."""
        parts, episodes = [], []
        for p in paths:
            store = EpisodeStore(p, "r")
            if STATE_KEY not in store.keys:
                raise ValueError(f"{p}: the H2O critic reads {STATE_KEY!r}; the store holds {store.keys}")
            keys = [STATE_KEY, "action", REWARD_KEY, DONE_KEY]
            keys += [k for k in (TERMINATED_KEY, SOURCE_KEY) if k in store.keys]
            ends = store.episode_ends  # read once: a store still being recorded is taken as of now
            d = {k: v[: int(ends[-1]) if len(ends) else 0] for k, v in store.load(keys).items()}
            nxt = np.roll(d[STATE_KEY], -1, axis=0)
            last = ends - 1
            nxt[last] = d[STATE_KEY][last]
            reward = d[REWARD_KEY].astype(np.float32)
            term = d[TERMINATED_KEY].astype(bool) if TERMINATED_KEY in d else reward > 0
            human = d[SOURCE_KEY] == HUMAN if SOURCE_KEY in d else np.zeros(len(reward), bool)
            parts.append((d[STATE_KEY], d["action"], nxt, reward, term, human))
            episodes.append(len(ends))
        out = cls(*(np.concatenate(x).astype(x[0].dtype) for x in zip(*parts, strict=True)))
        out.episodes = episodes
        return out


def run_h2o(cmd: H2OCommand) -> dict[str, Any]:
    """Run the four steps of the module docstring; returns (and writes to ``OUT/h2o.json``) the summary: mean
    dynamics weight of the simulated transitions, the critic's last losses, the labels' positive fraction.

    Raises:
        ValueError: see :class:`H2OCommand`; stores whose state or action widths differ.
    """
    cmd.check()
    if cmd.torch_threads:
        torch.set_num_threads(cmd.torch_threads)
    torch.manual_seed(cmd.seed)
    sim, real = Transitions.of_stores(cmd.sim), Transitions.of_stores(cmd.real)
    for name in ("state", "action"):
        if getattr(sim, name).shape[1] != getattr(real, name).shape[1]:
            raise ValueError(f"real: {name} width {getattr(real, name).shape[1]} differs from the simulated stores' "
                             f"{getattr(sim, name).shape[1]}")  # fmt: skip
    out = Path(cmd.out)
    out.mkdir(parents=True, exist_ok=True)
    norm = _normaliser(sim, real)
    disc = train_discriminators(norm(sim), norm(real), cmd)
    disc.save(out / "discriminators")
    s = norm(sim)
    w_sim = disc.weights(s["state"], s["action"], s["next_state"])
    both = {k: torch.cat([s[k], v]) for k, v in norm(real).items()}
    weight = torch.cat([w_sim, torch.ones(len(real.reward))])
    critic, metrics = train_weighted_critic(both, weight, cmd)
    critic.save(out / "critic")
    with torch.no_grad():
        a = both["action"][:, None]
        adv = (critic.q(both["state"], a).mean(0) - critic.value(both["state"])).numpy()
    train_store = out / "train.zarr"
    write_union(cmd.sim + cmd.real, train_store, sim.episodes + real.episodes)
    human = np.concatenate([sim.human, real.human])
    labels, attrs = _labels(train_store, adv, human, cmd)
    summary = {
        "sim_transitions": len(sim.reward),
        "real_transitions": len(real.reward),
        "human_steps": int(human.sum()),
        "sim_weight_mean": float(w_sim.mean()),
        "sim_weight_quantiles": {q: float(w_sim.quantile(q)) for q in (0.1, 0.5, 0.9)},
        "critic": metrics,
        "labels": attrs,
        "command": asdict(cmd),
    }
    (out / "h2o.json").write_text(json.dumps(summary, indent=1, default=str))
    return summary


def _normaliser(*parts: Transitions):
    """A function mapping :class:`Transitions` to normalised float32 tensors (mean / std of the union)."""
    s = np.concatenate([p.state for p in parts]).astype(np.float64)
    a = np.concatenate([p.action for p in parts]).astype(np.float64)
    ms, ss = s.mean(0), np.maximum(s.std(0), 1e-6)
    ma, sa = a.mean(0), np.maximum(a.std(0), 1e-6)

    def f(t: Transitions) -> dict[str, torch.Tensor]:
        return {
            "state": torch.as_tensor((t.state - ms) / ss, dtype=torch.float32),
            "next_state": torch.as_tensor((t.next_state - ms) / ss, dtype=torch.float32),
            "action": torch.as_tensor((t.action - ma) / sa, dtype=torch.float32),
            "reward": torch.as_tensor(t.reward, dtype=torch.float32),
            "terminal": torch.as_tensor(t.terminal, dtype=torch.bool),
        }

    return f


def train_discriminators(sim: dict[str, torch.Tensor], real: dict[str, torch.Tensor], cmd: H2OCommand):
    """Fit :class:`DynamicsDiscriminators` on balanced batches of normalised ``sim`` / ``real`` transitions
    (``state``, ``action``, ``next_state`` tensors) for ``cmd.disc_steps`` steps; returns it (eval mode)."""
    S, A = sim["state"].shape[1], sim["action"].shape[1]
    options = {"state_dim": S, "action_dim": A, **cmd.discriminator}
    loss = objective_loss(DISCRIMINATOR_OBJECTIVE, None, options, command=H2O_COMMAND, field="discriminator")
    disc = loss.disc
    run = Optimization(disc, OptimConfig("adam", lr=disc.cfg.lr))
    g = torch.Generator().manual_seed(cmd.seed)
    half = max(cmd.batch_size // 2, 1)
    y = torch.cat([torch.ones(half), torch.zeros(half)])

    def step_loss(step: int):
        ir = torch.randint(len(real["state"]), (half,), generator=g)
        js = torch.randint(len(sim["state"]), (half,), generator=g)
        batch = {k: torch.cat([real[k][ir], sim[k][js]]) for k in ("state", "action", "next_state")}
        batch["real"], batch["noise"] = y, torch.randn(2 * half, 2 * S + A, generator=g)
        return loss(batch)

    for _ in fit(step_loss, run, cmd.disc_steps, progress=tty_progress("h2o discriminators")):
        pass
    return disc.eval()


def train_weighted_critic(data: dict[str, torch.Tensor], weight: torch.Tensor, cmd: H2OCommand):
    """Fit a one-step IQL :class:`ChunkCritic` on normalised transitions ``data`` (``state``, ``action`` ``(N,
    A)``, ``next_state``, ``reward``, ``terminal``) with per-transition ``weight`` ``(N,)`` on both losses;
    returns ``(critic, last metrics)``."""
    S, A = data["state"].shape[1], data["action"].shape[1]
    options = {"state_dim": S, "action_dim": A, "horizon": 1, "hidden_dim": cmd.hidden_dim, "n_layers": cmd.n_layers,
               "gamma": cmd.gamma, "expectile": cmd.expectile}  # fmt: skip
    objective = objective_loss(IQL_OBJECTIVE, None, options, command=H2O_COMMAND)
    critic = objective.critic
    run = iql_optimization(objective)
    g = torch.Generator().manual_seed(cmd.seed + 1)
    discount = torch.full((cmd.batch_size,), cmd.gamma)
    metrics: dict[str, float] = {}

    def step_loss(step: int):
        i = torch.randint(len(weight), (cmd.batch_size,), generator=g)
        batch = {"state": data["state"][i], "action": data["action"][i][:, None], "return": data["reward"][i],
                 "discount": discount, "terminal": data["terminal"][i], "next_state": data["next_state"][i],
                 "weight": weight[i]}  # fmt: skip
        return objective(batch)

    for done in fit(step_loss, run, cmd.critic_steps, progress=tty_progress("h2o critic")):
        metrics = done.metrics
    return critic.eval(), metrics


def write_union(paths: list[str], out: Path, episodes: list[int] | None = None) -> None:
    """A new episode store ``out`` with the episodes of ``paths`` in order (the first ``episodes[i]`` of store
    ``i``; default all), with the per-step features all of them hold (their metadata, reality gap included,
    kept), replacing an earlier one.

    Raises:
        ValueError: the stores share no observation feature."""
    import shutil

    stores = [EpisodeStore(p, "r") for p in paths]
    keys = sorted(set.intersection(*(set(s.keys) for s in stores)))
    if STATE_KEY not in keys:
        raise ValueError(f"sim/real: the stores share no {STATE_KEY!r} (shared: {keys})")
    shutil.rmtree(out, ignore_errors=True)
    with EpisodeStore(out, "w") as dst:
        if stores[0].info:
            dst.update_info(**stores[0].info)
        for j, s in enumerate(stores):
            for i in range(s.n_episodes if episodes is None else episodes[j]):
                dst.add_episode(s.get_episode(i, keys), s.episode_meta(i))


def _labels(store: Path, adv: np.ndarray, human: np.ndarray, cmd: H2OCommand) -> tuple[np.ndarray, dict[str, Any]]:
    """Binary labels of ``store`` from the critic's advantages ``adv`` (module docstring, step 4); written under
    ``labels/<cmd.labels>``. Returns the labels and the attributes written."""
    s = EpisodeStore(store, "r")
    metas = s.all_meta()
    success = np.array([-1 if m.success is None else int(m.success) for m in metas])
    lcfg = LabelConfig(cmd.positive_fraction, cmd.failure_window)
    labels, thresholds = binary_labels(adv, s.episode_ends, tasks=[m.task for m in metas], success=success,
                                       config=lcfg)  # fmt: skip
    if cmd.human_positive:
        labels[human] = 1
    attrs = {"source": "h2o_critic", "thresholds": thresholds, "positive": float(labels.mean()),
             "human_positive": cmd.human_positive, "config": asdict(lcfg)}  # fmt: skip
    write_labels(store, labels, adv, attrs, cmd.labels)
    return labels, attrs


__all__ = [
    "DISCRIMINATOR_OBJECTIVE",
    "DiscriminatorObjective",
    "DiscriminatorObjectiveConfig",
    "H2OCommand",
    "Transitions",
    "run_h2o",
    "train_discriminators",
    "train_weighted_critic",
    "write_union",
]
