"""Windowed sequence sampling over episodes with edge padding and pad masks, and a map-style torch dataset.

A sample is anchored at an episode step ``t`` (the newest observation). Its window starts at
``w = t - (n_obs_steps - 1)`` and spans ``horizon`` steps: observations are steps ``w .. t``
(``n_obs_steps``), actions are steps ``w .. w + horizon - 1``, as in diffusion_policy's
``SequenceSampler`` (Chi et al. 2023). Steps outside the episode repeat the edge value (first step before,
last step after) and are flagged in ``observation_is_pad`` / ``action_is_pad`` (True = padded, LeRobot's
``*_is_pad`` naming). Windows never cross episodes, so an episode subset (a train/val split) pads exactly as
the full set does. With the default ``pad_before = n_obs_steps - 1`` and ``pad_after = horizon - n_obs_steps``
every step of every episode is an anchor; diffusion_policy's ``pad_after = n_action_steps - 1`` is one option.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from policylink.adapters.images import to_float_chw
from policylink.adapters.schema import ACTION_KEY, IMAGE_PREFIX
from policylink.data.buffer import EpisodeStore
from policylink.data.normalize import Normalizer

OBS_PAD_KEY = "observation_is_pad"
ACTION_PAD_KEY = "action_is_pad"


class SequenceSampler:
    """Index windows over concatenated episode arrays (numpy arrays or zarr arrays, ``(N_steps, ...)``).

    Args:
        data: key -> array ``(N_steps, *shape)``, episodes concatenated in time.
        episode_ends: int ``(N_episodes,)`` exclusive end of each episode.
        n_obs_steps: observation window ``To`` (>= 1).
        horizon: action window ``H`` (>= ``n_obs_steps``).
        obs_keys: keys returned with ``To`` steps.
        action_key: key returned with ``H`` steps.
        episodes: subset of episode indices to sample from (default: all).
        pad_before: max padded steps before an episode's start (default ``To - 1``).
        pad_after: max padded steps after its end (default ``H - To``).

    Raises:
        ValueError: bad horizons/padding, or an episode index out of range.
        KeyError: a key is missing from ``data``.
    """

    def __init__(
        self,
        data: Mapping[str, Any],
        episode_ends: Sequence[int],
        *,
        n_obs_steps: int,
        horizon: int,
        obs_keys: Sequence[str],
        action_key: str = ACTION_KEY,
        episodes: Sequence[int] | None = None,
        pad_before: int | None = None,
        pad_after: int | None = None,
    ):
        if n_obs_steps < 1 or horizon < n_obs_steps:
            raise ValueError(
                f"n_obs_steps/horizon: expected 1 <= n_obs_steps <= horizon, received "
                f"n_obs_steps={n_obs_steps}, horizon={horizon}"
            )
        pad_before = n_obs_steps - 1 if pad_before is None else int(pad_before)
        pad_after = horizon - n_obs_steps if pad_after is None else int(pad_after)
        if not 0 <= pad_before <= n_obs_steps - 1 or not 0 <= pad_after <= horizon - 1:
            raise ValueError(
                f"pad_before/pad_after: expected 0 <= pad_before <= {n_obs_steps - 1} and "
                f"0 <= pad_after <= {horizon - 1}, received {pad_before}, {pad_after}"
            )
        missing = [k for k in [*obs_keys, action_key] if k not in data]
        if missing:
            raise KeyError(f"sampler keys {missing}: not in the data; available: {sorted(data)}")
        self.data = data
        self.obs_keys, self.action_key = list(obs_keys), action_key
        self.n_obs_steps, self.horizon = int(n_obs_steps), int(horizon)
        self.episode_ends = np.asarray(episode_ends, np.int64)
        starts = np.concatenate([[0], self.episode_ends[:-1]])
        n_ep = len(self.episode_ends)
        self.episodes = np.arange(n_ep) if episodes is None else np.asarray(episodes, np.int64)
        bad = self.episodes[(self.episodes < 0) | (self.episodes >= n_ep)]
        if len(bad):
            raise ValueError(f"episodes: expected indices in [0, {n_ep}), received {bad.tolist()}")
        rows = []
        for e in self.episodes:
            length = int(self.episode_ends[e] - starts[e])
            w = np.arange(-pad_before, length + pad_after - horizon + 1)
            rows.append(np.stack([np.full_like(w, e), np.full_like(w, starts[e]), np.full_like(w, length), w], 1))
        # (n_samples, 4): episode, episode start (global), episode length, window start (episode-relative)
        self._index = np.concatenate(rows) if rows else np.zeros((0, 4), np.int64)

    def __len__(self) -> int:
        return len(self._index)

    def sample(self, i: int) -> dict[str, Any]:
        """Window ``i``: obs keys ``(To, *shape)``, action ``(H, A)`` (raw dtype), ``observation_is_pad``
        bool ``(To,)``, ``action_is_pad`` bool ``(H,)``, ``episode_index`` and ``step`` (anchor ``t``) ints.

        Raises IndexError for ``i`` outside ``[0, len)``.
        """
        if not -len(self) <= i < len(self):
            raise IndexError(f"sample index: expected in [0, {len(self)}), received {i}")
        e, start, length, w = (int(v) for v in self._index[i])
        out: dict[str, Any] = {}
        obs_steps = np.arange(w, w + self.n_obs_steps)
        act_steps = np.arange(w, w + self.horizon)
        for key in self.obs_keys:
            out[key] = _window(self.data[key], start, length, obs_steps)
        out[self.action_key] = _window(self.data[self.action_key], start, length, act_steps)
        out[OBS_PAD_KEY] = (obs_steps < 0) | (obs_steps >= length)
        out[ACTION_PAD_KEY] = (act_steps < 0) | (act_steps >= length)
        out["episode_index"] = e
        out["step"] = w + self.n_obs_steps - 1
        return out

    __getitem__ = sample


class SequenceDataset:
    """Map-style dataset (usable with ``torch.utils.data.DataLoader``) of windows from an :class:`EpisodeStore`.

    Items are dicts of torch tensors: each obs key float32 ``(To, *shape)`` -- images as float CHW
    ``(To, 3, H, W)`` in ``[0, 1]`` -- and the action float32 ``(H, A)``, normalized when a ``normalizer`` is
    given (image stats are in that same ``[0, 1]`` scale); ``observation_is_pad`` bool ``(To,)``,
    ``action_is_pad`` bool ``(H,)``, ``episode_index`` / ``step`` int64 scalars and ``task`` (str).

    Args:
        store: an open store or its path.
        n_obs_steps, horizon: window sizes (see :class:`SequenceSampler`).
        obs_keys: observation keys (default: every ``observation.*`` key of the store).
        action_key: action key.
        episodes: episode subset (e.g. from :func:`split_episodes`).
        normalizer: applied to obs and action tensors (every requested key must be configured).
        in_memory: load the arrays into RAM once (fast random access) instead of reading zarr per item.
        pad_before, pad_after: see :class:`SequenceSampler`.
    """

    def __init__(
        self,
        store: EpisodeStore | str | Path,
        *,
        n_obs_steps: int,
        horizon: int,
        obs_keys: Sequence[str] | None = None,
        action_key: str = ACTION_KEY,
        episodes: Sequence[int] | None = None,
        normalizer: Normalizer | None = None,
        in_memory: bool = True,
        pad_before: int | None = None,
        pad_after: int | None = None,
    ):
        if not isinstance(store, EpisodeStore):
            store = EpisodeStore(store, "r")
        self.obs_keys = [k for k in store.keys if k.startswith("observation.")] if obs_keys is None else list(obs_keys)
        keys = [*self.obs_keys, action_key]
        data = store.load(keys) if in_memory else {k: store.array(k) for k in keys}
        self.sampler = SequenceSampler(
            data,
            store.episode_ends,
            n_obs_steps=n_obs_steps,
            horizon=horizon,
            obs_keys=self.obs_keys,
            action_key=action_key,
            episodes=episodes,
            pad_before=pad_before,
            pad_after=pad_after,
        )
        self.tasks = [m.task for m in store.all_meta()]
        self.action_key = action_key
        self.normalizer = normalizer
        if normalizer is not None:
            missing = [k for k in keys if k not in normalizer.keys]
            if missing:
                raise KeyError(f"normalizer: no mode for {missing}; configured: {normalizer.keys}")

    def __len__(self) -> int:
        return len(self.sampler)

    def __getitem__(self, i: int) -> dict[str, Any]:
        s = self.sampler.sample(int(i))
        out = self._tensors(
            {k: s[k] for k in [*self.obs_keys, self.action_key, OBS_PAD_KEY, ACTION_PAD_KEY]},
            np.array(s["episode_index"], np.int64),
            np.array(s["step"], np.int64),
        )
        out["task"] = self.tasks[s["episode_index"]]
        return out

    def get_batch(self, indices: Sequence[int]) -> dict[str, Any]:
        """Items ``indices`` stacked into a batch: the same keys as an item with a leading ``B`` dim (``task``
        a list of ``B`` str). Stacking and normalization run in numpy, which is single-threaded and equal to
        the per-item path; on a busy CPU torch's intra-op threads make ``torch.stack`` of image windows
        orders of magnitude slower (benchmarks/results/data_throughput.md).
        """
        samples = [self.sampler.sample(int(i)) for i in indices]
        keys = [*self.obs_keys, self.action_key, OBS_PAD_KEY, ACTION_PAD_KEY]
        out = self._tensors(
            {k: np.stack([s[k] for s in samples]) for k in keys},
            np.array([s["episode_index"] for s in samples], np.int64),
            np.array([s["step"] for s in samples], np.int64),
        )
        out["task"] = [self.tasks[s["episode_index"]] for s in samples]
        return out

    def _tensors(self, arrays: dict[str, np.ndarray], episode: np.ndarray, step: np.ndarray) -> dict[str, Any]:
        """Raw windows (any leading dims) -> float32 (images CHW in [0, 1]) normalized torch tensors."""
        import torch

        out: dict[str, Any] = {}
        for key in [*self.obs_keys, self.action_key]:
            x = arrays[key]
            x = to_float_chw(x, key) if key.startswith(IMAGE_PREFIX) else x.astype(np.float32, copy=False)
            if self.normalizer is not None:  # numpy path: bit-identical to the tensor path, single-threaded
                x = self.normalizer.normalize_feature(key, x)
            out[key] = torch.from_numpy(np.ascontiguousarray(x))
        out[OBS_PAD_KEY] = torch.from_numpy(np.ascontiguousarray(arrays[OBS_PAD_KEY]))
        out[ACTION_PAD_KEY] = torch.from_numpy(np.ascontiguousarray(arrays[ACTION_PAD_KEY]))
        out["episode_index"], out["step"] = torch.from_numpy(episode), torch.from_numpy(step)
        return out


def split_episodes(n_episodes: int, val_fraction: float = 0.1, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Random split of episode indices into (train, val), sorted int64 arrays; val has
    ``round(n * val_fraction)`` episodes (at least 1 when ``val_fraction > 0`` and ``n > 1``).

    Raises ValueError for ``val_fraction`` outside ``[0, 1)``.
    """
    if not 0.0 <= val_fraction < 1.0:
        raise ValueError(f"val_fraction: expected in [0, 1), received {val_fraction}")
    n_val = int(round(n_episodes * val_fraction))
    if val_fraction > 0 and n_episodes > 1:
        n_val = max(1, n_val)
    perm = np.random.default_rng(seed).permutation(n_episodes)
    return np.sort(perm[n_val:]), np.sort(perm[:n_val])


def _window(arr: Any, start: int, length: int, steps: np.ndarray) -> np.ndarray:
    """Rows ``steps`` (episode-relative, may fall outside ``[0, length)``) with edge repetition."""
    lo, hi = max(int(steps[0]), 0), min(int(steps[-1]) + 1, length)
    block = np.asarray(arr[start + lo : start + hi])
    return block[np.clip(steps, 0, length - 1) - lo]


__all__ = ["ACTION_PAD_KEY", "OBS_PAD_KEY", "SequenceDataset", "SequenceSampler", "split_episodes"]
