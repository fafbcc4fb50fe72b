"""Windowed sequence sampling over episodes with edge padding and pad masks, and a map-style torch dataset.

A sample is anchored at an episode step ``t`` (the newest observation). Its window starts at
``w = t - (n_obs_steps - 1)`` and spans ``horizon`` steps: observations are steps ``w .. t``
(``n_obs_steps``), actions are steps ``w .. w + horizon - 1``, as in diffusion_policy's
``SequenceSampler`` (Chi et al. 2023). Steps outside the episode repeat the edge value (first step before,
last step after) and are flagged in ``observation_is_pad`` / ``action_is_pad`` (True = padded, LeRobot's
``*_is_pad`` naming). Windows never cross episodes, so an episode subset (a train/val split) pads exactly as
the full set does. With the default ``pad_before = n_obs_steps - 1`` and ``pad_after = horizon - n_obs_steps``
every step of every episode is an anchor; diffusion_policy's ``pad_after = n_action_steps - 1`` is one option.

Besides observations and actions a dataset yields, on request, any other per-step array of the store (``reward``,
``done``, labels...) over the action window, per-episode tags (``success``, ``seed``, ``source``, ``quality``), and
chunk transitions ``(s_t, A_t = a_{t:t+H}, R_t = sum_k gamma^k r_{t+k}, s_{t+H}, d)`` for chunk critics (IQL,
Kostrikov et al. 2021, arXiv 2110.06169, chunked as in Q-chunking, arXiv 2507.07969).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from policylink.adapters.schema import ACTION_KEY
from policylink.data.buffer import DONE_KEY, REWARD_KEY, EpisodeStore
from policylink.data.processors import Processors

OBS_PAD_KEY = "observation_is_pad"
ACTION_PAD_KEY = "action_is_pad"
EPISODE_FIELDS = ("success", "seed", "source", "quality")
"""Per-episode tags a :class:`SequenceDataset` can add to its items (fields of
:class:`~policylink.data.episode_meta.EpisodeMeta`)."""
_TEXT_EPISODE_FIELDS = ("source", "quality")
NEXT_PREFIX = "next."
"""Key prefix of the observation window ``s_{t+H}`` in a transition batch (``next.observation.state``, ...)."""


class SequenceSampler:
    """Index windows over concatenated episode arrays (numpy arrays or zarr arrays, ``(N_steps, ...)``).

    Args:
        data: key -> array ``(N_steps, *shape)``, episodes concatenated in time.
        episode_ends: int ``(N_episodes,)`` exclusive end of each episode.
        n_obs_steps: observation window ``To`` (>= 1).
        horizon: action window ``H`` (>= ``n_obs_steps``).
        obs_keys: keys returned with ``To`` steps.
        action_key: key returned with ``H`` steps.
        step_keys: further per-step keys returned over the action window (``H`` steps, edge-padded like the
            action), e.g. ``reward`` or ``done``.
        episodes: subset of episode indices to sample from (default: all).
        pad_before: max padded steps before an episode's start (default ``To - 1``).
        pad_after: max padded steps after its end (default ``H - To``).
        chain_windows: ``K``; when > 1 the observation keys return a *chain* of ``K`` consecutive windows ending
            at the anchor, ``chain_stride`` steps apart, oldest first, concatenated in time: ``(K * To, ...)``,
            with ``observation_is_pad`` ``(K * To,)``; a window whose newest step lies before the episode start
            is all padding (recurrent memories, e.g. SEGA, skip it). Actions stay the anchor's window.
        chain_stride: steps between the chain's window anchors (the policy's ``n_action_steps``).

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
        step_keys: Sequence[str] = (),
        episodes: Sequence[int] | None = None,
        pad_before: int | None = None,
        pad_after: int | None = None,
        chain_windows: int = 1,
        chain_stride: int = 1,
    ):
        if chain_windows < 1 or chain_stride < 1:
            raise ValueError(f"chain_windows/chain_stride: expected >= 1, received {chain_windows}, {chain_stride}")
        self.chain_windows, self.chain_stride = int(chain_windows), int(chain_stride)
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
        missing = [k for k in [*obs_keys, action_key, *step_keys] if k not in data]
        if missing:
            raise KeyError(f"sampler keys {missing}: not in the data; available: {sorted(data)}")
        self.data = data
        self.obs_keys, self.action_key, self.step_keys = list(obs_keys), action_key, list(step_keys)
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
        """Window ``i``: obs keys ``(To, *shape)``, action and step keys ``(H, *shape)`` (raw dtype),
        ``observation_is_pad`` bool ``(To,)``, ``action_is_pad`` bool ``(H,)``, ``episode_index`` and ``step``
        (anchor ``t``) ints.

        Raises IndexError for ``i`` outside ``[0, len)``.
        """
        if not -len(self) <= i < len(self):
            raise IndexError(f"sample index: expected in [0, {len(self)}), received {i}")
        e, start, length, w = (int(v) for v in self._index[i])
        out: dict[str, Any] = {}
        obs_steps = np.arange(w, w + self.n_obs_steps)
        if self.chain_windows > 1:  # K windows ending chain_stride * k steps earlier, oldest first
            back = self.chain_stride * np.arange(self.chain_windows - 1, -1, -1)
            obs_steps = (obs_steps[None, :] - back[:, None]).reshape(-1)
        act_steps = np.arange(w, w + self.horizon)
        for key in self.obs_keys:
            out[key] = _window(self.data[key], start, length, obs_steps)
        for key in [self.action_key, *self.step_keys]:
            out[key] = _window(self.data[key], start, length, act_steps)
        out[OBS_PAD_KEY] = (obs_steps < 0) | (obs_steps >= length)
        out[ACTION_PAD_KEY] = (act_steps < 0) | (act_steps >= length)
        out["episode_index"] = e
        out["step"] = w + self.n_obs_steps - 1
        return out

    __getitem__ = sample

    def later_observation(self, i: int, steps: int) -> tuple[dict[str, np.ndarray], np.ndarray, bool]:
        """The observation window of window ``i``'s episode ``steps`` steps after its anchor ``t``.

        Returns:
            obs keys -> ``(To, *shape)`` windows ending at ``min(t + steps, L - 1)`` (edge-padded before the
            episode start), ``observation_is_pad`` bool ``(To,)``, and whether ``t + steps`` lies past the
            episode's last step ``L - 1`` (the observation after an episode's last action is not stored, so the
            last one stands in for it).

        Raises IndexError for ``i`` outside ``[0, len)``.
        """
        if not -len(self) <= i < len(self):
            raise IndexError(f"sample index: expected in [0, {len(self)}), received {i}")
        e, start, length, w = (int(v) for v in self._index[i])
        t = w + self.n_obs_steps - 1 + int(steps)
        beyond = t > length - 1
        t = min(t, length - 1)
        obs_steps = np.arange(t - self.n_obs_steps + 1, t + 1)
        obs = {key: _window(self.data[key], start, length, obs_steps) for key in self.obs_keys}
        return obs, obs_steps < 0, beyond


