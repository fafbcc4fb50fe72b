"""Advantage labels of an episode store (RECAP in pi*0.6, ALTER in N0-VTLA): rewards, n-step advantages from a
value estimate or progress differences from a task-progress signal, binary labels (top fraction per task positive,
failure windows forced negative, chosen sources/qualities forced positive), and their storage next to the data.

Storage: a ``labels/<name>/`` group at the store's root holding ``label`` int8 ``(N_steps,)`` (1 positive, 0
negative) and ``advantage`` float32 ``(N_steps,)``, with the labelling settings in the group's attributes. Code
that knows nothing of labels reads ``data/`` and ``meta/`` only, so a labelled store stays readable by it, and
the store's feature keys are unchanged (appending episodes keeps working; the labels then cover fewer steps than
the store and :func:`read_labels` refuses them as stale).

All per-step arrays are in the store's concatenated order: step ``t`` of episode ``e`` is row
``episode_ends[e - 1] + t`` (``0`` for ``e = 0``).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

LABELS_GROUP = "labels"
DEFAULT_LABEL_SET = "advantage"
POSITIVE, NEGATIVE = 1, 0


class LabelsError(ValueError):
    """Labels are missing, stale (written for fewer steps than the store holds) or malformed."""


@dataclass(frozen=True)
class LabelConfig:
    """How advantages become binary labels.

    Attributes:
        positive_fraction: ``q``, the top fraction of steps per task labelled positive (RECAP: 0.3, the
            threshold at the 70th percentile pooled over the corpus).
        failure_window: the last ``k`` steps of every failed episode (``success == 0``) are forced negative.
        positive_sources: episode sources (``human``, ``expert``...) whose steps are all forced positive.
        positive_qualities: episode quality tags whose steps are all forced positive (demonstrations).
        per_task: threshold per task instruction (True) or pooled over all tasks.
    """

    positive_fraction: float = 0.3
    failure_window: int = 10
    positive_sources: tuple[str, ...] = ()
    positive_qualities: tuple[str, ...] = ()
    per_task: bool = True

    def __post_init__(self) -> None:
        if not 0.0 < self.positive_fraction < 1.0:
            raise ValueError(f"positive_fraction: expected a value in (0, 1), received {self.positive_fraction}")
        if self.failure_window < 0:
            raise ValueError(f"failure_window: expected >= 0 steps, received {self.failure_window}")


@dataclass
class LabelSet:
    """Labels read back from a store.

    Attributes:
        label: int8 ``(N_steps,)``, 1 positive, 0 negative.
        advantage: float32 ``(N_steps,)``, the advantage the labels were cut from.
        attrs: the settings the labels were written with (``source``, ``config``, ``threshold``...).
    """

    label: np.ndarray
    advantage: np.ndarray
    attrs: dict[str, Any] = field(default_factory=dict)


def episode_starts(episode_ends: np.ndarray) -> np.ndarray:
    """int64 ``(E,)`` first row of each episode from the exclusive ends ``(E,)``."""
    ends = np.asarray(episode_ends, np.int64)
    return np.concatenate([[0], ends[:-1]]).astype(np.int64)


def recap_rewards(
    episode_ends: np.ndarray, success: np.ndarray, max_episode_steps: int, failure_penalty: float | None = None
) -> np.ndarray:
    """RECAP rewards: ``-1`` per step and ``-C`` more on a failed episode's last step, divided by
    ``max_episode_steps + C`` so that every episode's return lies in ``[-1, 0]``.

    Args:
        episode_ends: int ``(E,)`` exclusive ends. success: ``(E,)`` 1 success, 0 failure, -1 unknown (treated
            as success: no penalty). max_episode_steps: ``T_max``. failure_penalty: ``C`` (default ``T_max``).

    Returns:
        float32 ``(N_steps,)``.

    Raises:
        ValueError: ``max_episode_steps < 1`` or an episode longer than it, or ``C < 0``.
    """
    ends = np.asarray(episode_ends, np.int64)
    lengths = np.diff(ends, prepend=0)
    penalty = float(max_episode_steps if failure_penalty is None else failure_penalty)
    if max_episode_steps < 1 or penalty < 0:
        raise ValueError(f"max_episode_steps >= 1 and failure_penalty >= 0 expected, received {max_episode_steps}, "
                         f"{penalty}")  # fmt: skip
    if len(lengths) and lengths.max() > max_episode_steps:
        raise ValueError(f"max_episode_steps: expected >= the longest episode ({lengths.max()}), "
                         f"received {max_episode_steps}")  # fmt: skip
    r = np.full(int(ends[-1]) if len(ends) else 0, -1.0)
    failed = np.asarray(success) == 0
    r[ends[failed] - 1] -= penalty
    return (r / (max_episode_steps + penalty)).astype(np.float32)


def discounted_returns(rewards: np.ndarray, episode_ends: np.ndarray, gamma: float = 1.0) -> np.ndarray:
    """Monte-Carlo returns ``G_t = sum_{k >= 0} gamma^k r_{t+k}`` to the episode's end, float32 ``(N_steps,)``
    (the value model's regression target), summed in float64."""
    r = np.asarray(rewards, np.float64)
    g = np.zeros_like(r)
    for s, e in zip(episode_starts(episode_ends), np.asarray(episode_ends), strict=True):
        acc = 0.0
        for i in range(int(e) - 1, int(s) - 1, -1):
            acc = r[i] + gamma * acc
            g[i] = acc
    return g.astype(np.float32)


def nstep_advantage(
    rewards: np.ndarray, values: np.ndarray, episode_ends: np.ndarray, n: int = 10, gamma: float = 1.0
) -> np.ndarray:
    """RECAP's n-step advantage ``A_t = sum_{k<n'} gamma^k r_{t+k} + gamma^{n'} V(o_{t+n'}) - V(o_t)``.

    Episode-end rule: ``n' = min(n, L - t)`` (the valid steps), and when ``t + n`` reaches past the last step
    ``L - 1`` the bootstrap value is 0 (there is no state after the episode).

    Args:
        rewards, values: float ``(N_steps,)``. episode_ends: int ``(E,)``. n: ``N`` (RECAP: 10). gamma: discount.

    Returns:
        float32 ``(N_steps,)``.

    Raises:
        ValueError: ``n < 1``, or the arrays' lengths differ from the store's steps.
    """
    r, v = np.asarray(rewards, np.float64), np.asarray(values, np.float64)
    ends = np.asarray(episode_ends, np.int64)
    total = int(ends[-1]) if len(ends) else 0
    if n < 1:
        raise ValueError(f"n: expected >= 1 steps, received {n}")
    if r.shape != (total,) or v.shape != (total,):
        raise ValueError(f"rewards/values: expected shape ({total},), received {r.shape} and {v.shape}")
    out = np.zeros(total)
    for s, e in zip(episode_starts(ends), ends, strict=True):
        for i in range(int(s), int(e)):
            m = min(n, int(e) - i)
            ret = sum(gamma**k * r[i + k] for k in range(m))
            boot = gamma**m * v[i + m] if i + m < e else 0.0
            out[i] = ret + boot - v[i]
    return out.astype(np.float32)


def progress_from_distance(distance: np.ndarray, episode_ends: np.ndarray) -> np.ndarray:
    """Normalised task progress ``p_t = 1 - d_t / d_0`` per episode (``d_0`` its first step's distance to the
    goal; ``p = 1`` throughout an episode that starts at the goal). float32 ``(N_steps,)``, 1 at the goal, 0 at the
    start, negative when farther than at the start. This is the formula of the MuJoCo tasks' ``info["progress"]``."""
    d = np.asarray(distance, np.float64)
    out = np.ones_like(d)
    for s, e in zip(episode_starts(episode_ends), np.asarray(episode_ends), strict=True):
        d0 = d[s]
        if d0 > 0:
            out[s:e] = 1.0 - d[s:e] / d0
    return out.astype(np.float32)


def progress_advantage(progress: np.ndarray, episode_ends: np.ndarray, horizon: int) -> np.ndarray:
    """ALTER-style advantage: progress gained over a chunk, ``A_t = p_{min(t + H, L - 1)} - p_t`` (at the episode's
    end the chunk is cut at its last step). float32 ``(N_steps,)``. Raises ValueError for ``horizon < 1``."""
    if horizon < 1:
        raise ValueError(f"horizon: expected >= 1 steps, received {horizon}")
    p = np.asarray(progress, np.float64)
    out = np.zeros_like(p)
    for s, e in zip(episode_starts(episode_ends), np.asarray(episode_ends), strict=True):
        idx = np.arange(s, e)
        out[idx] = p[np.minimum(idx + horizon, e - 1)] - p[idx]
    return out.astype(np.float32)


def binary_labels(
    advantage: np.ndarray,
    episode_ends: np.ndarray,
    *,
    tasks: Sequence[str],
    success: Sequence[int],
    sources: Sequence[str] = (),
    qualities: Sequence[str] = (),
    config: LabelConfig | None = None,
) -> tuple[np.ndarray, dict[str, float]]:
    """Binary labels from advantages, in this order:

    1. per task (or pooled), positive iff ``A_t >= threshold``, the ``1 - q`` quantile of that task's advantages
       (numpy's linear interpolation);
    2. every step of an episode whose source is in ``positive_sources`` or quality in ``positive_qualities`` is
       positive (demonstrations, human takeovers);
    3. the last ``failure_window`` steps of every failed episode (``success == 0``) are negative (overrides 2).

    Args:
        advantage: float ``(N_steps,)``. episode_ends: int ``(E,)``. tasks, success, sources, qualities:
            per-episode ``(E,)`` (``sources`` / ``qualities`` may be empty when no forcing is configured).

    Returns:
        int8 labels ``(N_steps,)`` and the threshold used per task (task -> float).

    Raises:
        ValueError: a per-episode sequence of the wrong length, or advantages of the wrong length.
    """
    cfg = config or LabelConfig()
    a = np.asarray(advantage, np.float64)
    ends = np.asarray(episode_ends, np.int64)
    starts, n_ep = episode_starts(ends), len(ends)
    _check_lengths(a, ends, tasks=tasks, success=success, sources=sources, qualities=qualities)
    step_task = np.repeat(np.asarray(list(tasks) if cfg.per_task else [""] * n_ep, dtype=object), ends - starts)
    labels = np.zeros(len(a), np.int8)
    thresholds: dict[str, float] = {}
    for task in dict.fromkeys(step_task.tolist()):
        rows = step_task == task
        thresholds[task] = float(np.quantile(a[rows], 1.0 - cfg.positive_fraction))
        labels[rows & (a >= thresholds[task])] = POSITIVE
    for e in range(n_ep):
        by_source = bool(sources) and sources[e] in cfg.positive_sources
        if by_source or (bool(qualities) and qualities[e] in cfg.positive_qualities):
            labels[starts[e] : ends[e]] = POSITIVE
    for e in range(n_ep):
        if int(success[e]) == 0 and cfg.failure_window:
            labels[max(starts[e], ends[e] - cfg.failure_window) : ends[e]] = NEGATIVE
    return labels, thresholds


def write_labels(
    path: str | os.PathLike,
    labels: np.ndarray,
    advantage: np.ndarray,
    attrs: dict[str, Any] | None = None,
    name: str = DEFAULT_LABEL_SET,
) -> None:
    """Write (replace) label set ``name`` under ``labels/<name>/`` of the episode store at ``path``.

    Args:
        labels: int ``(N_steps,)`` in {0, 1}. advantage: float ``(N_steps,)``. attrs: JSON-serialisable settings
            (stored with ``n_steps``).

    Raises:
        LabelsError: shapes differ from the store's committed steps, or labels outside {0, 1}.
        FileNotFoundError / StoreError: ``path`` is not an episode store.
    """
    import zarr

    from policylink.data.buffer import EpisodeStore

    n = EpisodeStore(path, "r").n_steps
    lab, adv = np.asarray(labels, np.int8), np.asarray(advantage, np.float32)
    if lab.shape != (n,) or adv.shape != (n,):
        raise LabelsError(f"labels/advantage: expected shape ({n},) (the store's steps), received {lab.shape}, "
                          f"{adv.shape}")  # fmt: skip
    if not np.isin(lab, (NEGATIVE, POSITIVE)).all():
        raise LabelsError(f"labels: expected values in {{0, 1}}, received {np.unique(lab).tolist()}")
    root = zarr.open_group(zarr.storage.LocalStore(str(path)), mode="r+")
    group = root.require_group(LABELS_GROUP).require_group(name)
    for key, arr in (("label", lab), ("advantage", adv)):
        if key in group:
            del group[key]
        group.create_array(key, shape=arr.shape, chunks=(max(1, min(len(arr), 1 << 16)),), dtype=arr.dtype)[:] = arr
    group.attrs.update({**(attrs or {}), "n_steps": n})


def read_labels(path: str | os.PathLike, name: str = DEFAULT_LABEL_SET) -> LabelSet:
    """Label set ``name`` of the store at ``path``.

    Raises:
        LabelsError: no such label set (names the ones present), or it covers another number of steps than the
            store (episodes appended after labelling: label again).
    """
    import zarr

    from policylink.data.buffer import EpisodeStore

    n = EpisodeStore(path, "r").n_steps
    root = zarr.open_group(zarr.storage.LocalStore(str(path), read_only=True), mode="r")
    have = list(root[LABELS_GROUP].group_keys()) if LABELS_GROUP in root else []
    if name not in have:
        raise LabelsError(f"labels {name!r}: not in the store {str(path)!r} (label sets present: {have}); write "
                          "them with 'policylink finetune advantage label'")  # fmt: skip
    group = root[LABELS_GROUP][name]
    attrs = dict(group.attrs)
    if int(attrs.get("n_steps", -1)) != n:
        raise LabelsError(f"labels {name!r}: written for {attrs.get('n_steps')} steps, the store {str(path)!r} now "
                          f"holds {n} (episodes were added after labelling); label the store again")  # fmt: skip
    return LabelSet(np.asarray(group["label"][:]), np.asarray(group["advantage"][:]), attrs)


def label_summary(labels: np.ndarray, episode_ends: np.ndarray, groups: Sequence[str]) -> dict[str, tuple[int, float]]:
    """Fraction of positive steps per episode group (task, source, quality): group -> ``(steps, fraction)``."""
    lab = np.asarray(labels)
    step_group = np.repeat(np.asarray(list(groups), dtype=object), np.diff(np.asarray(episode_ends), prepend=0))
    return {g: (int((step_group == g).sum()), float(lab[step_group == g].mean())) for g in dict.fromkeys(groups)}


def config_dict(cfg: LabelConfig) -> dict[str, Any]:
    """``cfg`` as a JSON-ready dict (tuples as lists), for :func:`write_labels`' ``attrs``."""
    return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(cfg).items()}


def _check_lengths(a: np.ndarray, ends: np.ndarray, **per_episode: Sequence[Any]) -> None:
    total = int(ends[-1]) if len(ends) else 0
    if a.shape != (total,):
        raise ValueError(f"advantage: expected shape ({total},), received {a.shape}")
    for name, seq in per_episode.items():
        if name in ("sources", "qualities") and len(seq) == 0:
            continue
        if len(seq) != len(ends):
            raise ValueError(f"{name}: expected {len(ends)} per-episode values, received {len(seq)}")


__all__ = [
    "DEFAULT_LABEL_SET",
    "LABELS_GROUP",
    "LabelConfig",
    "LabelSet",
    "LabelsError",
    "binary_labels",
    "config_dict",
    "discounted_returns",
    "episode_starts",
    "label_summary",
    "nstep_advantage",
    "progress_advantage",
    "progress_from_distance",
    "recap_rewards",
    "write_labels",
    "read_labels",
]
