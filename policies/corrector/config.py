"""Configuration of corrective chunk execution (``executor.corrective`` of ``policylink eval`` / ``run``): the
monitor folder, the detection rule and the replanning guidance. numpy-free, so executor configs parse without
torch."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from policylink.policies.corrector.calibration import DetectorConfig

GUIDANCE_TARGETS = ("observed", "predicted")


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
        guidance_target: the latent change the replanned chunk is guided toward: ``"observed"`` (``z_t -
            z_{t-k}``) or ``"predicted"`` (the monitor's expected change for the executed actions, the target of
            VLA-Corrector's public code, ``GuidanceInjector.set_target(z, delta_z_pred)``).
        short_horizon: event-triggered horizon: after a trigger the row executes only this many actions per chunk
            (replanning in between) until ``short_dwell`` steps pass without an alarm; ``None`` = the replanned
            chunk runs ``n_action_steps`` like any other (the paper's rule).
        short_dwell: steps the short horizon lasts after the trigger; every alarm step (smoothed score above its
            threshold) inside it restarts the count.
        short_start: steps at the start of every episode that run at ``short_horizon`` as if a trigger had fired
            at reset (0 = none). The monitor cannot score before ``k`` steps of the episode exist, and on
            contact-rich tasks the first chunk decides most failures before any alarm can come
            (benchmarks/results/corrector.md, round 3); alarms inside this phase extend it like any short phase.

    Raises:
        ValueError: a negative or non-finite weight, an unknown target, or a horizon / dwell out of range (named).
    """

    monitor: str | None = None
    detector: DetectorConfig = field(default_factory=DetectorConfig)
    guidance_scale: float = 0.5
    committed_weight: float = 1.0
    monitor_only: bool = False
    guidance_target: str = "observed"
    short_horizon: int | None = None
    short_dwell: int = 8
    short_start: int = 0

    def __post_init__(self) -> None:
        for name in ("guidance_scale", "committed_weight"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v >= 0):
                raise ValueError(f"executor.corrective.{name}: expected a finite value >= 0, received {v!r}")
        if self.guidance_target not in GUIDANCE_TARGETS:
            raise ValueError(f"executor.corrective.guidance_target: expected one of {list(GUIDANCE_TARGETS)}, "
                             f"received {self.guidance_target!r}")  # fmt: skip
        if self.short_horizon is not None and int(self.short_horizon) < 1:
            raise ValueError(f"executor.corrective.short_horizon: expected None or >= 1, "
                             f"received {self.short_horizon!r}")  # fmt: skip
        if int(self.short_dwell) < 0:
            raise ValueError(f"executor.corrective.short_dwell: expected >= 0, received {self.short_dwell!r}")
        if int(self.short_start) < 0 or (self.short_start and self.short_horizon is None):
            raise ValueError(f"executor.corrective.short_start: expected 0, or >= 1 with a short_horizon, received "
                             f"short_start={self.short_start!r} short_horizon={self.short_horizon!r}")  # fmt: skip


__all__ = ["CorrectiveConfig"]
