"""ACT behind the PolicyAdapter contract: history window -> normalised tensors -> the CVAE decoder with ``z = 0``
-> one deterministic action chunk in the ActionSpec's units. Capability: ``Embedder`` only (ACT has no denoising
sampler to guide, so it is not a ``GuidedSampler``). Temporal ensembling is the runtime's executor
(``--executor.kind temporal_ensemble``, ``ensemble_m = 0.01`` as in the paper), not part of the policy.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from policylink.adapters.validation import batch_size_of
from policylink.policies.policy import ModelPolicy
from policylink.policies.processing import actions_to_units, observation_tensors


class ACTPolicy(ModelPolicy):
    """An :class:`~policylink.policies.act.model.ACTModel` as a batched PolicyAdapter with ``embed``.

    Args:
        model: the model (its weights as they are: pass the EMA model).
        processors: the processor chain it was trained with (see :class:`~policylink.policies.policy.ModelPolicy`).
        spec: the PolicySpec (its horizons and action dimension must match the model's config).
        device: torch device for inference.
        seed: kept for the interface (:meth:`reseed`); ACT's chunks do not depend on it (``z = 0``).
        validate: validate observations against the spec on every ``update_observation``.

    Raises:
        ValueError: ``spec`` and the model's config disagree (names each mismatch).
    """

    def reseed(self, seed: int) -> None:
        """Record ``seed`` (interface parity with the sampled policies; ACT's output is deterministic)."""
        self.seed = int(seed)

    def embed(self, obs: Mapping[str, Any] | None = None, env_ids: Sequence[int] | None = None) -> np.ndarray:
        """Observation latent float32 ``(B', D)``: of the current windows of rows ``env_ids`` (``obs=None``;
        ``None`` = all rows; recomputed, the encoder is cheap) or of explicit windows ``(B, n_obs_steps, ...)``.

        Raises:
            RuntimeError: ``obs=None`` before any observation. IndexError: an id outside ``[0, B)``.
        """
        if obs is None:
            if self.batch_size is None:
                raise RuntimeError("embed: no observation yet; call update_observation() first")
            obs = self.rows(env_ids)[0]
        elif env_ids is not None:
            obs = {k: np.asarray(v)[np.asarray(list(env_ids), dtype=np.int64)] for k, v in obs.items()}
        return self._encode(obs).cpu().numpy()

    def _encode(self, obs: Mapping[str, Any]) -> torch.Tensor:
        features = self.model.features
        batch_size_of(obs, list(features))
        with torch.no_grad():
            return self.model.embed(observation_tensors(obs, features, self.processors, self.device))

    def _predict(self, history: dict[str, np.ndarray], pad_mask: np.ndarray, tasks: list[str] | None) -> np.ndarray:
        # Padded slots repeat the episode's first observation, as the training windows do (no masking).
        latent = self._encode(history)
        with torch.no_grad():
            chunk = self.model.predict(self.model.condition(latent))
        return actions_to_units(chunk, self.processors)


__all__ = ["ACTPolicy"]
