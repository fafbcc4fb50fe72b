"""The guided-sampling capability that real-time chunking needs from a policy, and the RTC sampling call."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

import numpy as np

from policylink.runtime.executors.rtc import make_flow_guidance


@runtime_checkable
class GuidedSampler(Protocol):
    """A flow policy that samples with a guidance hook (``policylink.policies.policy.ChunkPolicy`` is one).

    - ``history``: the current observation windows ``{key: (B, n_obs_steps, ...)}``.
    - ``sample(obs, guidance=fn)``: float32 ``(B, H, A)`` in action units; ``fn(x_t, t, v) -> v'`` works in
      normalised action units with flow time ``t`` (0 = noise, 1 = clean) and velocity ``v``.
    - ``normalize_actions(actions)``: actions ``(..., A)`` in units -> normalised torch tensor.
    - ``config.type``: ``"flow"`` (velocity guidance) or ``"diffusion"`` (noise prediction; RTC's velocity
      correction does not apply, so such policies run plain asynchronous execution).
    """

    @property
    def history(self) -> Mapping[str, np.ndarray]: ...

    @property
    def config(self) -> Any: ...

    def sample(self, obs: Mapping[str, Any], *, guidance: Any = None) -> np.ndarray: ...

    def normalize_actions(self, actions: np.ndarray) -> Any: ...


def supports_rtc(policy: Any) -> bool:
    """True for a :class:`GuidedSampler` whose sampler is a flow (velocity) sampler."""
    return isinstance(policy, GuidedSampler) and str(getattr(policy.config, "type", "")) == "flow"


def sample_with_rtc(
    policy: GuidedSampler, committed: np.ndarray, weights: np.ndarray, max_guidance: float
) -> np.ndarray:
    """Sample the next chunk for the policy's current windows with RTC guidance toward ``committed``.

    Args:
        policy: a flow :class:`GuidedSampler`.
        committed: float32 ``(B, H, A)``: the previous chunk's remaining actions in the new chunk's frame, in
            action units (rows/steps without one carry zero weight).
        weights: float ``(B, H)``: RTC prefix weights (:func:`~policylink.runtime.executors.rtc.rtc_weights`
            times the validity of ``committed``).
        max_guidance: RTC's ``beta``.

    Returns:
        float32 ``(B, H, A)`` in action units.
    """
    import torch

    target = policy.normalize_actions(np.asarray(committed, np.float32))
    w = torch.as_tensor(np.asarray(weights, np.float32), device=target.device)
    return policy.sample(policy.history, guidance=make_flow_guidance(target, w, max_guidance))
