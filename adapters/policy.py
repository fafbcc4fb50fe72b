"""The PolicyAdapter contract: a batched policy over ``B`` parallel episodes, and a base class with history.

Every call is batched (unbatched use is ``B = 1``). Observations are dicts of numpy arrays shaped
``(B, *feature.shape)`` plus an optional ``task`` list of ``B`` strings; a chunk is float32 ``(B, H, A)``
in the ActionSpec's units (``H = spec.chunk_size``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

from policylink.adapters.schema import (
    TASK_KEY,
    ActionError,
    ObservationError,
    PolicySpec,
)
from policylink.adapters.validation import batch_size_of, validate_observation


@runtime_checkable
class PolicyAdapter(Protocol):
    """What every policy (in-process, remote, VLA) implements.

    - ``spec``: the :class:`PolicySpec`.
    - ``reset(env_ids)``: clear history and queued state of those episodes only (``None`` = all).
    - ``update_observation(obs_batch)``: append one step ``(B, ...)`` to each episode's history window.
    - ``predict_action_chunk(env_ids=None)``: float32 ``(B', chunk_size, A)`` for the latest observations of
      rows ``env_ids`` (``None`` = all).
    """

    @property
    def spec(self) -> PolicySpec:
        """The :class:`PolicySpec`: required features, ActionSpec, horizons, control frequency (Hz)."""
        ...

    def reset(self, env_ids: Sequence[int] | None = None) -> None:
        """Start new episodes for ``env_ids`` (indices into the batch; ``None`` = all); others keep their state."""
        ...

    def update_observation(self, obs_batch: Mapping[str, Any]) -> None:
        """Append one step: arrays ``(B, *feature.shape)`` keyed by feature, ``task`` a list of ``B`` str.

        Raises:
            ObservationError: a required feature is missing, or has the wrong dtype/shape, or non-finite values.
        """
        ...

    def predict_action_chunk(self, env_ids: Sequence[int] | None = None) -> np.ndarray:
        """float32 ``(B', chunk_size, A)`` in the ActionSpec's units for rows ``env_ids`` (``None`` = all ``B``
        rows, in order); index 0 is the action for the newest step. Rows not asked for are not computed."""
        ...


class HistoryPolicy(ABC):
    """Base class that keeps a per-episode observation window of ``spec.n_obs_steps`` with a pad mask.

    After ``reset``, an episode's first observation fills the whole window (repeated), and the pad mask
    marks the repeated slots ``True``; each later observation shifts the window left by one. Subclasses
    implement :meth:`_predict` and receive the window already stacked.

    Window layout: ``history[key]`` is ``(B, n_obs_steps, *feature.shape)``, oldest first;
    ``pad_mask`` is bool ``(B, n_obs_steps)``; ``tasks`` is a list of ``B`` strings (or None).
    """

    def __init__(self, spec: PolicySpec, validate: bool = True):
        self._spec = spec
        self._validate = validate
        self._history: dict[str, np.ndarray] = {}
        self._pad_mask: np.ndarray | None = None
        self._fresh: np.ndarray | None = None  # (B,) bool: next observation starts a new window
        self._tasks: list[str] | None = None
        self._batch_size: int | None = None

    @property
    def spec(self) -> PolicySpec:
        """The policy's :class:`PolicySpec`."""
        return self._spec

    @property
    def batch_size(self) -> int | None:
        """``B`` of the current batch of episodes, or None before the first observation."""
        return self._batch_size

    def reset(self, env_ids: Sequence[int] | None = None) -> None:
        """Start new episodes for ``env_ids`` (``None`` = every episode, which also forgets ``B``)."""
        if env_ids is None or self._fresh is None:
            self._history, self._pad_mask, self._fresh, self._tasks, self._batch_size = (
                {},
                None,
                None,
                None,
                None,
            )
            return
        ids = np.asarray(list(env_ids), dtype=np.int64)
        if ids.size and (ids.min() < 0 or ids.max() >= self._batch_size):
            raise IndexError(f"env_ids: expected indices in [0, {self._batch_size}), received {ids.tolist()}")
        self._fresh[ids] = True
        self._on_reset(ids)

    def update_observation(self, obs_batch: Mapping[str, Any]) -> None:
        """Append one observation per episode. Arrays are ``(B, *shape)``; ``task`` a list of ``B`` str.

        Raises:
            ObservationError: a required feature is missing or has the wrong dtype/shape, or ``B`` changed
                without ``reset()``.
        """
        feats = self._spec.observation_features
        if self._validate:
            validate_observation(feats, obs_batch, batch_dims=1)
        array_keys = [k for k, f in feats.items() if not f.is_string]
        b = batch_size_of(obs_batch, [*array_keys, *([TASK_KEY] if TASK_KEY in feats else [])])
        if self._batch_size is None:
            self._batch_size = b
            self._fresh = np.ones(b, dtype=bool)
            self._pad_mask = np.ones((b, self._spec.n_obs_steps), dtype=bool)
        elif b != self._batch_size:
            raise ObservationError(
                [f"batch size: expected {self._batch_size} (as before), received {b}; call reset() to change it"]
            )
        t = self._spec.n_obs_steps
        for key in array_keys:
            x = np.asarray(obs_batch[key])
            if key not in self._history:
                self._history[key] = np.repeat(x[:, None], t, axis=1).copy()
            hist = self._history[key]
            hist[~self._fresh] = np.roll(hist[~self._fresh], -1, axis=1)
            hist[~self._fresh, -1] = x[~self._fresh]
            hist[self._fresh] = x[self._fresh][:, None]
        self._pad_mask[~self._fresh] = np.roll(self._pad_mask[~self._fresh], -1, axis=1)
        self._pad_mask[~self._fresh, -1] = False
        self._pad_mask[self._fresh] = True
        self._pad_mask[self._fresh, -1] = False
        if TASK_KEY in obs_batch:
            tasks = obs_batch[TASK_KEY]
            if isinstance(tasks, str) or len(tasks) != b:
                got = "a bare str" if isinstance(tasks, str) else f"{len(tasks)} entries"
                raise ObservationError([f"{TASK_KEY}: expected a list of {b} str (one per episode), received {got}"])
            self._tasks = [str(t) for t in tasks]
        self._fresh[:] = False

    def predict_action_chunk(self, env_ids: Sequence[int] | None = None) -> np.ndarray:
        """float32 ``(B', chunk_size, A)`` for the current windows of rows ``env_ids`` (``None`` = all ``B``).

        Only the selected rows are passed to :meth:`_predict`, so a batched policy computes nothing for the
        others.

        Raises:
            RuntimeError: no observation since the last full reset.
            IndexError: an id outside ``[0, B)``.
            ActionError: the subclass returned the wrong shape/dtype or non-finite values.
        """
        if self._batch_size is None or not self._history and self._spec.observation_features:
            raise RuntimeError("predict_action_chunk: no observation yet; call update_observation() first")
        history, pad_mask, tasks = self.rows(env_ids)
        chunk = self._predict(history, pad_mask, tasks)
        expected = (len(pad_mask), self._spec.chunk_size, self._spec.action.dim)
        if not isinstance(chunk, np.ndarray) or chunk.shape != expected:
            got = chunk.shape if isinstance(chunk, np.ndarray) else type(chunk).__name__
            raise ActionError([f"action chunk: expected shape {expected}, received {got}"])
        return self._spec.action.validate(chunk, batch_dims=2)

    def rows(self, env_ids: Sequence[int] | None = None) -> tuple[dict[str, np.ndarray], np.ndarray, list[str] | None]:
        """``(history, pad_mask, tasks)`` of rows ``env_ids`` (``None`` = all; then the windows themselves, not
        copies, and a copy of the pad mask).

        Raises:
            IndexError: an id outside ``[0, B)``.
        """
        if env_ids is None:
            return self._history, self._pad_mask.copy(), self._tasks
        ids = np.asarray(list(env_ids), dtype=np.int64)
        if ids.size and (ids.min() < 0 or ids.max() >= (self._batch_size or 0)):
            raise IndexError(f"env_ids: expected indices in [0, {self._batch_size}), received {ids.tolist()}")
        tasks = None if self._tasks is None else [self._tasks[i] for i in ids]
        return {k: v[ids] for k, v in self._history.items()}, self._pad_mask[ids], tasks

    @property
    def history(self) -> dict[str, np.ndarray]:
        """Current windows ``{key: (B, n_obs_steps, *shape)}`` (read-only views; do not mutate)."""
        return self._history

    @property
    def pad_mask(self) -> np.ndarray | None:
        """bool ``(B, n_obs_steps)``: True where a slot repeats the first observation of the episode."""
        return self._pad_mask

    @abstractmethod
    def _predict(self, history: dict[str, np.ndarray], pad_mask: np.ndarray, tasks: list[str] | None) -> np.ndarray:
        """Return float32 ``(B, chunk_size, A)`` from windows ``(B, n_obs_steps, ...)`` and the pad mask."""

    def _on_reset(self, env_ids: np.ndarray) -> None:  # noqa: B027 - optional hook
        """Hook for subclasses holding per-episode state besides the window (e.g. recurrent latents)."""
