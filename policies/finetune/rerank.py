"""Best-of-N reranking with a chunk critic at test time (the same-critic baseline of Q-VGM): sample ``N`` chunks
per row from the unchanged policy and execute the one the critic scores highest."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from policylink.policies.critics import ChunkCritic, critic_state
from policylink.policies.model import ChunkModel
from policylink.policies.policy import ChunkPolicy
from policylink.policies.processing import actions_to_units, observation_tensors


class BestOfNPolicy(ChunkPolicy):
    """A :class:`ChunkPolicy` whose every chunk is the best of ``n`` samples under ``critic.actor_q`` (mean of
    the online heads) at the critic state from ``reference``'s encoder.

    Args:
        model, processors, spec: as :class:`ChunkPolicy`.
        critic: a trained :class:`ChunkCritic` (its ``horizon`` leading steps are scored).
        reference: the frozen model whose latents the critic was trained on (default: ``model``).
        n: samples per row (>= 1; the issue's 32).
        **kwargs: ``device``, ``seed``, ``validate`` (and the deprecated ``normalizer``) of :class:`ChunkPolicy`.

    Raises:
        ValueError: ``n < 1`` or a spec/model mismatch.
    """

    def __init__(self, model: ChunkModel, processors, spec, *, critic: ChunkCritic, reference=None, n=32, **kwargs):
        if int(n) < 1:
            raise ValueError(f"rerank.n: expected >= 1 samples per row, received {n}")
        super().__init__(model, processors, spec, **kwargs)
        self.critic = critic.to(self.device).eval()
        self.reference = (reference or model).to(self.device).eval()
        self.n = int(n)

    @torch.no_grad()
    def _predict(self, history: dict[str, np.ndarray], pad_mask: np.ndarray, tasks: Any) -> np.ndarray:
        obs = observation_tensors(history, self.model.features, self.processors, self.device)
        b, n = next(iter(obs.values())).shape[0], self.n
        cond = self.model.condition(self.model.embed(obs)).repeat_interleave(n, 0)
        noise = torch.randn((b * n, self.spec.chunk_size, self.spec.action.dim), generator=self._generator)
        chunks = self.model.generate(cond, noise.to(self.device))
        s = critic_state(self.reference.embed(obs), obs).repeat_interleave(n, 0)
        q = self.critic.actor_q(s, chunks).view(b, n)
        best = chunks.view(b, n, *chunks.shape[1:])[torch.arange(b), q.argmax(1)]
        return actions_to_units(best, self.processors)


__all__ = ["BestOfNPolicy"]
