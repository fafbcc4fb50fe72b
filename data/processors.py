"""A policy's processor chain: the named steps, with their parameters and statistics, that turn raw observation
windows into what its model reads. One object runs them for the training sampler
(:class:`~policylink.data.sampler.SequenceDataset`) and for inference
(:func:`policylink.policies.processing.observation_tensors`), so a policy sees the same numbers in both; it is
saved in every checkpoint (``processors.json``, the statistics in ``normalizer.safetensors``).

Steps, in order (LeRobot's processor pipelines name the same stages):

- ``frame_stack``: ``n_obs_steps`` observations per window, oldest first (edge-padded at an episode's start), and
  for recurrent memories ``chain_windows`` consecutive windows ``chain_stride`` steps apart (training only).
- ``layout``: images uint8 ``(..., H, W, 3)`` -> float32 ``(..., 3, H, W)`` in ``[0, 1]``; pointmaps ``(..., H, W,
  3)`` -> float32 ``(..., 3, H, W)`` in metres; vectors and actions float32 as they are.
- ``normalize``: the per-key affine of a :class:`~policylink.data.normalize.Normalizer` (its modes here, its
  statistics in the checkpoint's safetensors file).
- ``crop`` and ``tokenize``: run inside the model, on the device, because they draw random numbers in training
  (random crop) or hold a frozen network (the instruction encoder); the chain records their parameters
  (``runs_in: model``) so that a checkpoint says every transform its inputs go through.

The host steps (``layout``, ``normalize``) run in numpy, single-threaded, identically for a training batch and an
inference window.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from policylink.adapters.images import to_float_chw
from policylink.adapters.pointmaps import is_pointmap_key
from policylink.adapters.pointmaps import pointmap_to_chw as _pointmap_to_chw
from policylink.adapters.schema import ACTION_KEY, IMAGE_PREFIX
from policylink.data.normalize import Normalizer

PROCESSORS_FILE = "processors.json"
"""The chain's file in a checkpoint folder."""
FORMAT = "policylink.processors/1"
STEP_NAMES = ("frame_stack", "layout", "normalize", "crop", "tokenize")
MODEL_STEPS = ("crop", "tokenize")
"""Steps the model runs on the device (recorded with ``runs_in: model``)."""


class ProcessorError(ValueError):
    """A processor chain that is malformed, or that does not fit the policy it is loaded with (names the step)."""


