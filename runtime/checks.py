"""Checks every job's options share (train, fine-tune, evaluate, run, deploy), beyond the field checks of
:mod:`policylink.adapters.config_checks`: an output folder that never replaces an input, the CPU thread cap, and
why a policy cannot run on an environment with an executor. Each raises one error naming the field, the expected
and the received value."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from policylink.adapters.compatibility import compatibility_problems
from policylink.adapters.schema import EnvSpec
from policylink.runtime.executors import ExecutorConfig, executor_problems


def require_output_folder(out: str | Path, field: str = "out", **inputs: str | Path | None) -> None:
    """Refuse an output folder that would replace or rename what a command reads: an existing file, or a path
    that is, lies inside or contains one of ``inputs`` (option name -> path; empty ones are skipped). Call it
    before anything is written.

    Raises:
        ValueError: naming ``field``, the expected and the received path.
    """
    path = Path(out)
    if path.is_file():
        raise ValueError(f"{field}: expected a folder (or a new path), received an existing file {str(out)!r}")
    here = path.resolve()
    for name, given in inputs.items():
        other = Path(given).resolve() if given else None
        if other is not None and (here == other or here.is_relative_to(other) or other.is_relative_to(here)):
            raise ValueError(f"{field}: expected a folder other than {name} {str(given)!r} (neither inside it nor "
                             f"containing it), received {str(out)!r}")  # fmt: skip


def limit_threads(n: int = 1) -> None:
    """Cap torch's CPU threads at ``n`` (0 = leave torch's default) and Mesa's llvmpipe renderer at ``n``
    (``LP_NUM_THREADS``, before the first GL context; an explicit setting wins).

    Measured on the 2-core shared machine (load ~4): one diffusion inference (B=2) took 2.7 s with 2 torch
    threads and 0.07 s with 1 (threads spin while waiting for busy cores).
    """
    if n <= 0:
        return
    os.environ.setdefault("LP_NUM_THREADS", str(n))
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(n)


def cell_problems(
    label: str, policy_spec: Any, env_label: str, env_spec: EnvSpec, executor: ExecutorConfig
) -> list[str]:
    """Why policy ``label`` cannot run on env ``env_label`` with ``executor``: the contract's
    :func:`~policylink.adapters.compatibility.compatibility_problems` then the executor's, each as
    ``"<policy> x <env>: <problem>"`` (one format for ``policylink run`` and ``policylink eval``)."""
    problems = compatibility_problems(policy_spec, env_spec) + executor_problems(policy_spec, executor)
    return [f"{label} x {env_label}: {p}" for p in problems]


__all__ = ["cell_problems", "limit_threads", "require_output_folder"]
