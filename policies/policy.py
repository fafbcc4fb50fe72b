"""The chunk policy as a batched :class:`~policylink.adapters.policy.PolicyAdapter`: history windows ->
normalised tensors -> the model's sampler -> action chunk in the ActionSpec's units, with the typed capabilities
of :mod:`policylink.adapters.capabilities`: ``GuidedSampler``, ``Embedder``, ``Conditionable`` and, for velocity
(flow) samplers, ``PrefixConditioned`` (real-time chunking).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from policylink.adapters.capabilities import (
    ChunkPrefix,
    ConditioningSpec,
    DenoisingSampler,
    Guidance,
    GuidanceFn,
    Prediction,
    SampleResult,
    as_guidance,
)
from policylink.adapters.policy import HistoryPolicy
from policylink.adapters.schema import PolicySpec
from policylink.adapters.validation import batch_size_of
from policylink.data.normalize import Normalizer
from policylink.data.processors import Processors
from policylink.policies.checkpoint import save_checkpoint
from policylink.policies.common.conditioning import NULL_LABEL, classifier_free_guidance
from policylink.policies.common.frame_features import FrameFeatureCache, lean_latents
from policylink.policies.common.pointmap_encoder import bind_workspaces
from policylink.policies.config import check_cfg_scale, policy_type
from policylink.policies.model import ChunkModel, GenerativeChunkModel
from policylink.policies.processing import actions_to_normalized, actions_to_units, chain_of, observation_tensors
from policylink.policies.temporal import MemoryRows


class ModelPolicy(HistoryPolicy):
    """A trained chunk model and its processor chain behind the PolicyAdapter contract: what every model-backed
    policy shares (:class:`ChunkPolicy`, ACT's policy): the spec check, the device, ``config``, ``latent_dim``,
    ``save``.

    Args:
        model: the model (``cfg.n_obs_steps``, ``cfg.chunk_size``, ``action_dim``, ``latent_dim``); its weights are
            used as they are (pass the EMA model).
        processors: the processor chain the model was trained with (a checkpoint's ``processors.json``, or
            :func:`~policylink.policies.processing.processors_for` of its config): observations go through it, and
            chunks come back to units through its ``normalize`` step.
        spec: the PolicySpec (its horizons and action dimension must match the model's config).
        device: torch device for inference.
        seed: the policy's seed (:meth:`reseed`).
        validate: validate observations against the spec on every ``update_observation``.
        normalizer: deprecated alias of ``processors`` for one release (:func:`~policylink.policies.processing.
            chain_of`).

    Raises:
        ValueError: ``spec``, the model's config and the processors' frame stack disagree (names each mismatch:
            horizons, action dimension), or both ``processors`` and ``normalizer``. TypeError: no chain.
    """

    def __init__(
        self,
        model: Any,
        processors: Processors,
        spec: PolicySpec,
        *,
        device: torch.device | str = "cpu",
        seed: int = 0,
        validate: bool = True,
        normalizer: Normalizer | None = None,
    ):
        super().__init__(spec, validate=validate)
        cfg = model.cfg
        processors = chain_of(processors, normalizer, cfg, model.features, type(self).__name__)
        problems = [
            f"{name}: expected {want} (model config), received {got} (spec)"
            for name, want, got in (
                ("n_obs_steps", cfg.n_obs_steps, spec.n_obs_steps),
                ("frame_stack.n_obs_steps (processors)", cfg.n_obs_steps, processors.n_obs_steps),
                ("chunk_size", cfg.chunk_size, spec.chunk_size),
                ("action dimension", model.action_dim, spec.action.dim),
            )
            if want != got
        ]
        if problems:
            raise ValueError("policy spec does not match the model: " + "; ".join(problems))
        self.device = torch.device(device)
        if isinstance(model, torch.nn.Module):  # a PointNet's workspace box in the chain's units, as in training
            bind_workspaces(model, processors.normalizer)
        self.model = model.to(self.device).eval()
        self.processors = processors
        self.seed = int(seed)

    @property
    def config(self):
        """The model's config (:class:`~policylink.policies.config.PolicyConfig` or its subclass)."""
        return self.model.cfg

    @property
    def latent_dim(self) -> int:
        """``D`` of ``embed``."""
        return self.model.latent_dim

    def save(self, path: str | Path) -> Path:
        """Write an inference checkpoint folder (no training state). Returns the folder."""
        return save_checkpoint(path, model=self.model, spec=self.spec, processors=self.processors)


class ChunkPolicy(ModelPolicy):
    """A :class:`ChunkModel` (Diffusion Policy, flow matching, any registered type) behind the PolicyAdapter
    contract. Build one with :func:`policy_for_model` to get the capabilities its sampler supports.

    Args:
        model: a :class:`ChunkModel` (its weights are used as they are: pass the EMA model).
        processors, spec: as :class:`ModelPolicy`.
        **kwargs: ``device``, ``validate``, ``normalizer`` of :class:`ModelPolicy`, and ``seed``: of the sampler's
            noise generator (the same seed gives the same chunks).

    The observation latent of each row is cached from the last chunk (or ``embed``) until that row's window
    changes (``update_observation`` or ``reset``), so ``embed()`` after ``predict_action_chunk()`` and a replan
    without a new observation run no second encoder pass.

    Raises:
        ValueError: ``spec`` and the model's config disagree (horizons, action dimension).
    """

    def __init__(self, model: ChunkModel, processors: Processors, spec: PolicySpec, **kwargs: Any):
        super().__init__(model, processors, spec, **kwargs)
        self._generator = torch.Generator(device=self.device)
        self.reseed(self.seed)
        self._latents: torch.Tensor | None = None  # (B, D) cached observation latents
        self._latent_ok: np.ndarray | None = None  # (B,) bool: row's latent matches its window
        self._labels: np.ndarray | None = None  # (B,) int64, NULL_LABEL = null
        self._tokens: np.ndarray | None = None  # (B, token_dim) float32, NaN rows = null
        self._pending: dict[str, Any] | None = None  # set_conditioning before the first observation
        self._row_ids: np.ndarray | None = None  # rows of the running predict_action_chunk
        self._memory = MemoryRows()  # per-row SEGA state (policy.memory: sega; unused otherwise)
        self._frames = FrameFeatureCache(spec.n_obs_steps)  # per-row frame features (lean image path)
        self.frame_cache = True  # False: the full path (whole windows to float, normalise, encode every frame)
        self.cfg_scale = float(self.config.cfg_scale)  # inference option: never written back into the config

    # -- capabilities ---------------------------------------------------------------------------------------

    @property
    def sampler(self) -> DenoisingSampler:
        """The model's :class:`~policylink.adapters.capabilities.DenoisingSampler` (time convention, clean estimate)."""
        return self.model.sampler

    @property
    def conditioning(self) -> ConditioningSpec:
        """The model's conditioning slot (``policy.conditioning`` of its config; all zero = none)."""
        return self.model.conditioning

    def set_cfg_scale(self, w: float) -> None:
        """Use classifier-free guidance weight ``w`` from now on, instead of the checkpoint's ``policy.cfg_scale``
        (``out = (1 - w) out_u + w out_c``; Ho & Salimans 2022). An inference option of this adapter: the model's
        config (what :meth:`save` writes) keeps the trained value.

        Raises:
            ValueError: ``w`` not finite or negative, or ``w != 1`` for a policy without a label slot.
        """
        self.cfg_scale = check_cfg_scale(w, self.conditioning.num_labels)

    def reseed(self, seed: int) -> None:
        """Restart the sampler's noise stream from ``seed``."""
        self.seed = int(seed)
        self._generator.manual_seed(self.seed)

    def sample(
        self,
        obs: Mapping[str, Any] | None = None,
        *,
        guidance: Guidance | GuidanceFn | None = None,
        num_steps: int | None = None,
        noise: torch.Tensor | None = None,
        return_trajectory: bool = False,
        labels: Any = None,
        tokens: Any = None,
        env_ids: Sequence[int] | None = None,
    ) -> np.ndarray | SampleResult:
        """Sample action chunks for observation windows.

        Args:
            obs: key -> raw windows ``(B, n_obs_steps, *shape)`` (images uint8 HWC), as ``history`` holds them;
                None = the current windows of every row (cached latents, the conditioning set with
                :meth:`set_conditioning`).
            guidance: a :class:`~policylink.adapters.capabilities.Guidance` or a hook ``fn(x_t, t, out, cond,
                sampler) -> out'`` applied at every step in normalised action units (``out`` is a velocity for
                flow, the predicted noise or clean chunk for diffusion: ``sampler.prediction``).
            num_steps: sampler steps (default: the config's DDIM / Euler steps).
            noise: initial noise ``(B, chunk_size, A)``; default drawn from the policy's seeded generator.
            return_trajectory: return a :class:`SampleResult` with the denoising trajectory.
            labels, tokens: conditioning for explicit ``obs`` (int ``(B,)`` with ``-1`` = null; float ``(B,
                token_dim)``); default ``policy.default_label`` (null unless set). With ``obs=None`` they must be
                None (the rows' conditioning is the one given to :meth:`set_conditioning`).
            env_ids: with ``obs=None``, the rows to sample (``None`` = all), each with its cached latent and its
                conditioning; must be None with explicit ``obs``.

        Returns:
            float32 ``(B, chunk_size, A)`` in the ActionSpec's units, or a :class:`SampleResult`.

        Raises:
            KeyError: an observation feature is missing. ValueError: ``noise`` has the wrong shape, or
            ``labels``/``tokens`` with ``obs=None``, or ``env_ids`` with explicit ``obs``. RuntimeError:
            ``obs=None`` before any observation. IndexError: an id outside ``[0, B)``.
        """
        if obs is None:
            if labels is not None or tokens is not None:
                raise ValueError("sample: labels/tokens go with explicit obs; for the history use set_conditioning")
            ids = self._ids(env_ids)
            latent = self._row_latents(ids)
            labels, tokens = self._row_conditioning(ids)
        else:
            if env_ids is not None:
                raise ValueError("sample: env_ids selects rows of the history (obs=None); slice explicit obs instead")
            latent = self._encode(obs)
            labels, tokens = self._as_conditioning(labels, tokens, latent.shape[0])
        return self._generate(latent, labels, tokens, guidance, num_steps, noise, return_trajectory)

    def embed(self, obs: Mapping[str, Any] | None = None, env_ids: Sequence[int] | None = None) -> np.ndarray:
        """Observation latent float32 ``(B', D)`` (critic / monitor input).

        ``obs=None``: the current windows of rows ``env_ids`` (``None`` = all), reusing the latent computed for
        the last chunk of each row whose window has not changed since. Explicit ``obs`` (windows ``(B,
        n_obs_steps, ...)``) is encoded (then ``env_ids`` selects rows of it).

        Raises:
            RuntimeError: ``obs=None`` before any observation. IndexError: an id outside ``[0, B)``.
        """
        if obs is None:
            return self._row_latents(self._ids(env_ids)).cpu().numpy()
        if env_ids is not None:
            obs = {k: np.asarray(v)[np.asarray(list(env_ids), dtype=np.int64)] for k, v in obs.items()}
        return self._encode(obs).cpu().numpy()

    def set_conditioning(self, labels: Any = None, tokens: Any = None, env_ids: Sequence[int] | None = None) -> None:
        """Per-row conditioning kept until changed or the rows are reset: labels int ``(B',)`` (``-1`` = null)
        and/or vectors float32 ``(B', token_dim)``; ``None`` sets those rows to the null token. Before the first
        observation (``B`` unknown) only ``env_ids=None`` is accepted and applies to the first batch.

        Raises:
            ValueError: a slot the config does not have, a label out of range, a wrong shape.
            IndexError: an id outside ``[0, B)``.
        """
        spec = self.conditioning
        if labels is not None and not spec.num_labels or tokens is not None and not spec.token_dim:
            raise ValueError(f"set_conditioning: the policy's conditioning slot is {spec}; received "
                             f"labels={labels is not None}, tokens={tokens is not None}")  # fmt: skip
        raw = np.asarray(NULL_LABEL if labels is None else labels)
        if raw.dtype.kind not in "iu" and not (raw.dtype.kind == "f" and np.all(np.mod(raw, 1) == 0)):
            raise ValueError(f"conditioning.labels: expected integers in [-1, {spec.num_labels}) (-1 = null), "
                             f"received {raw.tolist()}")  # fmt: skip
        lab = raw.astype(np.int64)
        if labels is not None and ((lab < NULL_LABEL) | (lab >= spec.num_labels)).any():
            raise ValueError(f"conditioning.labels: expected values in [-1, {spec.num_labels}) (the labels the policy "
                             f"was trained with; -1 = null), received {lab.tolist()}")  # fmt: skip
        if self.batch_size is None:
            if env_ids is not None:
                raise ValueError("set_conditioning: env_ids before the first observation (batch size unknown)")
            self._pending = {"labels": labels, "tokens": tokens}
            return
        ids = self._ids(env_ids)
        self._ensure_row_state()
        self._labels[ids] = np.broadcast_to(lab, (len(ids),))
        if spec.token_dim:
            vec = np.nan if tokens is None else np.asarray(tokens, np.float32)
            self._tokens[ids] = np.broadcast_to(vec, (len(ids), spec.token_dim))

    def normalize_actions(self, actions: np.ndarray | torch.Tensor) -> torch.Tensor:
        """Actions ``(..., A)`` in units -> the normalised space the sampler (and ``guidance``) works in."""
        return actions_to_normalized(actions, self.processors, self.device)

    def unnormalize_actions(self, actions: torch.Tensor) -> np.ndarray:
        """Normalised actions ``(B, H, A)`` -> float32 numpy in the ActionSpec's units."""
        return actions_to_units(actions, self.processors)

    # -- PolicyAdapter ----------------------------------------------------------------------------------------

    def update_observation(self, obs_batch: Mapping[str, Any]) -> None:
        """Append one observation per episode (see HistoryPolicy); every row's cached latent becomes stale."""
        fresh = None if self._fresh is None else self._fresh.copy()
        super().update_observation(obs_batch)
        self._frames.append(np.ones(self.batch_size, dtype=bool) if fresh is None else fresh)
        self._ensure_row_state()
        self._latent_ok[:] = False

    def reset(self, env_ids: Sequence[int] | None = None) -> None:
        """Start new episodes; a full reset also forgets the cached latents and the conditioning."""
        super().reset(env_ids)
        if env_ids is None:
            self._latents = self._latent_ok = self._labels = self._tokens = None
            self._memory.reset()
            self._frames.reset()

    def predict_action_chunk(self, env_ids: Sequence[int] | None = None) -> np.ndarray:
        """float32 ``(B', chunk_size, A)`` for rows ``env_ids`` (``None`` = all); only those rows are encoded
        (those whose window changed since their last latent) and sampled."""
        self._row_ids = None if self.batch_size is None else self._ids(env_ids)
        try:
            return super().predict_action_chunk(env_ids)
        finally:
            self._row_ids = None

    def _predict(self, history: dict[str, np.ndarray], pad_mask: np.ndarray, tasks: list[str] | None) -> np.ndarray:
        # Padded slots repeat the episode's first observation, as the training windows do (no masking); the rows
        # are those predict_action_chunk selected (it is the only caller), their latents cached per row.
        labels, tokens = self._row_conditioning(self._row_ids)
        return self._generate(self._row_latents(self._row_ids), labels, tokens, None, None, None, False)

    def _on_reset(self, env_ids: np.ndarray) -> None:
        self._memory.reset(env_ids)  # SEGA: those rows restart from the initial state (gate 1)
        self._frames.reset(env_ids)
        if self._latent_ok is not None:
            self._latent_ok[env_ids] = False
            self._labels[env_ids] = self.config.default_label
            if self._tokens is not None:
                self._tokens[env_ids] = np.nan

    # -- internals --------------------------------------------------------------------------------------------

    def _generate(self, latent, labels, tokens, guidance, num_steps, noise, return_trajectory):
        """Condition ``latent`` ``(B, D)``, draw (or check) the noise, run the sampler, convert to units."""
        with torch.no_grad():
            cond = self.model.condition(latent, labels, tokens)
            if labels is not None and self.cfg_scale != 1.0:  # classifier-free guidance (policy.cfg_scale or set)
                uncond = self.model.condition(latent, None, tokens)
                guidance = classifier_free_guidance(uncond, self.cfg_scale, as_guidance(guidance))
        shape = (cond.shape[0], self.spec.chunk_size, self.spec.action.dim)
        if noise is None:
            noise = torch.randn(shape, generator=self._generator, device=self.device)
        elif tuple(noise.shape) != shape:
            raise ValueError(f"noise: expected shape {shape}, received {tuple(noise.shape)}")
        out = self.model.generate(cond, noise.to(self.device, torch.float32), num_steps, guidance, return_trajectory)
        if not return_trajectory:
            return actions_to_units(out, self.processors)
        chunk, trajectory, times, outputs = out
        return SampleResult(actions_to_units(chunk, self.processors), trajectory, times, outputs, cond)

    def _encode(self, obs: Mapping[str, Any], rows: np.ndarray | None = None) -> torch.Tensor:
        """Latents of windows ``obs``; ``rows`` (their row ids) also advance those rows' SEGA memory."""
        features = self.model.features
        batch_size_of(obs, list(features))
        sega = rows is not None and getattr(self.config, "memory", "none") == "sega"
        memory = (self._memory, rows, self.batch_size) if sega else None
        with torch.no_grad():
            if memory is None and self.frame_cache:  # images: raw uint8 -> one affine -> features, each frame once
                cache = self._frames if rows is not None else None
                lean = lean_latents(self.model.encoder, obs, features, self.processors, self.device, cache, rows)
                if lean is not None:
                    return lean
            return self.model.embed(observation_tensors(obs, features, self.processors, self.device), memory)

    def _row_latents(self, ids: np.ndarray) -> torch.Tensor:
        """Latents ``(len(ids), D)`` of the current windows, encoding only the rows without a fresh cache."""
        self._ensure_row_state()
        stale = ids[~self._latent_ok[ids]]
        if stale.size:
            stale = np.unique(stale)
            history, _, _ = self.rows(stale)
            latent = self._encode(history, stale)
            if self._latents is None:
                self._latents = latent.new_zeros(self.batch_size, latent.shape[1])
            self._latents[torch.as_tensor(stale, device=self.device)] = latent
            self._latent_ok[stale] = True
        return self._latents[torch.as_tensor(ids, device=self.device)]

    def _row_conditioning(self, ids: np.ndarray) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        if self._labels is None or not (self.conditioning.num_labels or self.conditioning.token_dim):
            return None, None
        labels = torch.as_tensor(self._labels[ids], device=self.device) if self.conditioning.num_labels else None
        tokens = torch.as_tensor(self._tokens[ids], device=self.device) if self._tokens is not None else None
        return labels, tokens

    def _as_conditioning(self, labels: Any, tokens: Any, batch: int) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        if labels is None and self.config.default_label != NULL_LABEL:
            labels = np.full(batch, self.config.default_label, np.int64)
        lab = None if labels is None else torch.as_tensor(np.asarray(labels, np.int64), device=self.device)
        tok = None if tokens is None else torch.as_tensor(np.asarray(tokens, np.float32), device=self.device)
        return lab, tok

    def _ensure_row_state(self) -> None:
        """Allocate the per-row caches for the current ``B`` (after the first observation)."""
        b = self.batch_size
        if b is None or (self._latent_ok is not None and len(self._latent_ok) == b):
            return
        self._latents, self._latent_ok = None, np.zeros(b, dtype=bool)
        self._labels = np.full(b, self.config.default_label, dtype=np.int64)
        d = self.conditioning.token_dim
        self._tokens = np.full((b, d), np.nan, dtype=np.float32) if d else None
        if self._pending is not None:
            pending, self._pending = self._pending, None
            self.set_conditioning(pending["labels"], pending["tokens"])

    def _ids(self, env_ids: Sequence[int] | None) -> np.ndarray:
        if self.batch_size is None:
            raise RuntimeError("no observation yet; call update_observation() first")
        if env_ids is None:
            return np.arange(self.batch_size)
        ids = np.asarray(list(env_ids), dtype=np.int64)
        if ids.size and (ids.min() < 0 or ids.max() >= self.batch_size):
            raise IndexError(f"env_ids: expected indices in [0, {self.batch_size}), received {ids.tolist()}")
        return ids


class PrefixChunkPolicy(ChunkPolicy):
    """A :class:`ChunkPolicy` whose sampler predicts a velocity (flow): it also implements
    :class:`~policylink.adapters.capabilities.PrefixConditioned` (real-time chunking through a guidance hook:
    :func:`~policylink.policies.common.rtc.rtc_guidance` or
    :func:`~policylink.policies.common.rtc.inpaint_guidance`)."""

    def predict_action_chunk_with_prefix(self, prefix: ChunkPrefix, env_ids: Sequence[int] | None = None) -> np.ndarray:
        """float32 ``(B', H, A)`` for rows ``env_ids`` (``None`` = all), made to agree with ``prefix.actions``
        (units, rows following ``env_ids``) with weights ``prefix.weights``: ``prefix.method="guidance"``: RTC's
        guidance with ``beta = prefix.max_guidance`` (Black et al. 2025, eq. 2-4, vector-Jacobian product through
        the clean estimate); ``"inpaint"``: replacement inpainting (no gradient; where a weight is 1 the chunk
        equals the committed action); ``"condition"``: the committed actions held clean through the sampling (for
        a policy trained with loss ``prefix_conditioned``; weights 0 or 1).

        Raises:
            RuntimeError: no observation yet. IndexError: a bad id. ValueError: the prefix does not fit.
            ActionError: non-finite output.
        """
        from policylink.policies.common.rtc import condition_guidance, condition_noise, inpaint_guidance, rtc_guidance

        ids = self._ids(env_ids)
        prefix.validate(len(ids), self.spec.chunk_size, self.spec.action.dim)
        target = self.normalize_actions(np.asarray(prefix.actions, np.float32))
        weights = torch.as_tensor(np.asarray(prefix.weights, np.float32), device=self.device)
        labels, tokens = self._row_conditioning(ids)
        noise = None
        if prefix.method == "condition":
            eps = torch.randn(target.shape, generator=self._generator, device=self.device)
            noise, guide = condition_noise(eps, target, weights), condition_guidance(weights)
        elif prefix.method == "inpaint":
            guide = inpaint_guidance(target, weights)
        else:
            guide = rtc_guidance(target, weights, prefix.max_guidance)
        chunk = self._generate(self._row_latents(ids), labels, tokens, guide, None, noise, False)
        return self.spec.action.validate(chunk, batch_dims=2)


def policy_for_model(
    model: ChunkModel,
    processors: Processors,
    spec: PolicySpec,
    *,
    device: torch.device | str = "cpu",
    seed: int = 0,
    validate: bool = True,
    normalizer: Normalizer | None = None,
) -> ChunkPolicy:
    """The PolicyAdapter for ``model``: the adapter its policy type registered (ACT, the VLA), else a
    :class:`PrefixChunkPolicy` when its sampler predicts a velocity (``sampler.prediction == "velocity"``), else a
    :class:`ChunkPolicy`. Arguments as :class:`ChunkPolicy`.

    Raises:
        TypeError: a model that is no :class:`GenerativeChunkModel` and whose type registered no adapter.
    """
    cls = policy_type(model.cfg.type).adapter_cls()
    if cls is None:
        if not isinstance(model, GenerativeChunkModel):
            raise TypeError(
                f"policy type {model.cfg.type!r}: a {type(model).__name__} has no denoising sampler, so it needs "
                "its own PolicyAdapter (register_policy_type(..., adapter=...))"
            )
        cls = PrefixChunkPolicy if model.sampler.prediction == Prediction.VELOCITY else ChunkPolicy
    processors = chain_of(processors, normalizer, model.cfg, model.features, "policy_for_model")
    return cls(model, processors, spec, device=device, seed=seed, validate=validate)


__all__ = ["ChunkPolicy", "PrefixChunkPolicy", "policy_for_model"]
