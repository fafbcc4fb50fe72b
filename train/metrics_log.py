"""Where the trainer's metrics go: ``metrics.csv`` (always), TensorBoard event files in ``tb/`` (when tensorboard
is installed; ``make`` installs it) and a Weights & Biases run (when ``wandb_project`` is set; wandb installed and
logged in)."""

from __future__ import annotations

import csv
from collections.abc import Mapping
from pathlib import Path
from typing import Any


class MetricsLogger:
    """Rank 0's metrics sink: one CSV row, TensorBoard scalars and a wandb log call per logged step.

    Args:
        out_dir: the run folder; ``metrics.csv`` and ``tb/`` go there.
        fields: the CSV columns (``step`` first); a row may leave any of them empty.
        enabled: False on other DDP ranks (every method is then a no-op).
        resume: append to an existing ``metrics.csv`` instead of starting it over.
        wandb_project: Weights & Biases project ("" = off); the run is named after ``out_dir`` and resumed with it.
        config: the run's configuration as a plain dict (recorded by wandb).

    Raises:
        ImportError: ``wandb_project`` is set and wandb is not installed.
    """

    def __init__(
        self,
        out_dir: Path,
        fields: tuple[str, ...],
        *,
        enabled: bool = True,
        resume: bool = False,
        wandb_project: str = "",
        config: Mapping[str, Any] | None = None,
    ):
        self.enabled = enabled
        self.file = self.writer = self.tb = self.wandb = None
        if not enabled:
            return
        out_dir.mkdir(parents=True, exist_ok=True)
        path = out_dir / "metrics.csv"
        fresh = not (resume and path.exists())
        self.file = path.open("w" if fresh else "a", newline="")
        self.writer = csv.DictWriter(self.file, fieldnames=list(fields))
        if fresh:
            self.writer.writeheader()
        try:
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(str(out_dir / "tb"))
        except ImportError:  # tensorboard is not installed: the CSV alone
            self.tb = None
        if wandb_project:
            import wandb  # validate_config names the field when wandb is missing

            run_id = "".join(c if c.isalnum() or c in "-_" else "-" for c in str(out_dir.resolve()))[-64:]
            self.wandb = wandb.init(
                project=wandb_project, name=out_dir.name, id=run_id, resume="allow", dir=str(out_dir), config=config
            )

    def log(self, step: int, row: Mapping[str, Any]) -> None:
        """Write ``row`` (metric name -> float) for optimizer step ``step``."""
        if not self.enabled:
            return
        self.writer.writerow({"step": step, **row})
        self.file.flush()
        if self.tb is not None:
            for k, v in row.items():
                self.tb.add_scalar(k, v, step)
        if self.wandb is not None:
            self.wandb.log(dict(row), step=step)

    def close(self) -> None:
        """Flush and close every sink."""
        if self.file is not None:
            self.file.close()
        if self.tb is not None:
            self.tb.close()
        if self.wandb is not None:
            self.wandb.finish()


__all__ = ["MetricsLogger"]
