"""The corrector's latent monitor in the one trainer: objective ``monitor`` (:class:`MonitorObjectiveConfig`,
:class:`MonitorLoss`); :func:`train_monitor` fits a :class:`~policylink.policies.corrector.monitor.LatentMonitor`
(VLA-Corrector, arXiv 2607.01804) on pairs from :func:`~policylink.policies.corrector.monitor.monitor_pairs` with
Adam through :func:`~policylink.train.trainer.fit`. Built by ``policylink finetune monitor``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

import numpy as np
import torch

from policylink.policies.corrector.monitor import LatentMonitor, MonitorConfig, cosine_loss
from policylink.train.objectives import ObjectiveConfig, objective_loss, register_objective
from policylink.train.trainer import OptimConfig, Optimization, fit, tty_progress

MONITOR_OBJECTIVE = "monitor"
MONITOR_COMMAND = "finetune monitor"


@dataclass(frozen=True)
class MonitorObjectiveConfig(MonitorConfig, ObjectiveConfig):
    """Objective ``monitor``: the options are :class:`~policylink.policies.corrector.monitor.MonitorConfig`'s
    (horizon, width, depth, score); trains the monitor."""

    trains: ClassVar[tuple[str, ...]] = ("monitor",)
    commands: ClassVar[tuple[str, ...]] = (MONITOR_COMMAND,)


class MonitorLoss:
    """The monitor's loss for a new :class:`LatentMonitor` (weights from torch's global generator: seed it first)
    whose statistics are those of the training pairs: for ``score: cosine`` the cosine loss of the predicted and the
    observed latent change (the paper's), for ``residual`` their squared error standardised by the change's spread.

    Args:
        context: the training pairs ``(z (N, D), actions (N, k, A), dz (N, D))`` float32 numpy
            (:func:`~policylink.policies.corrector.monitor.monitor_pairs`).
        **options: :class:`~policylink.policies.corrector.monitor.MonitorConfig` fields.

    Attributes:
        monitor: the trained :class:`LatentMonitor`.
    """

    def __init__(self, context: tuple[np.ndarray, np.ndarray, np.ndarray], **options: Any):
        z, actions, dz = context
        self.monitor = LatentMonitor(z.shape[1], actions.shape[2], MonitorConfig(**options))
        self.monitor.set_statistics(z, actions.reshape(-1, actions.shape[2]), dz)

    def __call__(self, batch: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, float]]:
        """``(loss, {})`` for ``latent`` ``(B, D)``, ``action`` ``(B, k, A)`` and the observed ``change`` ``(B, D)``."""
        pred = self.monitor(batch["latent"], batch["action"])
        if self.monitor.config.score == "cosine":
            return cosine_loss(pred, batch["change"]), {}
        return (((pred - batch["change"]) / self.monitor.dz_std) ** 2).mean(), {}


register_objective(MONITOR_OBJECTIVE, MonitorObjectiveConfig, MonitorLoss)


def train_monitor(
    z: np.ndarray,
    actions: np.ndarray,
    dz: np.ndarray,
    config: MonitorConfig,
    *,
    steps: int = 2000,
    batch_size: int = 256,
    lr: float = 1e-3,
    seed: int = 0,
) -> tuple[LatentMonitor, list[float]]:
    """Fit a :class:`LatentMonitor` (Adam) on pairs from :func:`monitor_pairs`: the cosine loss, or for ``score:
    residual`` the squared error of the standardised change, after which ``res_std`` is set to the per-dimension
    RMS residual on the pairs (floored at 1e-3 of the change's spread).

    Returns:
        ``(monitor in eval mode on CPU, loss every 100 steps)``.
    """
    torch.manual_seed(seed)
    loss = objective_loss(MONITOR_OBJECTIVE, (z, actions, dz), asdict(config), command=MONITOR_COMMAND)
    mon = loss.monitor
    tz, ta, tdz = (torch.as_tensor(x, dtype=torch.float32) for x in (z, actions, dz))
    run = Optimization(mon, OptimConfig("adam", lr=lr))
    gen = torch.Generator().manual_seed(seed)

    def step_loss(_: int) -> tuple[torch.Tensor, dict[str, float]]:
        i = torch.randint(0, len(tz), (min(batch_size, len(tz)),), generator=gen)
        return loss({"latent": tz[i], "action": ta[i], "change": tdz[i]})

    losses = []
    for done in fit(step_loss, run, int(steps), progress=tty_progress("monitor")):
        if (done.step - 1) % 100 == 0 or done.step == steps:
            losses.append(done.loss.item())
    mon.eval()
    if config.score == "residual":
        with torch.no_grad():
            rms = (mon(tz, ta) - tdz).pow(2).mean(0).sqrt()
            mon.res_std.copy_(torch.maximum(rms, 1e-3 * mon.dz_std))
    return mon, losses


__all__ = ["MONITOR_OBJECTIVE", "MonitorConfig", "MonitorLoss", "MonitorObjectiveConfig", "train_monitor"]
