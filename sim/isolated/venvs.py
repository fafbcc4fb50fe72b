"""Where isolated families live: building a family's venv (``policylink envs install``) and the JSON record of
installed families (``policylink envs list``).

Everything is under :func:`envs_dir` (``$POLICYLINK_ENVS_DIR``, default ``~/.cache/policylink/envs``): one folder
per family holding its venv, and ``installed.json`` mapping each family to its interpreter, requirements and
install time. Installing runs ``python -m venv`` and pip from the package registries this machine reaches (no
other downloads): the family's requirements plus the env-server side, then policylink itself ``--no-deps`` (so the
server code in the venv is ours, without torch or our simulator pins).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # families imports this module (family_python)
    from policylink.sim.isolated.families import IsolatedFamily

SERVER_REQUIREMENTS: tuple[str, ...] = ("numpy", "pyzmq>=26", "msgpack>=1.0", "gymnasium>=1.0", "packaging")
"""What the env-server side needs in every family venv besides the benchmark (our required dependencies, plus
``packaging``, which gymnasium's MuJoCo envs import without declaring it)."""

ENVS_DIR_VAR = "POLICYLINK_ENVS_DIR"
RECORD_FILE = "installed.json"


class EnvNotInstalledError(RuntimeError):
    """A family's venv is not installed (the message names ``policylink envs install <family>``)."""


class InstallError(RuntimeError):
    """Building a family's venv failed; the message names the step and ends with the tail of its output."""


def envs_dir() -> Path:
    """The root of installed family venvs: ``$POLICYLINK_ENVS_DIR``, else ``$XDG_CACHE_HOME/policylink/envs``
    (``~/.cache/policylink/envs``)."""
    if os.environ.get(ENVS_DIR_VAR):
        return Path(os.environ[ENVS_DIR_VAR]).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(cache) / "policylink" / "envs"


def installed() -> dict[str, dict[str, Any]]:
    """Installed families: name -> ``{"python", "venv", "requirements", "installed_at", "policylink"}`` (from
    ``installed.json``; an entry whose interpreter is gone is dropped)."""
    path = envs_dir() / RECORD_FILE
    if not path.exists():
        return {}
    try:
        record = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e}); delete it and reinstall the families") from None
    return {k: v for k, v in record.items() if Path(v.get("python", "")).exists()}


def family_python(name: str) -> str:
    """The interpreter of installed family ``name``.

    Raises:
        EnvNotInstalledError: not installed (in :func:`envs_dir`).
    """
    entry = installed().get(name)
    if entry is None:
        raise EnvNotInstalledError(
            f"env family {name!r}: not installed in {envs_dir()}; run `policylink envs install {name}` "
            f"(or set ${ENVS_DIR_VAR} to where it is installed)"
        )
    return entry["python"]


def policylink_requirement() -> list[str]:
    """pip arguments installing this policylink into another venv: ``-e <folder>`` for an editable install,
    ``<folder>`` for one from a local folder, else ``policylink==<version>``."""
    try:
        dist = distribution("policylink")
    except PackageNotFoundError:
        return [str(Path(__file__).resolve().parents[2])]
    direct = dist.read_text("direct_url.json")
    if direct:
        info = json.loads(direct)
        url = info.get("url", "")
        if url.startswith("file://"):
            folder = url[len("file://") :]
            return ["-e", folder] if info.get("dir_info", {}).get("editable") else [folder]
    return [f"policylink=={dist.version}"]


def install_family(
    family: IsolatedFamily,
    *,
    force: bool = False,
    base_python: str = sys.executable,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Build ``family``'s venv and record it; returns its ``installed.json`` entry.

    Steps (each logged with its duration): create the venv; pip install the family's requirements and
    :data:`SERVER_REQUIREMENTS`; pip install policylink ``--no-deps`` (:func:`policylink_requirement`); import
    check (``family.check`` and the env server module, with torch absent from what it imports).

    Args:
        family: the family to install.
        force: rebuild even if it is installed.
        base_python: the interpreter the venv is made from.
        log: where progress lines go.

    Raises:
        InstallError: a step failed (no network or registry, a requirement pip cannot satisfy, a failing
            import); nothing is recorded.
    """
    root = envs_dir()
    venv = root / family.name / "venv"
    python = venv / "bin" / "python"
    if family.name in installed() and not force:
        log(f"{family.name}: already installed ({python}); pass --force to rebuild")
        return installed()[family.name]
    root.mkdir(parents=True, exist_ok=True)
    steps: list[tuple[str, list[str]]] = [
        ("create the venv", [base_python, "-m", "venv", "--clear", str(venv)]),
        (
            f"pip install {' '.join(family.requirements)} (+ env-server requirements)",
            [str(python), "-m", "pip", "install", "--progress-bar", "off", *family.requirements, *SERVER_REQUIREMENTS],
        ),
        (
            "pip install policylink --no-deps",
            [str(python), "-m", "pip", "install", "--progress-bar", "off", "--no-deps", *policylink_requirement()],
        ),
        ("import check", [str(python), "-c", _import_check(family)]),
    ]
    for i, (what, argv) in enumerate(steps, 1):
        log(f"[{i}/{len(steps)}] {family.name}: {what}")
        _run_step(what, argv, log)
    entry = {
        "python": str(python),
        "venv": str(venv),
        "requirements": list(family.requirements),
        "installed_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "policylink": " ".join(policylink_requirement()),
    }
    record_install(family.name, entry)
    log(f"{family.name}: installed in {venv}")
    return entry


def record_install(name: str, entry: dict[str, Any]) -> None:
    """Write ``entry`` for family ``name`` into ``installed.json`` (atomically: write then rename)."""
    path = envs_dir() / RECORD_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    record = json.loads(path.read_text()) if path.exists() else {}
    record[name] = entry
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    tmp.replace(path)


def _import_check(family: IsolatedFamily) -> str:
    module = family.factory.split(":")[0]
    return (
        f"import sys, importlib; {family.check}; importlib.import_module({module!r}); "
        "import policylink.sim.isolated.server; "
        "assert 'torch' not in sys.modules, 'the env server side imported torch'"
    )


def _run_step(what: str, argv: Sequence[str], log: Callable[[str], None], tail: int = 25) -> None:
    t0 = time.perf_counter()
    try:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    except OSError as e:
        raise InstallError(f"{what}: cannot run {argv[0]}: {e}") from None
    lines: list[str] = []
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line.rstrip())
        if line.startswith(("Collecting", "Successfully", "ERROR")):
            log(f"    {line.rstrip()}")
    rc = proc.wait()
    if rc != 0:
        text = "\n".join(lines[-tail:])
        hint = ""
        if any(s in text for s in ("No matching distribution", "Could not find a version", "NewConnectionError")):
            hint = " (is the package registry reachable? pip's index settings come from pip.conf / PIP_INDEX_URL)"
        raise InstallError(f"{what}: exit status {rc}{hint}\n--- output tail ---\n{text}")
    log(f"    done in {time.perf_counter() - t0:.0f} s")
