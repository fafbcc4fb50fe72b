"""The ``policylink`` command: one entry point, one subcommand per job, typed configs from YAML + overrides.

Each subcommand lives in its own module as ``main(argv) -> int`` and is imported only when run, so
``policylink --help`` is instant. Subcommand configs are dataclasses parsed by :func:`parse_config`
(draccus, as LeRobot does): ``--config configs/train/x.yaml`` loads a YAML file, and dotted overrides
such as ``--policy.chunk_size 16`` or ``--envs push,reach`` win over it.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import os
import sys
import types
import typing
from collections.abc import Sequence
from typing import Any, TypeVar

from policylink.runtime.extras import report_missing_extra

T = TypeVar("T")

# name -> (module implementing main(argv), one-line help). Modules are imported lazily.
COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("policylink.runtime.demo", "the main job: record demos, train two policies, evaluate N x M, report"),
    "record": ("policylink.runtime.record", "record episodes (scripted expert or policy) into a zarr store"),
    "train": ("policylink.runtime.train", "train a policy from a dataset (imitation)"),
    "finetune": ("policylink.runtime.finetune", "offline improvement from rollouts: critic, Q-VGM, advantage"),
    "eval": ("policylink.runtime.evaluate", "evaluate N policies on M environments; tables, plots, videos"),
    "serve": ("policylink.runtime.serve", "serve a policy over ZeroMQ (and the openpi websocket protocol)"),
    "robot": ("policylink.runtime.robot", "[planned] serve a robot (or a simulator as a robot) over ZeroMQ"),
    "run": ("policylink.runtime.run", "run one policy on one environment and print the episode results"),
    "dataset": (
        "policylink.runtime.dataset",
        "dataset tools: info, stats, export-lerobot, import-lerobot, merge",
    ),
    "bench": ("policylink.runtime.bench", "run a benchmark from benchmarks/ and write its results"),
    "keys": ("policylink.runtime.keys", "CURVE key pairs for authenticated, encrypted serving"),
}


class ConfigError(ValueError):
    """A config file or override is invalid; the message names the field."""


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``policylink`` console script. Returns the process exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(
        prog="policylink",
        description="N policies x M environments with N+M adapters: record, train, evaluate and serve robot "
        "policies in simulation and on real robots.",
        epilog="Run 'policylink <command> --help' for a command's options.",
    )
    sub = parser.add_subparsers(dest="command", metavar="<command>")
    for name, (_, help_text) in COMMANDS.items():
        sub.add_parser(name, help=help_text, add_help=False)
    if not argv or argv[0] in ("-h", "--help"):
        parser.print_help()
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        parser.print_usage(sys.stderr)
        print(f"policylink: unknown command {name!r}; expected one of {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    module_name, _ = COMMANDS[name]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name != module_name:
            if report_missing_extra(name, e):  # e.g. `pip install policylink` alone, then `policylink train`
                return 2
            raise
        print(f"policylink {name}: planned; this release has no implementation of it", file=sys.stderr)
        return 2
    try:
        return int(module.main(rest) or 0)
    except KeyboardInterrupt:
        print(f"policylink {name}: interrupted", file=sys.stderr)
        return 130
    except Exception as e:
        if os.environ.get(DEBUG_ENV, "") in ("", "0") and report_missing_extra(name, e):
            return 2
        if not is_user_error(e) or os.environ.get(DEBUG_ENV, "") not in ("", "0"):
            raise
        print(f"policylink {name}: error: {type(e).__name__}: {e}", file=sys.stderr)
        print(f"  (set {DEBUG_ENV}=1 for the traceback)", file=sys.stderr)
        return 2


DEBUG_ENV = "POLICYLINK_DEBUG"


def is_user_error(e: BaseException) -> bool:
    """True for errors that describe bad input or a bad environment (printed as one line by the CLI).

    These are ``ValueError`` (including every spec/config error), ``LookupError`` (unknown names), ``OSError``
    (missing files, ports in use, timeouts), and any exception defined by policylink or pyzmq. Anything else
    is a bug and keeps its traceback.
    """
    if isinstance(e, (ValueError, LookupError, OSError)):
        return True
    module = type(e).__module__ or ""
    return module.startswith(("policylink.", "zmq"))


def parse_config(cls: type[T], argv: Sequence[str], prog: str | None = None) -> T:
    """Parse a dataclass config from ``argv``: optional ``--config FILE.yaml`` then field overrides.

    Overrides use the field path (``--policy.lr 1e-4`` or ``--policy.lr=1e-4``), spelled with underscores or
    dashes; every subcommand's flags go through :func:`normalise_flags` (dashes, bare booleans, comma lists).

    Raises:
        SystemExit: on ``--help`` (after printing help).
        ConfigError: on an invalid value or unknown field (the message names the field).
    """
    import draccus

    args = list(argv)
    config_path = None
    for flag in ("--config", "--config_path", "--config-path"):
        for i, a in enumerate(args):
            if a == flag and i + 1 < len(args):
                config_path = args[i + 1]
                del args[i : i + 2]
                break
            if a.startswith(flag + "="):
                config_path = a.split("=", 1)[1]
                del args[i]
                break
    args = normalise_flags(cls, args)
    if prog is not None:
        sys.argv[0] = prog
    try:
        return draccus.parse(cls, config_path=config_path, args=args)
    except draccus.utils.DraccusException as e:
        own = _own_validation_error(e)
        raise ConfigError(str(own) if own is not None else f"invalid {cls.__name__}: {e}") from e


def normalise_flags(cls: type, argv: Sequence[str]) -> list[str]:
    """The one flag rewriter of every subcommand, for the fields of dataclass ``cls``:

    - ``--obs-mode x`` -> ``--obs_mode x`` (dashed spellings of field names, dotted paths too);
    - a bare boolean flag (last, or followed by another flag) -> ``--flag=true``;
    - a comma list for a list field -> draccus' bracket form: ``--envs a,b`` -> ``--envs ["a", "b"]`` for
      lists of str (quoted, so ``{env}`` placeholders and ``label=ref`` stay plain strings), ``[1,2]`` otherwise.

    Values, ``--``, ``-h`` and bracketed lists are left as they are.
    """
    args = list(argv)
    out: list[str] = []
    list_type: Any = None
    for i, a in enumerate(args):
        if list_type is not None and not a.startswith(("--", "[")):
            a = _bracket(a, list_type)
        list_type = None
        if a.startswith("--") and len(a) > 2:
            key, eq, value = a[2:].partition("=")
            key = key.replace("-", "_")
            a = "--" + key + eq + value
            kind = _field_type(cls, key)
            if kind is bool and not eq and (i + 1 == len(args) or args[i + 1].startswith("--")):
                a += "=true"
            elif _list_item(kind) is not None:
                if eq and not value.startswith("["):
                    a = f"--{key}={_bracket(value, _list_item(kind))}"
                elif not eq:
                    list_type = _list_item(kind)
        out.append(a)
    return out


def _own_validation_error(e: BaseException) -> BaseException | None:
    """The config's own ``__post_init__`` ValueError that draccus wrapped as "Couldn't instantiate class", if any."""
    if "Couldn't instantiate class" not in str(e):
        return None
    cause = e.__cause__ or e.__context__
    while cause is not None:
        if isinstance(cause, ValueError) and not type(cause).__module__.startswith("draccus"):
            return cause
        cause = cause.__cause__ or cause.__context__
    return None


def _bracket(value: str, item: Any) -> str:
    """``a,b`` as draccus' list form: JSON strings for ``list[str]``, ``[a,b]`` for other item types."""
    items = [x for x in value.split(",") if x]
    return json.dumps(items) if item is str else f"[{','.join(items)}]"


def _field_type(cls: type, dotted: str) -> Any:
    """The type of field ``dotted`` (``a.b``) of dataclass ``cls``, ``Optional`` unwrapped; None if unknown."""
    current: Any = cls
    for part in dotted.split("."):
        if not dataclasses.is_dataclass(current):
            return None
        hints = typing.get_type_hints(current)
        if part not in hints:
            return None
        current = hints[part]
        args = [a for a in typing.get_args(current) if a is not type(None)]
        if typing.get_origin(current) in (typing.Union, types.UnionType) and args:
            current = args[0]
    return current


def _list_item(kind: Any) -> Any:
    """The item type of a list/tuple/Sequence field type (``Any`` when unparameterised), else None."""
    if typing.get_origin(kind) not in (list, tuple, Sequence):
        return None
    args = typing.get_args(kind)
    return args[0] if args else Any


if __name__ == "__main__":
    raise SystemExit(main())
