"""The VLA behind the PolicyAdapter contract: a :class:`~policylink.policies.policy.PrefixChunkPolicy` (flow:
guided sampling, RTC prefixes, ``embed``, conditioning slot) whose encoder also reads each row's instruction
(``obs["task"]``, kept by the history with the windows)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from policylink.adapters.schema import TASK_KEY
from policylink.adapters.validation import batch_size_of
from policylink.policies.policy import PrefixChunkPolicy
from policylink.policies.processing import observation_tensors
from policylink.policies.vla.language import InstructionError


class VLAPolicy(PrefixChunkPolicy):
    """A :class:`~policylink.policies.vla.model.VLAModel` as a batched PolicyAdapter.

    Observations carry ``task`` (a list of ``B`` instructions) with the arrays; the instruction of a row is the
    latest one it received. Language tokens are cached per instruction string by the model's encoder, and the
    row's whole latent is cached until its window changes (:class:`ChunkPolicy`), so a replan without a new
    observation runs no encoder at all.

    Raises (on predict / sample / embed):
        InstructionError: no instruction, or one the encoder cannot encode (names ``task``).
        KeyError: a camera or state the policy reads is missing from the observation (names the key).
    """

    def rows(self, env_ids: Sequence[int] | None = None) -> tuple[dict[str, Any], np.ndarray, list[str] | None]:
        """As :meth:`HistoryPolicy.rows`, with the rows' instructions also under ``history["task"]``."""
        history, pad_mask, tasks = super().rows(env_ids)
        if tasks is not None:
            history = {**history, TASK_KEY: list(tasks)}
        return history, pad_mask, tasks

    def _encode(self, obs: Mapping[str, Any], rows: np.ndarray | None = None) -> torch.Tensor:
        """Latents ``(B, D)`` of windows ``obs`` with their ``task`` instructions (the VLA keeps no recurrent
        memory, so ``rows`` is not needed)."""
        features = self.model.features
        b = batch_size_of(obs, list(features))
        tensors: dict[str, Any] = observation_tensors(obs, features, self.processors, self.device)
        if self.model.language.num_tokens:
            tasks = obs.get(TASK_KEY)
            if tasks is None:
                raise InstructionError(
                    f"{TASK_KEY}: the VLA needs one instruction per episode in the observation, received none "
                    f"(keys {sorted(obs)})"
                )
            tasks = [tasks] * b if isinstance(tasks, str) and b == 1 else list(np.asarray(tasks, dtype=object))
            tensors[TASK_KEY] = tasks
        with torch.no_grad():
            return self.model.embed(tensors)


__all__ = ["VLAPolicy"]
