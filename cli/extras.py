"""Which optional extra of the ``policylink`` distribution each command needs, and the one-line hint when it is missing.

``pip install policylink`` installs only the contract and the wire (numpy, pyzmq, msgpack, gymnasium); the
commands' stacks are extras (``pyproject.toml``: ``cli``, ``data``, ``sim``, ``train``, ``real``, ``openpi``,
``ray``, ``genesis``, ``all``). The extras' contents are read from the installed distribution's metadata, so
pyproject.toml stays the one list of them; this module adds only which extras each command needs and the few
import names that differ from their distribution's name.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re
import sys
from functools import cache

DISTRIBUTION = "policylink"

# command -> the extras it needs (all of them; extras may include others, e.g. train includes data and cli)
COMMAND_EXTRAS: dict[str, tuple[str, ...]] = {
    "demo": ("sim", "train"),
    "record": ("sim", "data"),
    "train": ("train",),
    "finetune": ("train",),
    "eval": ("sim", "train"),
    "serve": ("train", "openpi", "xpolicylab"),
    "robot": ("sim",),
    "run": ("sim", "train"),
    "dataset": ("data",),
    "bench": ("all",),
    "keys": ("cli",),
    "envs": ("cli",),  # the venvs it builds get their benchmark's own pins from pip
}

# import name -> distribution name, where they differ
_DISTRIBUTION_OF_MODULE: dict[str, str] = {
    "cv2": "opencv-python-headless",
    "yaml": "pyyaml",
    "genesis": "genesis-world",
    "zmq": "pyzmq",
    "PIL": "pillow",
}

# distributions no extra can pin (their own pins conflict with ours) -> how to install them
_INSTALL_OUTSIDE_EXTRAS: dict[str, str] = {
    "lerobot": "make lerobot (lerobot==0.4.4 with --no-deps: it caps torch lower than ours)",
}

_EXTRA_MARKER = re.compile(r"""extra\s*==\s*["']([^"']+)["']""")


def missing_module(error: BaseException) -> str | None:
    """The top-level name of a third-party module that ``error`` shows is not installed, else None.

    None for anything but a ``ModuleNotFoundError``, and for a missing submodule of an installed package
    (a bug or a broken install, not a missing extra).
    """
    if not isinstance(error, ModuleNotFoundError) or not error.name:
        return None
    top = error.name.split(".")[0]
    if top == DISTRIBUTION or importlib.util.find_spec(top) is not None:
        return None
    return top


def install_hint(command: str, module: str) -> str:
    """One line telling how to install what ``policylink <command>`` lacks, e.g. for ``("train", "torch")``:

    ``policylink train: needs the 'train' extra (module 'torch' is not installed): pip install 'policylink[train]'``

    The extras named are the command's own (:data:`COMMAND_EXTRAS`) when they provide ``module``; otherwise
    the smallest extra that lists its distribution; otherwise (no extra has it) a plain ``pip install``.
    """
    dist = _canonical(_DISTRIBUTION_OF_MODULE.get(module, module))
    graph = extras_graph()
    own = COMMAND_EXTRAS.get(command, ())
    if not (own and any(dist in closure(graph, e) for e in own)):
        providers = [e for e in graph if dist in closure(graph, e)]
        own = (min(providers, key=lambda e: len(closure(graph, e))),) if providers else ()
    if not own:
        how = _INSTALL_OUTSIDE_EXTRAS.get(dist, f"pip install {dist}")
        return f"policylink {command}: needs the Python package {dist!r} (not installed): {how}"
    which = f"the {own[0]!r} extra" if len(own) == 1 else "the extras " + ", ".join(repr(e) for e in own)
    return (
        f"policylink {command}: needs {which} (module {module!r} is not installed): "
        f"pip install '{DISTRIBUTION}[{','.join(own)}]'"
    )


def report_missing_extra(command: str, error: BaseException) -> bool:
    """Print :func:`install_hint` to stderr and return True when ``error`` is a missing third-party module."""
    module = missing_module(error)
    if module is None:
        return False
    print(install_hint(command, module), file=sys.stderr)
    return True


@cache
def extras_graph() -> dict[str, tuple[frozenset[str], frozenset[str]]]:
    """``extra -> (distributions it lists, extras of policylink it includes)`` from the installed metadata.

    Distribution names are canonical (PEP 503: lower case, runs of ``-_.`` as ``-``). Empty when policylink
    is not installed (then :func:`install_hint` falls back to a plain ``pip install``).
    """
    try:
        requires = importlib.metadata.requires(DISTRIBUTION) or []
    except importlib.metadata.PackageNotFoundError:
        return {}
    dists: dict[str, set[str]] = {}
    includes: dict[str, set[str]] = {}
    for req in requires:
        spec, _, marker = req.partition(";")
        extra = _EXTRA_MARKER.search(marker)
        if extra is None:
            continue
        name = _canonical(re.match(r"\s*([A-Za-z0-9._-]+)", spec).group(1))
        dists.setdefault(extra.group(1), set())
        includes.setdefault(extra.group(1), set())
        if name == DISTRIBUTION:
            bracket = re.search(r"\[([^\]]*)\]", spec)
            includes[extra.group(1)] |= {e.strip() for e in bracket.group(1).split(",")} if bracket else set()
        else:
            dists[extra.group(1)].add(name)
    return {e: (frozenset(dists[e]), frozenset(includes[e])) for e in dists}


def closure(graph: dict[str, tuple[frozenset[str], frozenset[str]]], extra: str) -> frozenset[str]:
    """Every distribution that ``pip install 'policylink[<extra>]'`` asks for (included extras followed)."""
    seen, todo, out = set(), [extra], set()
    while todo:
        e = todo.pop()
        if e in seen or e not in graph:
            continue
        seen.add(e)
        out |= graph[e][0]
        todo += graph[e][1]
    return frozenset(out)


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()