class SequenceDataset:
    """Map-style dataset (usable with ``torch.utils.data.DataLoader``) of windows from an :class:`EpisodeStore`.

    Items are dicts of torch tensors: each obs key float32 ``(To, *shape)`` -- images as float CHW
    ``(To, 3, H, W)`` in ``[0, 1]`` -- and the action float32 ``(H, A)``, through the policy's ``processors``
    (layout, then normalisation when the chain has it; image stats are in that same ``[0, 1]`` scale);
    ``observation_is_pad`` bool ``(To,)``,
    ``action_is_pad`` bool ``(H,)``, ``episode_index`` / ``step`` int64 scalars and ``task`` (str). Requested
    ``step_fields`` come over the action window ``(H, *shape)`` in their stored dtype, never normalized
    (``reward`` float32 ``(H,)``, ``done`` bool ``(H,)``; padded steps repeat the edge value, see
    ``action_is_pad``); requested ``episode_fields``: ``success`` int8 (1, 0, -1 unknown), ``seed`` int64 (-1
    unknown), ``source`` / ``quality`` str.

    Args:
        store: an open store or its path.
        n_obs_steps, horizon: window sizes (see :class:`SequenceSampler`).
        obs_keys: observation keys (default: every ``observation.*`` key of the store).
        action_key: action key.
        step_fields: further per-step arrays of the store to return (``reward``, ``done``, labels...).
        episode_fields: per-episode tags to return, a subset of :data:`EPISODE_FIELDS`.
        episodes: episode subset (e.g. from :func:`split_episodes`).
        processors: the policy's :class:`~policylink.data.processors.Processors`, run on the obs and action
            windows (every requested key must have a normalisation mode when the chain normalises); default: the
            layout step only.
        normalizer: deprecated (one release): a :class:`~policylink.data.stats.Normalizer` stands for
            ``processors=Processors.for_keys(obs_keys, normalizer)``; give ``processors`` instead.
        in_memory: load the arrays into RAM once (fast random access) instead of reading zarr per item.
        pad_before, pad_after, chain_windows, chain_stride: see :class:`SequenceSampler`.

    Raises:
        KeyError: a requested key is not in the store, or the processors' normaliser has no mode for an obs/action
            key.
        ValueError: an unknown episode field, or bad horizons/padding/episodes (:class:`SequenceSampler`).
    """

    def __init__(
        self,
        store: EpisodeStore | str | Path,
        *,
        n_obs_steps: int,
        horizon: int,
        obs_keys: Sequence[str] | None = None,
        action_key: str = ACTION_KEY,
        step_fields: Sequence[str] = (),
        episode_fields: Sequence[str] = (),
        episodes: Sequence[int] | None = None,
        processors: Processors | None = None,
        normalizer: Any = None,
        in_memory: bool = True,
        pad_before: int | None = None,
        pad_after: int | None = None,
        chain_windows: int = 1,
        chain_stride: int = 1,
    ):
        if not isinstance(store, EpisodeStore):
            store = EpisodeStore(store, "r")
        unknown = [f for f in episode_fields if f not in EPISODE_FIELDS]
        if unknown:
            raise ValueError(f"episode_fields: expected a subset of {EPISODE_FIELDS}, received unknown {unknown}")
        self.obs_keys = [k for k in store.keys if k.startswith("observation.")] if obs_keys is None else list(obs_keys)
        self.step_fields, self.episode_fields = list(step_fields), list(episode_fields)
        keys = [*self.obs_keys, action_key]
        missing = [k for k in self.step_fields if k not in store.keys]
        if missing:
            raise KeyError(f"step_fields {missing}: not in the store {str(store.path)!r}; it holds {store.keys}")
        wanted = [*keys, *self.step_fields]
        data = store.load(wanted) if in_memory else {k: store.array(k) for k in wanted}
        self.sampler = SequenceSampler(
            data,
            store.episode_ends,
            n_obs_steps=n_obs_steps,
            horizon=horizon,
            obs_keys=self.obs_keys,
            action_key=action_key,
            step_keys=self.step_fields,
            episodes=episodes,
            pad_before=pad_before,
            pad_after=pad_after,
            chain_windows=chain_windows,
            chain_stride=chain_stride,
        )
        self.meta = store.all_meta()
        self.tasks = [m.task for m in self.meta]
        self.action_key = action_key
        if normalizer is not None:
            if processors is not None:
                raise ValueError("normalizer: deprecated alias of processors; received both, give processors only")
            warnings.warn(
                "SequenceDataset(normalizer=...) is deprecated: pass processors=Processors.for_keys(obs_keys, "
                "normalizer) (policylink.data.processors)",
                DeprecationWarning,
                stacklevel=2,
            )
            processors = Processors.for_keys(self.obs_keys, normalizer)
        self.processors = Processors.for_keys(self.obs_keys) if processors is None else processors
        normalizer = self.processors.normalizer
        missing = [] if normalizer is None else [k for k in keys if k not in normalizer.keys]
        if missing:
            raise KeyError(f"normalizer: no mode for {missing}; configured: {normalizer.keys}")

    def __len__(self) -> int:
        return len(self.sampler)

    @property
    def chunk_length(self) -> int:
        """Actions from the anchor step on: ``H_c = horizon - n_obs_steps + 1`` (the policy's chunk size)."""
        return self.sampler.horizon - self.sampler.n_obs_steps + 1

    def __getitem__(self, i: int) -> dict[str, Any]:
        s = self.sampler.sample(int(i))
        e = s["episode_index"]
        windows = {k: s[k] for k in self._window_keys()}
        out = self._tensors(windows, np.array(e, np.int64), np.array(s["step"], np.int64))
        out["task"] = self.tasks[e]
        for f in self.episode_fields:
            value = getattr(self.meta[e], f)
            out[f] = value if f in _TEXT_EPISODE_FIELDS else _episode_code(f, value)
        return out

    def get_batch(self, indices: Sequence[int]) -> dict[str, Any]:
        """Items ``indices`` stacked into a batch: the same keys as an item with a leading ``B`` dim (``task``,
        ``source``, ``quality`` lists of ``B`` str; ``success`` / ``seed`` tensors ``(B,)``). Stacking and
        normalization run in numpy, which is single-threaded and equal to the per-item path (bit for bit); on a
        busy CPU torch's intra-op threads make ``torch.stack`` of image windows orders of magnitude slower
        (benchmarks/results/data_throughput.md).
        """
        samples = [self.sampler.sample(int(i)) for i in indices]
        episodes = np.array([s["episode_index"] for s in samples], np.int64)
        out = self._tensors(
            {k: np.stack([s[k] for s in samples]) for k in self._window_keys()},
            episodes,
            np.array([s["step"] for s in samples], np.int64),
        )
        out["task"] = [self.tasks[e] for e in episodes]
        out.update(self._episode_batch(episodes))
        return out

    def get_transitions(self, indices: Sequence[int], gamma: float) -> dict[str, Any]:
        """Chunk transitions ``(s_t, A_t, R_t, s_{t+H}, d)`` at windows ``indices`` (``H = chunk_length``).

        Everything :meth:`get_batch` returns (``s_t`` is the obs window; ``A_t`` is the action window from the
        anchor on, ``action[:, n_obs_steps - 1:]``; ``step_fields`` must include ``reward`` and ``done``), plus:

        - ``return`` float32 ``(B,)``: ``R_t = sum_{k<n} gamma^k r_{t+k}`` over the ``n = min(H, L - t)`` steps
          inside the episode (``L`` its length; padded steps add nothing), summed in float64;
        - ``terminal`` bool ``(B,)``: ``d``, True when ``done`` is set at one of those ``n`` steps;
        - ``discount`` float32 ``(B,)``: the bootstrap factor ``gamma^n`` (``gamma^H`` for a full chunk), for
          a TD target ``R_t + discount * (1 - d) * V(s_{t+H})``;
        - ``next.<obs key>`` ``(B, To, ...)`` (normalized like the obs) and ``next.observation_is_pad`` bool
          ``(B, To)``: the window ``s_{t+H}`` ending at step ``t + H``;
        - ``next_is_pad`` bool ``(B,)``: ``t + H`` lies past the episode's last step, so ``s_{t+H}`` repeats the
          window ending at ``L - 1`` (the store holds no observation after the last action).

        Note: the recorder sets ``done`` on every episode's last step, a time-limit end included; a store that
        separates terminations (e.g. a ``terminated`` array) can be read by requesting that field instead.

        Raises:
            KeyError: ``reward`` or ``done`` is not among ``step_fields``.
            ValueError: ``gamma`` outside ``(0, 1]``.
        """
        missing = [k for k in (REWARD_KEY, DONE_KEY) if k not in self.step_fields]
        if missing:
            raise KeyError(f"step_fields: transitions need {missing}; the dataset was built with {self.step_fields}")
        if not 0.0 < gamma <= 1.0:
            raise ValueError(f"gamma: expected a discount in (0, 1], received {gamma}")
        out = self.get_batch(indices)
        h, first = self.chunk_length, self.sampler.n_obs_steps - 1
        inside = ~out[ACTION_PAD_KEY][:, first:].numpy()  # (B, H): steps t .. t+H-1 within the episode
        rewards = out[REWARD_KEY][:, first:].numpy().astype(np.float64)
        n = inside.sum(1)
        out["return"] = _as_tensor((rewards * gamma ** np.arange(h) * inside).sum(1).astype(np.float32))
        out["terminal"] = _as_tensor((out[DONE_KEY][:, first:].numpy() & inside).any(1))
        out["discount"] = _as_tensor((gamma ** n.astype(np.float64)).astype(np.float32))
        later = [self.sampler.later_observation(int(i), h) for i in indices]
        nxt = self._tensors({k: np.stack([o[k] for o, _, _ in later]) for k in self.obs_keys})
        for k in self.obs_keys:
            out[NEXT_PREFIX + k] = nxt[k]
        out[NEXT_PREFIX + OBS_PAD_KEY] = _as_tensor(np.stack([p for _, p, _ in later]))
        out["next_is_pad"] = _as_tensor(np.array([b for _, _, b in later], bool))
        return out

    def _window_keys(self) -> list[str]:
        return [*self.obs_keys, self.action_key, *self.step_fields, OBS_PAD_KEY, ACTION_PAD_KEY]

    def _episode_batch(self, episodes: np.ndarray) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in self.episode_fields:
            values = [getattr(self.meta[e], f) for e in episodes]
            codes = None if f in _TEXT_EPISODE_FIELDS else np.stack([_episode_code(f, v) for v in values])
            out[f] = values if codes is None else _as_tensor(codes)
        return out

    def _tensors(
        self, arrays: dict[str, np.ndarray], episode: np.ndarray | None = None, step: np.ndarray | None = None
    ) -> dict[str, Any]:
        """Raw windows (any leading dims) -> the processors' float32 torch tensors (images CHW in [0, 1], pointmaps
        CHW in m, normalised) for the obs and action keys present; pad masks and step fields as stored."""
        out: dict[str, Any] = {}
        for key in [*self.obs_keys, self.action_key]:
            if key not in arrays:
                continue
            out[key] = _as_tensor(self.processors.process(key, arrays[key]))
        for key in [*self.step_fields, OBS_PAD_KEY, ACTION_PAD_KEY]:
            if key in arrays:
                out[key] = _as_tensor(arrays[key])
        if episode is not None:
            out["episode_index"], out["step"] = _as_tensor(episode), _as_tensor(step)
        return out


def _as_tensor(x: np.ndarray) -> Any:
    """``torch.from_numpy`` of ``x`` made contiguous (no copy when it already is; torch imported on first use)."""
    import torch

    x = np.asarray(x)
    return torch.from_numpy(x if x.flags.c_contiguous else np.ascontiguousarray(x))  # keeps 0-d arrays 0-d


def _episode_code(field: str, value: Any) -> np.ndarray:
    """``success`` -> int8 (1, 0, -1 unknown); ``seed`` -> int64 (-1 unknown)."""
    if field == "success":
        return np.array(-1 if value is None else int(value), np.int8)
    return np.array(-1 if value is None else int(value), np.int64)


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


__all__ = [
    "ACTION_PAD_KEY",
    "EPISODE_FIELDS",
    "NEXT_PREFIX",
    "OBS_PAD_KEY",
    "SequenceDataset",
    "SequenceSampler",
    "split_episodes",
]
