"""``policylink finetune monitor``: train and calibrate the latent monitor of corrective chunk execution
(VLA-Corrector, arXiv 2607.01804) from successful rollouts in an episode store; the policy stays frozen and the
monitor is saved beside (not inside) its checkpoint::

    policylink finetune monitor --policy outputs/train/dp_push/checkpoints/last --buffer outputs/push_rollouts.zarr

Successful episodes are split by episode into train / calibration / test. The calibration split gives the
per-offset conformal thresholds (offset = ``t mod chunk_period``, the chunk index of step ``t`` under open-loop
execution of whole chunks, which is how the buffer's rollouts are expected to have been recorded); the test
split reports the per-step alarm rate on fresh successful episodes (nominal: ``<= alpha``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from policylink.adapters.config_checks import require_counts, require_positive, require_within


@dataclass
class MonitorCmdConfig:
    """Train the latent monitor of corrective execution on the successful rollouts of a frozen policy, calibrate
    its per-offset conformal alarm thresholds and report the alarm rate on held-out episodes.

    Attributes:
        policy: the frozen policy's checkpoint folder (an Embedder policy).
        buffer: episode store (``.zarr``) with the policy's rollouts (success flags in the episode metadata).
        out: monitor folder; empty = ``<policy>.monitor``, beside the checkpoint. Never the policy's folder or the
            buffer (nor inside or around them), never an existing file.
        horizon: ``k``, control steps between the latent and the change the monitor predicts (>= 1).
        score: deviation score and training loss: ``cosine`` (one minus the cosine of the predicted and the
            observed latent change, the paper's; cosine loss) or ``residual`` (the mean squared residual per latent
            dimension, standardised by its spread on the training pairs; squared-error loss).
        hidden_dim: width of the monitor's MLP layers.
        steps: Adam steps of monitor training (>= 1).
        batch_size: training pairs per Adam step (>= 1).
        lr: Adam learning rate (> 0).
        calibration_fraction: share of the successful episodes held out (by episode) to fit the per-offset
            conformal thresholds (> 0).
        test_fraction: share of the successful episodes held out (by episode) to report the alarm rate on fresh
            episodes (>= 0; calibration_fraction + test_fraction < 1, the rest trains the monitor).
        alpha: nominal per-step false-alarm rate of the thresholds.
        ewma: smoothing weight in (0, 1] of the scores (must match ``executor.corrective.detector.ewma``).
        chunk_period: offsets ``t mod chunk_period`` of the thresholds; 0 = the policy's chunk_size.
        seed: split and training seed.
        torch_threads: torch intra-op threads (0 = torch's default).
    """

    policy: str = ""
    buffer: str = ""
    out: str = ""
    horizon: int = 4
    score: str = "cosine"
    hidden_dim: int = 128
    steps: int = 2000
    batch_size: int = 256
    lr: float = 1e-3
    calibration_fraction: float = 0.25
    test_fraction: float = 0.25
    alpha: float = 0.05
    ewma: float = 0.35
    chunk_period: int = 0
    seed: int = 0
    torch_threads: int = 1

    def __post_init__(self) -> None:
        require_counts(self, horizon=1, hidden_dim=1, steps=1, batch_size=1, chunk_period=0, torch_threads=0)
        require_within(self, ewma="(0, 1]")
        require_positive(self, "lr")
        if not (0 < self.calibration_fraction and 0 <= self.test_fraction and
                self.calibration_fraction + self.test_fraction < 1):  # fmt: skip
            raise ValueError(f"calibration_fraction + test_fraction: expected in (0, 1) with a positive calibration "
                             f"share, received {self.calibration_fraction} + {self.test_fraction}")  # fmt: skip


def episode_scores(monitor: Any, latents: np.ndarray, actions: np.ndarray) -> np.ndarray:
    """Raw scores ``E_t`` for ``t = k .. T-1`` of one episode (latents ``(T, D)``, actions ``(T, A)`` units):
    float64 ``(T - k,)``, the executor's score exactly."""
    import torch

    from policylink.policies.corrector.monitor import monitor_deviation

    k, t = monitor.horizon, len(latents)
    if t <= k:
        return np.zeros(0)
    acts = np.stack([actions[i - k : i] for i in range(k, t)]).astype(np.float32)
    with torch.no_grad():
        pred = monitor(torch.as_tensor(latents[: t - k]), torch.as_tensor(acts)).numpy()
    return monitor_deviation(monitor, pred, latents[k:] - latents[: t - k])


def train_and_calibrate(cfg: MonitorCmdConfig) -> dict[str, Any]:
    """Train, calibrate, test and save; returns the summary written to ``<out>/summary.json``.

    Raises:
        ValueError: no policy/buffer, an ``out`` that is a file or would replace the policy or the buffer, a policy
            without latents, or too few successful episodes.
    """
    import torch

    from policylink.adapters.capabilities import Embedder
    from policylink.data.buffer import EpisodeStore
    from policylink.policies import load_policy
    from policylink.policies.corrector.calibration import ConformalThresholds, alarm_rate
    from policylink.policies.corrector.monitor import (
        MonitorConfig,
        episode_latents,
        monitor_dir,
        monitor_pairs,
        probe_latent,
        save_monitor,
    )
    from policylink.runtime.checks import require_output_folder
    from policylink.train.monitor import train_monitor

    if not cfg.policy or not cfg.buffer:
        raise ValueError(
            f"policy, buffer: expected paths (--policy CKPT --buffer X.zarr), received {cfg.policy!r}, {cfg.buffer!r}"
        )
    out = Path(cfg.out) if cfg.out else monitor_dir(cfg.policy)
    require_output_folder(out, policy=cfg.policy, buffer=cfg.buffer)
    torch.set_num_threads(int(cfg.torch_threads))
    policy = load_policy(cfg.policy, device="cpu")
    if not isinstance(policy, Embedder):
        raise ValueError(f"policy: expected an Embedder policy (observation latents), received {type(policy).__name__}")
    store = EpisodeStore(cfg.buffer)
    keys = [*policy.spec.observation_features, "action"]
    ok = [i for i, m in enumerate(store.all_meta()) if m.success]
    if len(ok) < 8:
        raise ValueError(f"buffer: expected >= 8 successful episodes, received {len(ok)} of {store.n_episodes}")
    rng = np.random.default_rng(cfg.seed)
    order = rng.permutation(ok)
    n_cal, n_test = max(1, int(len(ok) * cfg.calibration_fraction)), int(len(ok) * cfg.test_fraction)
    split = {"calibration": order[:n_cal], "test": order[n_cal : n_cal + n_test], "train": order[n_cal + n_test :]}
    data = {}
    for i in order.tolist():
        ep = store.get_episode(int(i), keys)
        data[i] = (episode_latents(policy, ep), np.asarray(ep["action"], np.float32))
    period = int(cfg.chunk_period or policy.spec.chunk_size)
    z, a, dz = monitor_pairs([data[i][0] for i in split["train"]], [data[i][1] for i in split["train"]], cfg.horizon)
    mcfg = MonitorConfig(horizon=cfg.horizon, hidden_dim=cfg.hidden_dim, score=cfg.score)
    mon, losses = train_monitor(z, a, dz, mcfg, steps=cfg.steps, batch_size=cfg.batch_size, lr=cfg.lr, seed=cfg.seed)

    def scored(ids):
        out = []
        for i in ids.tolist():
            s = episode_scores(mon, *data[i])
            out.append((s, (np.arange(cfg.horizon, cfg.horizon + len(s)) % period)))
        return out

    thr = ConformalThresholds.fit(scored(split["calibration"]), policy.spec.chunk_size, cfg.alpha, cfg.ewma)
    test = scored(split["test"])
    summary = {
        "policy": cfg.policy,
        "buffer": cfg.buffer,
        "episodes": {k: len(v) for k, v in split.items()},
        "train_pairs": len(z),
        "loss_first_last": [losses[0], losses[-1]],
        "alpha": cfg.alpha,
        "test_alarm_rate": alarm_rate(test, thr) if test else None,
        "calibration_alarm_rate": alarm_rate(scored(split["calibration"]), thr),
    }
    probe = probe_latent(policy)  # lets the corrective executor recognise a monitor of another policy
    save_monitor(out, mon, thr, meta={**summary, "probe_latent": None if probe is None else probe.tolist()})
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    return {**summary, "out": str(out)}
