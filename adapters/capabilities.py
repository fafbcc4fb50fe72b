"""Typed capability protocols a policy may offer besides the :class:`~policylink.adapters.policy.PolicyAdapter`
contract: guided sampling with a denoising trajectory, observation latents, extra conditioning, and real-time
chunking (an inpainting prefix). Callers test for a capability with ``isinstance(policy, Protocol)``, never with
``getattr`` or a type string; a remote policy has exactly the capabilities its server advertises in ``hello``.

This module imports no deep-learning stack: tensors are typed ``Any`` and documented as torch tensors.
Time convention (DESIGN section 4): every sampler reports time ``t`` float ``(B,)`` in ``[0, 1]`` with ``t = 0``
pure noise and ``t = 1`` clean actions; flow policies use ``x_t = t a + (1 - t) eps``; diffusion samplers map
their DDPM timestep ``k`` to ``t = 1 - k / K``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol, runtime_checkable

import numpy as np


class Prediction(StrEnum):
    """What a denoising network outputs at each step: a flow ``velocity`` ``v = a - eps``, the diffusion noise
    ``epsilon``, or the clean chunk ``sample``."""

    VELOCITY = "velocity"
    EPSILON = "epsilon"
    SAMPLE = "sample"


GuidanceFn = Callable[[Any, Any, Any, Any, Any], Any]
"""``fn(x_t, t, out, cond, model) -> out'`` at every denoising step, in normalised action units:

