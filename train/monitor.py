"""The corrector's latent monitor in the one trainer: :func:`train_monitor` fits a
:class:`~policylink.policies.corrector.monitor.LatentMonitor` (VLA-Corrector, arXiv 2607.01804) on pairs from
:func:`~policylink.policies.corrector.monitor.monitor_pairs` with Adam through :func:`~policylink.train.trainer.fit`.
"""

from __future__ import annotations

import numpy as np
import torch

from policylink.policies.corrector.monitor import LatentMonitor, MonitorConfig, cosine_loss
from policylink.train.trainer import OptimConfig, Optimization, fit, tty_progress


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
    mon = LatentMonitor(z.shape[1], actions.shape[2], config)
    mon.set_statistics(z, actions.reshape(-1, actions.shape[2]), dz)
    tz, ta, tdz = (torch.as_tensor(x, dtype=torch.float32) for x in (z, actions, dz))
    run = Optimization(mon, OptimConfig("adam", lr=lr))
    gen = torch.Generator().manual_seed(seed)

    def step_loss(_: int) -> tuple[torch.Tensor, dict[str, float]]:
        i = torch.randint(0, len(tz), (min(batch_size, len(tz)),), generator=gen)
        pred = mon(tz[i], ta[i])
        if config.score == "cosine":
            return cosine_loss(pred, tdz[i]), {}
        return (((pred - tdz[i]) / mon.dz_std) ** 2).mean(), {}

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


__all__ = ["MonitorConfig", "train_monitor"]
