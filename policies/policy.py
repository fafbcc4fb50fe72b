"""The chunk policy as a batched :class:`~policylink.adapters.policy.PolicyAdapter`: history windows ->
normalised tensors -> sampler -> action chunk in the ActionSpec's units, plus the ``sample(guidance=...)`` and
``embed`` capabilities used by guided execution, critics and monitors.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from policylink.adapters.policy import HistoryPolicy
from policylink.adapters.schema import PolicySpec
from policylink.data.normalize import Normalizer
from policylink.policies.model import ChunkModel, Guidance
from policylink.policies.processing import actions_to_normalized, actions_to_units, batch_size_of, observation_tensors


class ChunkPolicy(HistoryPolicy):
    """Diffusion Policy or flow-matching policy behind the PolicyAdapter contract.

    Args:
        model: a :class:`ChunkModel` (its weights are used as they are: pass the EMA model).
        normalizer: the normaliser the model was trained with (observation keys and ``action``).
        spec: the PolicySpec (observation features, ActionSpec, ``n_obs_steps``, ``chunk_size``...).
        device: torch device for inference.
        seed: seed of the sampler's noise generator; the same seed gives the same chunks.
        validate: validate observations against the spec on every ``update_observation``.

    Raises:
        ValueError: ``spec`` and the model's config disagree (horizons, action dimension).
    """

    def __init__(
        self,
        model: ChunkModel,
        normalizer: Normalizer,
        spec: PolicySpec,
        *,
        device: torch.device | str = "cpu",
        seed: int = 0,
        validate: bool = True,
    ):
        super().__init__(spec, validate=validate)
        cfg = model.cfg
        problems = [
            f"{name}: expected {want} (model config), received {got} (spec)"
            for name, want, got in (
                ("n_obs_steps", cfg.n_obs_steps, spec.n_obs_steps),
                ("chunk_size", cfg.chunk_size, spec.chunk_size),
                ("action dimension", model.action_dim, spec.action.dim),
            )
            if want != got
        ]
        if problems:
            raise ValueError("policy spec does not match the model: " + "; ".join(problems))
        self.device = torch.device(device)
        self.model = model.to(self.device).eval()
        self.normalizer = normalizer
        self.seed = int(seed)
        self._generator = torch.Generator(device=self.device)
        self.reseed(seed)

    @property
    def config(self):
        """The model's :class:`~policylink.policies.config.PolicyConfig`."""
        return self.model.cfg

    def reseed(self, seed: int) -> None:
        """Restart the sampler's noise stream from ``seed``."""
        self.seed = int(seed)
        self._generator.manual_seed(self.seed)

    @torch.no_grad()
    def sample(
        self,
        obs: Mapping[str, Any],
        *,
        guidance: Guidance | None = None,
        num_steps: int | None = None,
        noise: torch.Tensor | None = None,
    ) -> np.ndarray:
        """Sample action chunks for observation windows.

        Args:
            obs: key -> raw windows ``(B, n_obs_steps, *shape)`` (images uint8 HWC), as ``history`` holds them.
            guidance: optional ``guidance(x_t, t, out) -> out'`` applied at every sampler step in normalised
                action units (see :data:`policylink.policies.model.Guidance`; ``out`` is a velocity for flow and
                the predicted noise for diffusion).
            num_steps: sampler steps (default: the config's DDIM / Euler steps).
            noise: initial noise ``(B, chunk_size, A)``; default drawn from the policy's seeded generator.

        Returns:
            float32 ``(B, chunk_size, A)`` in the ActionSpec's units.

        Raises:
            KeyError: an observation feature is missing. ValueError: ``noise`` has the wrong shape.
        """
        cond = self._embed(obs)
        shape = (cond.shape[0], self.spec.chunk_size, self.spec.action.dim)
        if noise is None:
            noise = torch.randn(shape, generator=self._generator, device=self.device)
        elif tuple(noise.shape) != shape:
            raise ValueError(f"noise: expected shape {shape}, received {tuple(noise.shape)}")
        chunk = self.model.generate(cond, noise.to(self.device, torch.float32), num_steps, guidance)
        return actions_to_units(chunk, self.normalizer)

    @torch.no_grad()
    def embed(self, obs: Mapping[str, Any]) -> np.ndarray:
        """Observation latent float32 ``(B, D)`` for windows ``(B, n_obs_steps, ...)`` (critic / monitor input)."""
        return self._embed(obs).cpu().numpy()

    def normalize_actions(self, actions: np.ndarray | torch.Tensor) -> torch.Tensor:
        """Actions ``(..., A)`` in units -> the normalised space the sampler (and ``guidance``) works in."""
        return actions_to_normalized(actions, self.normalizer, self.device)

    def unnormalize_actions(self, actions: torch.Tensor) -> np.ndarray:
        """Normalised actions ``(B, H, A)`` -> float32 numpy in the ActionSpec's units."""
        return actions_to_units(actions, self.normalizer)

    def save(self, path: str | Path) -> Path:
        """Write an inference checkpoint folder (no training state). Returns the folder."""
        from policylink.policies.checkpoint import save_checkpoint

        return save_checkpoint(path, model=self.model, normalizer=self.normalizer, spec=self.spec)

    def _predict(self, history: dict[str, np.ndarray], pad_mask: np.ndarray, tasks: list[str] | None) -> np.ndarray:
        # Padded slots repeat the episode's first observation, as the training windows do (no masking).
        return self.sample(history)

    def _embed(self, obs: Mapping[str, Any]) -> torch.Tensor:
        features = self.model.features
        batch_size_of(obs, list(features))
        return self.model.embed(observation_tensors(obs, features, self.normalizer, self.device))


