"""``policylink bench``: list and run the speed/scale benchmarks kept in ``benchmarks/`` of a source checkout.

Each benchmark is a standalone script (``benchmarks/<name>.py``) that writes its results to
``benchmarks/results/<name>.md``; this command only finds and runs it, passing the remaining arguments.
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

from policylink.adapters.registry import unknown_name_message

BENCHMARKS_DIR = Path(__file__).resolve().parents[1] / "benchmarks"


def available_benchmarks(directory: Path | None = None) -> list[str]:
    """Names of the benchmark scripts in ``directory`` (default ``benchmarks/``; file stems, sorted)."""
    directory = BENCHMARKS_DIR if directory is None else directory
    return sorted(p.stem for p in directory.glob("*.py") if not p.name.startswith("_")) if directory.is_dir() else []


def main(argv: list[str]) -> int:
    """``policylink bench [--list] <name> [args...]``. Returns the exit code (2 for an unknown benchmark)."""
    names = available_benchmarks()
    if not argv or argv[0] in ("-h", "--help", "--list"):
        print("usage: policylink bench <name> [benchmark args...]   ('<name> --help' for its options)")
        print(f"benchmarks in {BENCHMARKS_DIR}:")
        for n in names:
            print(f"  {n}")
        if not names:
            print("  (none found: benchmarks ship with a source checkout, not with an installed wheel)")
        return 0
    name, rest = argv[0], argv[1:]
    if name not in names:
        print(f"policylink bench: {unknown_name_message('benchmark', name, names)}", file=sys.stderr)
        return 2
    old_argv = sys.argv
    sys.argv = [str(BENCHMARKS_DIR / f"{name}.py"), *rest]
    try:
        runpy.run_path(sys.argv[0], run_name="__main__")
    except SystemExit as e:
        return int(e.code or 0) if not isinstance(e.code, str) else 1
    finally:
        sys.argv = old_argv
    return 0
