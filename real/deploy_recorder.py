"""Recording a deployment: the rollout loop's recorder subscriber that stores the command the robot actually
executed, with per-step timing and who acted (:data:`DEPLOY_KEYS`), and commits an interrupted episode instead of
discarding it; :func:`open_deploy_recorder` opens the store. Used by the deployment loop
(:mod:`policylink.real.deploy`)."""

from __future__ import annotations

from typing import Any

import numpy as np

from policylink.real.teleop import STEP_SOURCES
from policylink.runtime.rollout import RecorderSubscriber

DEPLOY_KEYS = ("deploy.latency_s", "deploy.period_error_s", "deploy.late", "deploy.source")
"""Per-step fields recorded with each deployed step: seconds from the observation to the action (float32), wake-up
error of the period's deadline (float32, s), the action missed its period (bool), who acted (int8, index into
:data:`~policylink.real.teleop.STEP_SOURCES`)."""


class DeployRecorder(RecorderSubscriber):
    """The rollout loop's recorder subscriber for deployments: records the command the robot actually executed
    (the human's, the policy's after safety, or the hold for a late action) with the :data:`DEPLOY_KEYS` per-step
    fields, and commits an interrupted episode (Ctrl-C, a dead policy server) with success unknown and ``aborted``
    added to its quality tag instead of discarding it.

    Each episode's quality tag names who acted in it (:meth:`quality`): ``policy`` (a rollout without takeover),
    ``policy+human`` (a human or the scripted operator took over: the steps' ``deploy.source``), ``human`` (every
    step a human's); a ``meta`` template with a quality of its own keeps that one.

    Args:
        recorder: an ``EpisodeRecorder`` whose keys include :data:`DEPLOY_KEYS` (see :func:`open_deploy_recorder`).
        meta: the episode metadata template (source ``policy``).
    """

    def __init__(self, recorder: Any, meta: Any = None):
        super().__init__(recorder, meta)
        self._sources: dict[int, set[int]] = {}  # slot -> the step sources of its episode so far

    def on_reset(self, slot: int, index: int, seed: int, info: Any) -> None:
        """Open the episode (:class:`~policylink.runtime.rollout.RecorderSubscriber`) with no step sources yet."""
        super().on_reset(slot, index, seed, info)
        self._sources[slot] = set()

    def on_step(self, slot, obs, action, reward, done, info) -> None:
        """Buffer the step with its deployment fields (``info["deploy"]``; a step without them as any other)."""
        d = info.get("deploy")
        if d is None:
            return super().on_step(slot, obs, action, reward, done, info)
        self._sources.setdefault(slot, set()).add(int(d["source"]))
        row = {**obs, "deploy.latency_s": np.float32(d["latency_s"]), "deploy.source": np.int8(d["source"])}
        row["deploy.period_error_s"] = np.float32(d["period_error_s"])
        row["deploy.late"] = np.bool_(d["late"] and not d["first"])  # dropped: the first action never is
        self.recorder.add_step(row, d["sent"], reward, done, slot=slot)

    def quality(self, slot: int) -> str:
        """The quality tag of ``slot``'s episode: the template's when it has one, else the names of the step sources
        that acted in it (:data:`~policylink.real.teleop.STEP_SOURCES`, joined by ``+``): ``policy``,
        ``policy+human`` or ``human``; ``policy`` for an episode without steps. Never empty."""
        if self.meta.quality:
            return self.meta.quality
        sources = sorted(self._sources.get(slot) or {0})
        return "+".join(STEP_SOURCES[s] for s in sources)

    def on_episode_end(self, slot: int, result: Any) -> None:
        """Commit the episode with its success flag and its :meth:`quality` tag."""
        success = result.success or self._reset_success.pop(slot, False)
        index = self.recorder.end_episode(success=success, slot=slot, quality=self.quality(slot))
        self.committed[result.index] = (index, success, result.n_steps)
        self._sources.pop(slot, None)

    def on_abort(self, slot: int) -> None:
        """Commit the unfinished episode when it has steps: success unknown, ``aborted`` added to its quality tag
        (``policy+aborted``)."""
        if self.recorder.n_steps(slot) > 0:
            self.recorder.end_episode(success=None, slot=slot, quality=f"{self.quality(slot)}+aborted")
            self._reset_success.pop(slot, None)
        else:
            self.recorder.abort_episode(slot=slot)


def open_deploy_recorder(path: str, env_spec: Any) -> Any:
    """An ``EpisodeRecorder`` on ``path`` for a deployment of ``env_spec``: its numeric observation features plus
    :data:`DEPLOY_KEYS`; the store's info gets the fps, feature and action specs and ``step_sources``."""
    from policylink.data.recorder import EpisodeRecorder

    keys = [k for k, f in env_spec.observation_features.items() if not f.is_string]
    rec = EpisodeRecorder(path, keys=[*keys, *DEPLOY_KEYS])
    rec.store.update_info(
        fps=float(env_spec.control_frequency),
        env=env_spec.name,
        features={k: f.to_dict() for k, f in env_spec.observation_features.items()},
        action=env_spec.action.to_dict(),
        step_sources=list(STEP_SOURCES),
    )
    return rec


__all__ = ["DEPLOY_KEYS", "DeployRecorder", "open_deploy_recorder"]