- ``x_t``: torch float32 ``(B, H, A)`` the current noisy chunk (``requires_grad`` when the hook asks for autograd);
- ``t``: torch float32 ``(B,)`` in ``[0, 1]`` (0 = noise, 1 = clean);
- ``out``: the network's prediction ``(B, H, A)`` (see :class:`Prediction`), a function of ``x_t`` under autograd;
- ``cond``: the conditioning the network saw (torch ``(B, D)`` or a dict of tensors; the model defines it);
- ``model``: the :class:`DenoisingSampler` (``denoise``, ``clean_estimate``...), so a hook can re-run the network;
- returns the corrected prediction, same shape as ``out`` (detached by the sampler after the step).
"""


@dataclass(frozen=True)
class Guidance:
    """A guidance hook for :meth:`GuidedSampler.sample`.

    Attributes:
        fn: the hook (:data:`GuidanceFn`).
        autograd: when True the sampler runs each step with gradients enabled and ``x_t.requires_grad_()``, so
            ``fn`` can take vector-Jacobian products through the network (RTC's pseudo-inverse guidance,
            Q-gradient or monitor-gradient guidance); when False the step runs under ``no_grad``.
    """

    fn: GuidanceFn
    autograd: bool = False

    def __call__(self, x_t: Any, t: Any, out: Any, cond: Any, model: Any) -> Any:
        """Apply ``fn``."""
        return self.fn(x_t, t, out, cond, model)


def as_guidance(hook: Guidance | GuidanceFn | None) -> Guidance | None:
    """``None`` -> None; a :class:`Guidance` as is; a plain callable -> ``Guidance(fn, autograd=False)``.

    Raises:
        TypeError: ``hook`` is neither None, a Guidance nor callable.
    """
    if hook is None or isinstance(hook, Guidance):
        return hook
    if not callable(hook):
        raise TypeError(f"guidance: expected a Guidance or a callable, received {type(hook).__name__}")
    return Guidance(hook)


@dataclass
class SampleResult:
    """A sampled chunk with its denoising trajectory (``return_trajectory=True``).

    Attributes:
        actions: float32 numpy ``(B, H, A)`` in the ActionSpec's units.
        trajectory: torch float32 ``(K + 1, B, H, A)``: ``x_t`` before each of the ``K`` steps and the final
            chunk, in normalised units (detached).
        times: torch float32 ``(K + 1,)``: the time ``t`` of each trajectory entry (last = 1.0).
        outputs: torch float32 ``(K, B, H, A)``: the (guided) network prediction at each step.
        cond: the conditioning used (detached), for callers that re-run the network (Q-VGM).
    """

    actions: np.ndarray
    trajectory: Any
    times: Any
    outputs: Any
    cond: Any = None


@runtime_checkable
class DenoisingSampler(Protocol):
    """The sampler object of a generative chunk model (flow Euler or DDIM): one place for the denoising loop.

    - ``prediction``: a :class:`Prediction` value.
    - ``num_steps``: default denoising steps ``K``.
    - ``denoise(x_t, t, cond)``: the network output ``(B, H, A)`` at time ``t`` ``(B,)``.
    - ``clean_estimate(x_t, t, out)``: the one-step clean chunk ``a_hat`` ``(B, H, A)`` (flow:
      ``x_t + (1 - t) v``), differentiable.
    - ``sample(cond, noise, num_steps=None, guidance=None, return_trajectory=False)``: the final chunk
      ``(B, H, A)`` normalised, or ``(chunk, trajectory, times, outputs)`` with the trajectory.
    """

    prediction: str
    num_steps: int

    def denoise(self, x_t: Any, t: Any, cond: Any) -> Any: ...

    def clean_estimate(self, x_t: Any, t: Any, out: Any) -> Any: ...

    def sample(
        self,
        cond: Any,
        noise: Any,
        num_steps: int | None = None,
        guidance: Guidance | None = None,
        return_trajectory: bool = False,
    ) -> Any: ...


@runtime_checkable
class GuidedSampler(Protocol):
    """A policy whose chunks come from a :class:`DenoisingSampler` and that accepts guidance hooks.

    - ``sampler``: the :class:`DenoisingSampler`.
    - ``history``: the current observation windows ``{key: (B, n_obs_steps, ...)}``.
    - ``sample(obs, guidance=, num_steps=, noise=, return_trajectory=, env_ids=)``: float32 ``(B', H, A)`` in
      units, or a :class:`SampleResult` when ``return_trajectory``; ``obs=None`` samples the rows ``env_ids``
      (``None`` = all) of the current history with their own conditioning.
    - ``normalize_actions(actions)``: ``(..., A)`` units -> normalised torch tensor; ``unnormalize_actions``
      the inverse (-> float32 numpy).
    """

    @property
    def sampler(self) -> DenoisingSampler: ...

    @property
    def history(self) -> Mapping[str, np.ndarray]: ...

    def sample(
        self,
        obs: Mapping[str, Any] | None = None,
        *,
        guidance: Guidance | GuidanceFn | None = None,
        num_steps: int | None = None,
        noise: Any = None,
        return_trajectory: bool = False,
        env_ids: Sequence[int] | None = None,
    ) -> np.ndarray | SampleResult: ...

    def normalize_actions(self, actions: Any) -> Any: ...

    def unnormalize_actions(self, actions: Any) -> np.ndarray: ...


@runtime_checkable
class Embedder(Protocol):
    """A policy that exposes its observation latent (critic, value model and monitor input).

    - ``latent_dim``: ``D``.
    - ``embed(obs=None, env_ids=None)``: float32 ``(B, D)``; ``obs=None`` means the current history windows, and
      then the latent computed for the last chunk is reused when the windows have not changed since (no second
      encoder pass). ``env_ids`` selects rows.
    """

    @property
    def latent_dim(self) -> int: ...

    def embed(self, obs: Mapping[str, Any] | None = None, env_ids: Sequence[int] | None = None) -> np.ndarray: ...


@dataclass(frozen=True)
class ConditioningSpec:
    """The extra conditioning slot of a model.

    Attributes:
        num_labels: discrete labels ``0 .. num_labels - 1`` (advantage labels: 0 = negative, 1 = positive), each
            a learned embedding; 0 = no label slot.
        token_dim: width of continuous conditioning vectors (language embeddings), projected by the model;
            0 = no vector slot.
        null: a learned null embedding stands for "no conditioning" (classifier-free guidance, label dropout).
    """

    num_labels: int = 0
    token_dim: int = 0
    null: bool = True


@runtime_checkable
class Conditionable(Protocol):
    """A policy with a conditioning slot (:class:`ConditioningSpec`): advantage labels, language embeddings.

    - ``conditioning``: the :class:`ConditioningSpec`.
    - ``set_conditioning(labels=None, tokens=None, env_ids=None)``: per-row labels int ``(B,)`` (``-1`` = null)
      or vectors float32 ``(B, token_dim)``; ``None`` resets those rows to the null token. Kept until changed or
      the rows are reset.
    """

    @property
    def conditioning(self) -> ConditioningSpec: ...

    def set_conditioning(
        self, labels: Any = None, tokens: Any = None, env_ids: Sequence[int] | None = None
    ) -> None: ...


PREFIX_METHODS = ("guidance", "inpaint", "condition")
""":attr:`ChunkPrefix.method` values: RTC's guidance, replacement inpainting, or a clean prefix for a policy trained
with one (training-time action conditioning)."""


@dataclass
class ChunkPrefix:
    """Real-time chunking's committed prefix (Black, Galliker, Levine 2025, arXiv 2506.07339).

    Attributes:
        actions: float32 ``(B, H, A)`` committed actions in the new chunk's frame, ActionSpec units.
        weights: float32 ``(B, H)`` prefix weights in ``[0, 1]`` (``rtc_weights`` times validity).
        max_guidance: RTC's ``beta`` (> 0; used by ``method="guidance"``).
        method: ``"guidance"`` (RTC's vector-Jacobian guidance, paper eq. 2-4) or ``"inpaint"`` (replacement
            inpainting of the clean estimate: no gradient, the committed actions reproduced exactly where the
            weight is 1; :func:`policylink.policies.common.rtc.inpaint_guidance`) or ``"condition"`` (the
            committed actions given clean, as a policy trained with loss ``prefix_conditioned`` saw them;
            weights 0 or 1; :func:`policylink.policies.common.rtc.condition_noise`).
    """

    actions: np.ndarray
    weights: np.ndarray
    max_guidance: float = 5.0
    method: str = "guidance"

    def validate(self, batch_size: int, chunk_size: int, action_dim: int) -> ChunkPrefix:
        """Return self when shapes and values fit; raise ValueError naming the field otherwise."""
        a, w = np.asarray(self.actions), np.asarray(self.weights)
        want = (batch_size, chunk_size, action_dim)
        if a.shape != want:
            raise ValueError(f"prefix.actions: expected shape {want}, received {a.shape}")
        if w.shape != want[:2]:
            raise ValueError(f"prefix.weights: expected shape {want[:2]}, received {w.shape}")
        if not (np.isfinite(a).all() and np.isfinite(w).all()):
            raise ValueError("prefix: expected finite actions and weights, received NaN/inf")
        if not (w.min(initial=0.0) >= 0.0 and w.max(initial=0.0) <= 1.0):
            raise ValueError(f"prefix.weights: expected values in [0, 1], received [{w.min()}, {w.max()}]")
        if not self.max_guidance > 0:
            raise ValueError(f"prefix.max_guidance: expected > 0, received {self.max_guidance}")
        if self.method not in PREFIX_METHODS:
            raise ValueError(f"prefix.method: expected one of {list(PREFIX_METHODS)}, received {self.method!r}")
        return self


@runtime_checkable
class PrefixConditioned(Protocol):
    """A policy that can sample a chunk consistent with a committed prefix (real-time chunking).

    - ``predict_action_chunk_with_prefix(prefix, env_ids=None)``: float32 ``(B', H, A)`` for the rows ``env_ids``
      (``None`` = all), guided toward ``prefix.actions`` with ``prefix.weights`` (rows of the prefix follow
      ``env_ids``). In-process flow policies implement it through a :class:`Guidance` with autograd (RTC's
      vector-Jacobian product); a remote policy sends the prefix with ``infer``.
    """

    def predict_action_chunk_with_prefix(
        self, prefix: ChunkPrefix, env_ids: Sequence[int] | None = None
    ) -> np.ndarray: ...


CAPABILITIES = {
    "guided_sampler": GuidedSampler,
    "embedder": Embedder,
    "conditionable": Conditionable,
    "prefix": PrefixConditioned,
}
"""Capability name (as advertised in ``hello``) -> protocol."""


def capabilities_of(policy: Any) -> list[str]:
    """Sorted names of the capabilities ``policy`` implements (keys of :data:`CAPABILITIES`)."""
    return sorted(name for name, proto in CAPABILITIES.items() if isinstance(policy, proto))


__all__ = [
    "CAPABILITIES",
    "PREFIX_METHODS",
    "ChunkPrefix",
    "Conditionable",
    "ConditioningSpec",
    "DenoisingSampler",
    "Embedder",
    "Guidance",
    "GuidanceFn",
    "GuidedSampler",
    "Prediction",
    "PrefixConditioned",
    "SampleResult",
    "as_guidance",
    "capabilities_of",
]
