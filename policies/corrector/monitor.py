"""The latent monitor of corrective chunk execution (VLA-Corrector, arXiv 2607.01804): a small MLP that, from the
frozen policy's observation latent ``z_t`` and the ``k`` actions executed next, predicts the latent change
``z_{t+k} - z_t``; trained with a cosine loss on successful rollouts. The deviation score at step ``t`` is
``E_t = 1 - cos(f(z_{t-k}, a_{t-k:t}), z_t - z_{t-k})`` (``score: cosine``, the paper's), or with ``score:
residual`` the mean squared standardised residual ``mean_d ((dz_obs - dz_pred)_d / r_d)^2`` (``r`` the per-dimension
residual spread on the training pairs; the monitor is then trained with a squared error so that it predicts
magnitudes). The residual score sees a deviation in a few latent dimensions (a displaced object) that the cosine
of the whole change hides when other dimensions (the robot's own motion, set by the actions) dominate it.

The monitor is self-contained: it standardises latents and actions (in ActionSpec units) with statistics of its
training data, so it runs beside any :class:`~policylink.adapters.capabilities.Embedder` policy, local or served.
It is saved in its own folder beside the policy checkpoint (never inside it): ``monitor.safetensors`` +
``monitor.json`` (+ ``calibration.json`` once calibrated).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from policylink.policies.corrector.calibration import ConformalThresholds, cosine_deviation
from policylink.policies.serialization import load_json, load_tensors, save_json, save_tensors

MONITOR_WEIGHTS = "monitor.safetensors"
MONITOR_INFO = "monitor.json"
CALIBRATION_FILE = "calibration.json"

SCORES = ("cosine", "residual")


@dataclass(frozen=True)
class MonitorConfig:
    """Shape of the monitor.

    Attributes:
        horizon: ``k``, control steps between the latent and the predicted change (the paper uses 10 at its rate).
        hidden_dim: MLP width.
        n_layers: hidden layers (>= 1).
        score: deviation score and training loss: ``"cosine"`` (the paper's) or ``"residual"`` (see the module).

    Raises:
        ValueError: a non-positive field or an unknown score (named).
    """

    horizon: int = 4
    hidden_dim: int = 128
    n_layers: int = 2
    score: str = "cosine"

    def __post_init__(self) -> None:
        for name in ("horizon", "hidden_dim", "n_layers"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"monitor.{name}: expected an integer >= 1, received {getattr(self, name)!r}")
        if self.score not in SCORES:
            raise ValueError(f"monitor.score: expected one of {list(SCORES)}, received {self.score!r}")


class LatentMonitor(nn.Module):
    """``f(z (B, D), actions (B, k, A) in units) -> predicted latent change (B, D)`` (in latent units).

    Args:
        latent_dim: ``D``; action_dim: ``A``; config: :class:`MonitorConfig`.
    """

    def __init__(self, latent_dim: int, action_dim: int, config: MonitorConfig = MonitorConfig()):
        super().__init__()
        self.config, self.latent_dim, self.action_dim = config, int(latent_dim), int(action_dim)
        self.policy_probe: list[float] | None = None  # set by load_monitor: the trained-on policy's probe latent
        k, h = config.horizon, config.hidden_dim
        layers: list[nn.Module] = []
        width = self.latent_dim + k * self.action_dim
        for _ in range(config.n_layers):
            layers += [nn.Linear(width, h), nn.Mish()]
            width = h
        layers.append(nn.Linear(width, self.latent_dim))
        self.net = nn.Sequential(*layers)
        for name, dim in (("z", self.latent_dim), ("a", self.action_dim), ("dz", self.latent_dim)):
            self.register_buffer(f"{name}_mean", torch.zeros(dim))
            self.register_buffer(f"{name}_std", torch.ones(dim))
        self.register_buffer("res_std", torch.ones(self.latent_dim))  # residual spread r (score: residual)

    @property
    def horizon(self) -> int:
        """``k``."""
        return self.config.horizon

    def set_statistics(self, z: np.ndarray, actions: np.ndarray, dz: np.ndarray) -> None:
        """Standardisation from training data: latents ``(N, D)``, actions ``(N, A)``, latent changes ``(N, D)``."""
        for name, x in (("z", z), ("a", actions), ("dz", dz)):
            x = np.asarray(x, np.float64).reshape(-1, getattr(self, f"{name}_mean").numel())
            getattr(self, f"{name}_mean").copy_(torch.as_tensor(x.mean(0), dtype=torch.float32))
            getattr(self, f"{name}_std").copy_(torch.as_tensor(np.maximum(x.std(0), 1e-6), dtype=torch.float32))

    def forward(self, z: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """Predicted ``z_{t+k} - z_t`` ``(B, D)`` from ``z_t`` ``(B, D)`` and ``a_{t:t+k}`` ``(B, k, A)`` (units).

        Raises:
            ValueError: wrong shapes (named).
        """
        k = self.horizon
        if z.dim() != 2 or z.shape[1] != self.latent_dim:
            raise ValueError(f"monitor z: expected shape (B, {self.latent_dim}), received {tuple(z.shape)}")
        if actions.dim() != 3 or tuple(actions.shape[1:]) != (k, self.action_dim):
            raise ValueError(f"monitor actions: expected shape (B, {k}, {self.action_dim}), "
                             f"received {tuple(actions.shape)}")  # fmt: skip
        zn = (z - self.z_mean) / self.z_std
        an = ((actions - self.a_mean) / self.a_std).flatten(1)
        return self.net(torch.cat([zn, an], dim=1)) * self.dz_std + self.dz_mean


def monitor_deviation(monitor: Any, pred: np.ndarray, observed: np.ndarray) -> np.ndarray:
    """Deviation scores float64 ``(B,)`` of predicted vs observed latent changes ``(B, D)`` by the monitor's
    ``config.score``: ``1 - cos`` (``cosine``, also for a monitor without a config) or ``mean_d ((observed -
    pred) / res_std)^2`` (``residual``)."""
    if getattr(getattr(monitor, "config", None), "score", "cosine") == "cosine":
        return cosine_deviation(pred, observed)
    r = monitor.res_std.detach().cpu().numpy().astype(np.float64)
    return (((np.asarray(observed, np.float64) - np.asarray(pred, np.float64)) / r) ** 2).mean(-1)


def cosine_loss(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean ``1 - cos(pred, target)`` over rows ``(B, D)`` (the paper's monitor loss), scalar."""
    return (1.0 - torch.nn.functional.cosine_similarity(pred, target, dim=1, eps=1e-8)).mean()


def episode_latents(policy: Any, episode: Mapping[str, np.ndarray], batch: int = 256) -> np.ndarray:
    """Latents ``(T, D)`` float32 of one recorded episode through ``policy.embed`` (an
    :class:`~policylink.adapters.capabilities.Embedder`): step ``t``'s window holds observations ``t - n + 1 ..
    t``, the first one repeated before the start (as the policy's history pads it).

    Args:
        policy: the frozen policy (``spec.n_obs_steps`` = ``n``, ``embed(obs)``).
        episode: key -> ``(T, ...)`` arrays with every observation key of ``policy.spec``.
    """
    n = int(policy.spec.n_obs_steps)
    keys = list(policy.spec.observation_features)
    t_len = len(episode[keys[0]])
    idx = np.clip(np.arange(t_len)[:, None] + np.arange(-n + 1, 1)[None], 0, None)  # (T, n)
    out = []
    for s in range(0, t_len, batch):
        rows = idx[s : s + batch]
        out.append(policy.embed({k: np.asarray(episode[k])[rows] for k in keys}))
    return np.concatenate(out).astype(np.float32)


def probe_latent(policy: Any) -> np.ndarray | None:
    """The policy's latent ``(D,)`` float32 of one fixed synthetic observation window (every numeric feature a
    deterministic ramp over its value range; text features ``"probe"``): a fingerprint of the frozen encoder,
    saved with a monitor so that a monitor trained on another policy's latents can be recognised. None when the
    policy cannot embed it (e.g. a feature type the probe does not build)."""
    n = int(policy.spec.n_obs_steps)
    obs = {}
    for key, feat in policy.spec.observation_features.items():
        if feat.dtype == "string":
            obs[key] = np.array([["probe"] * n], dtype=object)
            continue
        size = int(np.prod((n, *feat.shape)))
        ramp = np.linspace(0.0, 1.0, size, dtype=np.float64).reshape(1, n, *feat.shape)
        obs[key] = (ramp * 255).astype(feat.dtype) if feat.dtype == "uint8" else (2 * ramp - 1).astype(feat.dtype)
    try:
        return np.asarray(policy.embed(obs), np.float32)[0]
    except (ValueError, TypeError, KeyError, RuntimeError):
        return None


def probe_mismatch(policy: Any, saved: Sequence[float] | None, rtol: float = 1e-3) -> float | None:
    """Relative distance ``|z - z_saved| / |z_saved|`` between the policy's :func:`probe_latent` and a saved one
    when it exceeds ``rtol`` (float rounding across devices stays far below it), else None; None too when
    either latent is missing."""
    if saved is None:
        return None
    z, ref = probe_latent(policy), np.asarray(saved, np.float32)
    if z is None or z.shape != ref.shape:
        return None
    rel = float(np.linalg.norm(z - ref) / max(float(np.linalg.norm(ref)), 1e-12))
    return rel if rel > rtol else None


def monitor_pairs(
    latents: Sequence[np.ndarray], actions: Sequence[np.ndarray], horizon: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Training pairs from episodes: ``z_t`` ``(N, D)``, ``a_{t:t+k}`` ``(N, k, A)``, ``z_{t+k} - z_t`` ``(N, D)``
    for every ``t`` with ``t + k < T`` of each episode (latents ``(T, D)``, actions ``(T, A)``)."""
    zs, acts, dzs = [], [], []
    for z, a in zip(latents, actions, strict=True):
        t = len(z) - horizon
        if t <= 0:
            continue
        zs.append(z[:t])
        acts.append(np.stack([a[i : i + horizon] for i in range(t)]))
        dzs.append(z[horizon:] - z[:t])
    if not zs:
        raise ValueError(f"monitor data: expected episodes longer than horizon k={horizon}, received none")
    return np.concatenate(zs), np.concatenate(acts).astype(np.float32), np.concatenate(dzs)


def monitor_dir(checkpoint: str | Path) -> Path:
    """The default monitor folder beside a policy checkpoint folder: ``<checkpoint>.monitor``."""
    p = Path(checkpoint)
    return p.parent / f"{p.name}.monitor"


def save_monitor(
    path: str | Path, monitor: LatentMonitor, thresholds: ConformalThresholds | None = None, meta: dict | None = None
) -> Path:
    """Write ``monitor.safetensors`` (the weights and statistics) + ``monitor.json`` (sizes, config, ``meta``:
    plain JSON data) (+ ``calibration.json``) to folder ``path`` (created if needed). Returns ``path``.

    Raises:
        SerializationError: ``meta`` holds something JSON cannot represent.
    """
    path = Path(path)
    save_tensors(path / MONITOR_WEIGHTS, monitor.state_dict())
    info = {"latent_dim": monitor.latent_dim, "action_dim": monitor.action_dim, "config": asdict(monitor.config)}
    save_json(path / MONITOR_INFO, {**info, "meta": meta or {}})
    if thresholds is not None:
        save_json(path / CALIBRATION_FILE, thresholds.to_dict())
    return path


def load_monitor(
    path: str | Path, device: str | torch.device = "cpu"
) -> tuple[LatentMonitor, ConformalThresholds | None]:
    """Load a monitor folder written by :func:`save_monitor`: ``(monitor in eval mode, thresholds or None)``; the
    monitor's ``policy_probe`` is the :func:`probe_latent` of the policy it was trained on (None if not saved).

    Raises:
        FileNotFoundError: ``path`` is not a monitor folder.
    """
    path = Path(path)
    if not (path / MONITOR_INFO).is_file():
        raise FileNotFoundError(f"corrective.monitor: expected a monitor folder with {MONITOR_INFO}, received {path}")
    info = load_json(path / MONITOR_INFO)
    mon = LatentMonitor(info["latent_dim"], info["action_dim"], MonitorConfig(**info["config"]))
    state = load_tensors(path / MONITOR_WEIGHTS)
    state.setdefault("res_std", torch.ones(mon.latent_dim))  # monitors saved before the residual score
    mon.load_state_dict(state)
    mon.policy_probe = info.get("meta", {}).get("probe_latent")  # the trained-on policy's probe_latent, if saved
    cal = path / CALIBRATION_FILE
    thr = ConformalThresholds.from_dict(load_json(cal)) if cal.is_file() else None
    return mon.to(device).eval(), thr


__all__ = [
    "LatentMonitor",
    "MonitorConfig",
    "cosine_loss",
    "episode_latents",
    "load_monitor",
    "monitor_deviation",
    "probe_latent",
    "probe_mismatch",
    "monitor_dir",
    "monitor_pairs",
    "save_monitor",
]