def make_chunk_policy(
    kind: str,
    checkpoint: str | Path | None = None,
    *,
    spec: PolicySpec | None = None,
    normalizer: Normalizer | None = None,
    config: Any = None,
    device: str = "auto",
    seed: int = 0,
) -> ChunkPolicy:
    """Registry factory: load ``checkpoint``, or build an untrained policy of type ``kind``.

    Args:
        kind: ``"diffusion"`` or ``"flow"``.
        checkpoint: a checkpoint folder; when given, the other arguments except ``device``/``seed`` must be None.
        spec, normalizer: required without a checkpoint (the spec's horizons must match the config).
        config: a :class:`~policylink.policies.config.PolicyConfig` or a dict of its fields (default config).

    Raises:
        ValueError: a checkpoint of another type, or missing ``spec``/``normalizer`` without a checkpoint.
    """
    from policylink.policies.checkpoint import load_components, resolve_device
    from policylink.policies.config import PolicyConfig
    from policylink.policies.model import build_model

    if checkpoint is not None:
        cfg, ckpt_spec, model, norm = load_components(checkpoint)
        if cfg.type != kind:
            raise ValueError(f"checkpoint {str(checkpoint)!r}: expected policy type {kind!r}, received {cfg.type!r}")
        return ChunkPolicy(model, norm, ckpt_spec, device=resolve_device(device), seed=seed)
    if spec is None or normalizer is None:
        raise ValueError(
            f"{kind} policy: expected a checkpoint, or both spec and normalizer; received "
            f"spec={type(spec).__name__}, normalizer={type(normalizer).__name__}"
        )
    if config is None:
        cfg = PolicyConfig(type=kind)
    elif isinstance(config, PolicyConfig):
        cfg = config
    else:
        cfg = PolicyConfig.from_dict({**dict(config), "type": kind})
    if cfg.type != kind:
        raise ValueError(f"config.type: expected {kind!r}, received {cfg.type!r}")
    model = build_model(cfg, spec.observation_features, spec.action.dim)
    return ChunkPolicy(model, normalizer, spec, device=resolve_device(device), seed=seed)