class Processors:
    """The processor chain of one policy.

    Args:
        steps: the steps in order, each a JSON-ready dict ``{"step": name, ...params}`` (see the module docstring);
            a chain without ``normalize`` passes the laid-out arrays through unscaled.
        normalizer: the statistics of the ``normalize`` step (required when the chain has one).

    Raises:
        ProcessorError: an unknown or repeated step, a ``frame_stack`` with a count < 1, or a ``normalize`` step
            without a normaliser (or whose modes disagree with it).
    """

    def __init__(self, steps: Iterable[Mapping[str, Any]], normalizer: Normalizer | None = None):
        self.steps = [dict(s) for s in steps]
        names = [s.get("step") for s in self.steps]
        bad = [n for n in names if n not in STEP_NAMES]
        if bad or len(set(names)) != len(names):
            raise ProcessorError(f"processors: expected distinct steps of {STEP_NAMES}, received {names}")
        stack = self.step("frame_stack") or {}
        for name in ("n_obs_steps", "chain_windows", "chain_stride"):
            if not isinstance(stack.get(name, 1), int) or stack.get(name, 1) < 1:
                raise ProcessorError(f"processors.frame_stack.{name}: expected an int >= 1, received {stack[name]!r}")
        norm = self.step("normalize")
        if norm is not None:
            if normalizer is None:
                raise ProcessorError("processors.normalize: expected the normaliser's statistics, received None")
            wrong = {k: m for k, m in norm["modes"].items() if k not in normalizer.keys or normalizer.mode(k) != m}
            if wrong:
                have = {k: normalizer.mode(k).value for k in normalizer.keys}
                raise ProcessorError(f"processors.normalize.modes: {wrong} do not match the statistics' modes {have}")
        self.normalizer = normalizer if norm is not None else None
        layout = self.step("layout") or {}
        self._images = set(layout.get("images", ()))
        self._pointmaps = set(layout.get("pointmaps", ()))

    @classmethod
    def for_keys(
        cls,
        keys: Iterable[str],
        normalizer: Normalizer | None = None,
        *,
        n_obs_steps: int = 1,
        chain_windows: int = 1,
        chain_stride: int = 1,
        images: Iterable[str] | None = None,
        model_steps: Iterable[Mapping[str, Any]] = (),
    ) -> Processors:
        """The chain of observation ``keys`` (pointmaps by the ``observation.pointmaps.`` prefix, images those of
        ``images``, default: by the ``observation.images.`` prefix, the rest vectors; ``action`` is always laid
        out): frame stack, layout, then
        ``normalize`` with ``normalizer``'s modes of these keys and the action (when a normaliser is given), then
        ``model_steps`` (``crop``, ``tokenize``, recorded with ``runs_in: model``)."""
        keys = [k for k in keys if k != ACTION_KEY]
        pointmaps = [k for k in keys if is_pointmap_key(k)]
        images = [k for k in keys if k.startswith(IMAGE_PREFIX)] if images is None else list(images)
        images = [k for k in images if k not in pointmaps]
        steps: list[dict[str, Any]] = [
            {"step": "frame_stack", "n_obs_steps": int(n_obs_steps), "chain_windows": int(chain_windows),
             "chain_stride": int(chain_stride)},
            {"step": "layout", "images": images, "pointmaps": pointmaps,
             "vectors": [k for k in keys if k not in images and k not in pointmaps]},
        ]  # fmt: skip
        if normalizer is not None:
            modes = {k: normalizer.mode(k).value for k in [*keys, ACTION_KEY] if k in normalizer.keys}
            steps.append({"step": "normalize", "modes": modes})
        steps += [{**s, "runs_in": "model"} for s in model_steps]
        return cls(steps, normalizer)

    def step(self, name: str) -> dict[str, Any] | None:
        """The parameters of step ``name`` (a dict with ``"step": name``), or None when the chain lacks it."""
        return next((s for s in self.steps if s["step"] == name), None)

    @property
    def n_obs_steps(self) -> int:
        """Observations per window (``frame_stack``; 1 without one)."""
        return int((self.step("frame_stack") or {}).get("n_obs_steps", 1))

    def window_args(self, training: bool = True) -> dict[str, int]:
        """The window keyword arguments of :class:`~policylink.data.sampler.SequenceDataset`: ``n_obs_steps``
        and, for ``training``, the memory chain (``chain_windows``, ``chain_stride``)."""
        stack = self.step("frame_stack") or {}
        out = {"n_obs_steps": self.n_obs_steps}
        if training and stack.get("chain_windows", 1) > 1:
            out.update(chain_windows=int(stack["chain_windows"]), chain_stride=int(stack["chain_stride"]))
        return out

    def process(self, key: str, x: Any) -> np.ndarray:
        """Raw windows of one feature (any leading dims; ``action`` too) -> float32 model input: ``layout`` then
        ``normalize``. Keys the layout step does not list are laid out by their prefix.

        Raises:
            ImageScaleError: a float image outside ``[0, 1]``. MissingStatsError: ``normalize`` has no mode for
                ``key``.
        """
        if key in self._images or (key.startswith(IMAGE_PREFIX) and key not in self._pointmaps):
            x = to_float_chw(x, key)
        elif key in self._pointmaps or is_pointmap_key(key):
            x = _pointmap_to_chw(np.asarray(x), key)
        else:
            x = np.asarray(x).astype(np.float32, copy=False)
        if self.normalizer is not None:
            x = self.normalizer.normalize_feature(key, x)
        return x

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready ``{"format": ..., "steps": [...]}`` (statistics not included: they are the normaliser's)."""
        return {"format": FORMAT, "steps": [dict(s) for s in self.steps]}

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any], normalizer: Normalizer | None) -> Processors:
        """Inverse of :meth:`to_dict` with the ``normalize`` step's statistics.

        Raises:
            ProcessorError: another format, or a malformed chain.
        """
        if not isinstance(doc, Mapping) or doc.get("format") != FORMAT or not isinstance(doc.get("steps"), list):
            raise ProcessorError(f"processors: expected {{'format': {FORMAT!r}, 'steps': [...]}}, received {doc!r}")
        return cls(doc["steps"], normalizer)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Processors) and self.steps == other.steps

    def __repr__(self) -> str:
        return f"Processors({[s['step'] for s in self.steps]})"


__all__ = ["MODEL_STEPS", "PROCESSORS_FILE", "ProcessorError", "Processors", "STEP_NAMES"]
