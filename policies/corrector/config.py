"""Configuration of corrective chunk execution (``executor.corrective`` of ``policylink eval`` / ``run``): the
monitor folder, the detection rule and the replanning guidance. numpy-free, so executor configs parse without
torch."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from policylink.policies.corrector.calibration import DetectorConfig


@dataclass(frozen=True)
class CorrectiveConfig:
    """Options of ``executor.kind: corrective``.

    Attributes:
        monitor: folder written by ``policylink finetune monitor`` (``monitor.json``, ``monitor.safetensors``,
            ``calibration.json``; by default ``<policy checkpoint>.monitor``); required by ``kind: corrective``.
        detector: the trigger rule (:class:`DetectorConfig`; conformal per-offset thresholds by default).
        guidance_scale: step size of guided replanning (0 = plain replanning, the ablation).
        committed_weight: weight of the committed-actions term of the guidance cost.
        monitor_only: score and log, never truncate (calibration runs, false-alarm measurement).

    Raises:
        ValueError: a negative or non-finite weight (named).
    """

    monitor: str | None = None
    detector: DetectorConfig = field(default_factory=DetectorConfig)
    guidance_scale: float = 0.5
    committed_weight: float = 1.0
    monitor_only: bool = False

    def __post_init__(self) -> None:
        for name in ("guidance_scale", "committed_weight"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v >= 0):
                raise ValueError(f"executor.corrective.{name}: expected a finite value >= 0, received {v!r}")


__all__ = ["CorrectiveConfig"]
