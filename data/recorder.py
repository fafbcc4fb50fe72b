"""Episode recording into an :class:`~policylink.data.buffer.EpisodeStore`: steps are buffered in memory and an
episode is committed whole on :meth:`EpisodeRecorder.end_episode`; an aborted episode leaves no trace.

Steps follow the gymnasium loop: the observation ``o_t`` that the action ``a_t`` answered, then the reward and
termination that ``env.step(a_t)`` returned. Several slots record parallel episodes (vectorised rollouts with
``B`` envs, one slot per env index), each committed when it ends. Episodes are run by the one rollout loop
(:mod:`policylink.runtime.rollout`, whose ``RecorderSubscriber`` drives this recorder); ``data`` runs no env.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from policylink.adapters.schema import ACTION_KEY, TASK_KEY, EnvSpec
from policylink.data.buffer import DONE_KEY, REWARD_KEY, EpisodeStore
from policylink.data.episode_meta import EpisodeMeta

TERMINATED_KEY = "terminated"
"""Per-step bool array: the env reported a true termination (``terminated``, not a time-limit truncation) at this
step; ``done`` marks every episode end. Recorded when :meth:`EpisodeRecorder.add_step` is given ``terminated``."""


class RecorderError(RuntimeError):
    """A recorder call out of order (step without start, end of an empty episode...) or an inconsistent step."""


class EpisodeRecorder:
    """Record episodes step by step into an episode store.

    Args:
        store: an :class:`EpisodeStore` opened for append, or a path (opened with ``mode="a"`` and
            ``lock_timeout``; closed by :meth:`close`).
        keys: observation keys to keep (default: every non-text key of the first observation, or of
            ``env_spec``'s features). ``task`` is never stored per step: it goes into the episode metadata.
        env_spec: optional spec used to pick the keys, to check each observation's dtype/shape, and saved in
            the store's :attr:`~policylink.data.buffer.EpisodeStore.info` (fps, feature names, action spec).
        lock_timeout: seconds to wait for the store's write lock when ``store`` is a path.

    Raises:
        StoreLockedError: another process is writing the store.
    """

    def __init__(
        self,
        store: EpisodeStore | str | os.PathLike,
        keys: Sequence[str] | None = None,
        env_spec: EnvSpec | None = None,
        lock_timeout: float = 0.0,
    ):
        self._owns_store = not isinstance(store, EpisodeStore)
        self.store = EpisodeStore(store, "a", lock_timeout=lock_timeout) if self._owns_store else store
        if keys is None and env_spec is not None:
            keys = [k for k, f in env_spec.observation_features.items() if not f.is_string]
        self.keys = list(keys) if keys is not None else None
        self.env_spec = env_spec
        if env_spec is not None:
            self.store.update_info(
                fps=float(env_spec.control_frequency),
                env=env_spec.name,
                features={k: f.to_dict() for k, f in env_spec.observation_features.items()},
                action=env_spec.action.to_dict(),
            )
        self._slots: dict[int, dict[str, Any]] = {}

    def start_episode(self, meta: EpisodeMeta | None = None, slot: int = 0) -> None:
        """Begin an episode in ``slot`` (discarding any unfinished one there).

        Args:
            meta: task, seed, source, quality (``success`` is set by :meth:`end_episode`).
            slot: index of the parallel episode (env index in a vector env).
        """
        self._slots[slot] = {"meta": meta or EpisodeMeta(), "steps": {}, "n": 0, "task": None}

    def add_step(
        self,
        obs: Mapping[str, Any],
        action: np.ndarray,
        reward: float = 0.0,
        done: bool = False,
        slot: int = 0,
        terminated: bool | None = None,
    ) -> None:
        """Append one step: observation ``o_t`` (dict of arrays without batch dim), action ``a_t`` float32
        ``(A,)``, and the reward / episode end returned by ``env.step(a_t)``; ``terminated`` (optional) separates
        a true termination from a time-limit end and is stored as :data:`TERMINATED_KEY` (a store that predates
        it keeps its keys).

        Raises:
            RecorderError: no episode was started in ``slot``, or a key is missing / changes shape.
            ObservationError: ``obs`` does not match ``env_spec`` (when given).
        """
        ep = self._slot(slot)
        if self.env_spec is not None:
            from policylink.adapters.validation import validate_observation

            validate_observation({k: self.env_spec.observation_features[k] for k in self.keys or []}, obs)
        if self.keys is None:
            self.keys = [k for k, v in obs.items() if k != TASK_KEY and not isinstance(v, str)]
        if TASK_KEY in obs and ep["task"] is None:
            ep["task"] = str(obs[TASK_KEY])
        row = {}
        for k in self.keys:
            if k not in obs:
                raise RecorderError(f"observation: missing key {k!r}; received {sorted(obs)}")
            row[k] = np.array(obs[k], copy=True)
        row[ACTION_KEY] = np.asarray(action, dtype=np.float32).copy()
        row[REWARD_KEY] = np.float32(reward)
        row[DONE_KEY] = bool(done)
        if terminated is not None and ep.setdefault("keep_terminated", self._store_takes(TERMINATED_KEY)):
            row[TERMINATED_KEY] = bool(terminated)
        for k, v in row.items():
            lst = ep["steps"].setdefault(k, [])
            if lst and np.shape(lst[0]) != np.shape(v):
                raise RecorderError(
                    f"{k}: expected per-step shape {np.shape(lst[0])} (as in step 0), received "
                    f"{np.shape(v)} at step {ep['n']}"
                )
            lst.append(v)
        ep["n"] += 1

    def end_episode(self, success: bool | None = None, slot: int = 0, quality: str | None = None) -> int:
        """Commit the episode of ``slot`` with its success flag; returns its index in the store.

        The last step's ``done`` is set to True (an episode ends there, by termination or truncation). ``quality``
        replaces the quality tag given to :meth:`start_episode` (``"aborted"`` for an interrupted deployment).

        Raises:
            RecorderError: nothing started in ``slot`` or the episode has no step.
        """
        ep = self._slot(slot)
        if ep["n"] == 0:
            raise RecorderError(f"slot {slot}: cannot end an episode with no steps (use abort_episode)")
        data = {k: np.stack(v) for k, v in ep["steps"].items()}
        data[DONE_KEY][-1] = True
        meta = ep["meta"]
        task = meta.task or ep["task"] or ""
        quality = meta.quality if quality is None else quality
        meta = dataclasses.replace(meta, task=task, success=success, quality=quality)
        del self._slots[slot]
        return self.store.add_episode(data, meta)

    def abort_episode(self, slot: int = 0) -> None:
        """Discard the unfinished episode of ``slot`` (nothing reaches the store). No-op when none."""
        self._slots.pop(slot, None)

    def is_recording(self, slot: int = 0) -> bool:
        """True while an episode is open in ``slot``."""
        return slot in self._slots

    def n_steps(self, slot: int = 0) -> int:
        """Steps buffered in ``slot``'s open episode (0 when none)."""
        return self._slots[slot]["n"] if slot in self._slots else 0

    def close(self) -> None:
        """Abort every open episode and release the store's lock when this recorder opened it."""
        self._slots.clear()
        if self._owns_store:
            self.store.close()

    def __enter__(self) -> EpisodeRecorder:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _store_takes(self, key: str) -> bool:
        """True when a new per-step ``key`` fits the store: it is empty or already holds ``key``."""
        keys = self.store.keys
        return not keys or key in keys

    def _slot(self, slot: int) -> dict[str, Any]:
        if slot not in self._slots:
            raise RecorderError(f"slot {slot}: no episode started (call start_episode first)")
        return self._slots[slot]


__all__ = ["EpisodeRecorder", "RecorderError"]
