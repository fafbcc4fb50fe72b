"""Package layout and dependency arrows (ARCHITECTURE.md): adapters imports nothing of ours; sim and data only
adapters; policies adapters and data; runtime composes them; train, evaluate, serve and real build on runtime;
cli sits on top and nothing imports it."""

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# part -> parts of ours it may import
ALLOWED = {
    "adapters": set(),
    "configs": set(),
    "sim": {"adapters"},
    "data": {"adapters"},
    "policies": {"adapters", "data"},
    "runtime": {"adapters", "data", "policies", "sim"},
    "train": {"adapters", "data", "policies", "runtime"},
    "evaluate": {"adapters", "data", "policies", "runtime", "sim"},
    "serve": {"adapters", "policies"},
    "real": {"adapters", "data", "policies", "runtime"},
    "plugins": {"adapters", "data", "policies", "runtime", "real"},
    "cli": {
        "adapters",
        "configs",
        "data",
        "policies",
        "runtime",
        "sim",
        "real",
        "train",
        "evaluate",
        "serve",
        "plugins",
    },
}


def _imports_of(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    found = set()
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        for n in names:
            parts = n.split(".")
            if parts[0] == "policylink" and len(parts) > 1:
                found.add(parts[1])
    return found


def test_dependency_arrows():
    violations = []
    for part, allowed in ALLOWED.items():
        for path in (ROOT / part).rglob("*.py"):
            bad = _imports_of(path) - allowed - {part}
            if bad:
                violations.append(f"{path.relative_to(ROOT)} imports policylink.{sorted(bad)}")
    assert violations == []


def test_adapters_import_no_torch():
    code = (
        "import sys, policylink.adapters, policylink.adapters.schema, policylink.adapters.policy, "
        "policylink.adapters.env, policylink.adapters.registry, policylink.adapters.rotations, "
        "policylink.adapters.images; print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_no_bare_top_level_imports():
    offenders = []
    for part in ALLOWED:
        for path in (ROOT / part).rglob("*.py"):
            tree = ast.parse(path.read_text())
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    if node.module.split(".")[0] in ALLOWED:
                        offenders.append(f"{path.relative_to(ROOT)}: from {node.module}")
                elif isinstance(node, ast.Import):
                    offenders += [
                        f"{path.relative_to(ROOT)}: import {a.name}"
                        for a in node.names
                        if a.name.split(".")[0] in ALLOWED
                    ]
    assert offenders == []
