"""The ``policylink`` command: one entry point, one subcommand per job, typed configs from YAML + overrides.

Each subcommand lives in its own module as ``main(argv) -> int`` and is imported only when run, so
``policylink --help`` is instant. Subcommand configs are dataclasses parsed by :func:`parse_config`
(draccus, as LeRobot does): ``--config configs/train/x.yaml`` loads a YAML file, and dotted overrides
such as ``--policy.chunk_size 16`` or ``--envs push,reach`` win over it.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib
import io
import os
import sys
import tempfile
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from policylink.adapters.registry import EnvKwargsError, UnknownNameError, closest_name, unknown_name_message
from policylink.cli.commands import COMMANDS
from policylink.cli.extras import report_missing_extra
from policylink.cli.flags import _field_type, default_type_flags, normalise_flags

T = TypeVar("T")


class ConfigError(ValueError):
    """A config file or override is invalid; the message names the field."""


SIGPIPE_EXIT = 128 + 13
"""Exit code when the reader of stdout went away (``policylink train --help | head``): a shell's code for SIGPIPE."""


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``policylink`` console script. Returns the process exit code: 0, 2 for bad input (one line
    on stderr), 130 after Ctrl-C, :data:`SIGPIPE_EXIT` (nothing printed) when stdout's reader has closed the pipe."""
    try:
        code = _main(argv)
        sys.stdout.flush()  # here, not at interpreter exit: a closed pipe then ends as quietly as during the run
        return code
    except BrokenPipeError:
        if not _stdout_reader_gone():
            raise
        _discard_stdout()
        return SIGPIPE_EXIT


def _main(argv: Sequence[str] | None) -> int:
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
        close = closest_name(name, COMMANDS)
        hint = f"; did you mean {close!r}?" if close else f"; expected one of {', '.join(COMMANDS)}"
        print(f"policylink: unknown command {name!r}{hint}", file=sys.stderr)
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
    return run_main(name, module.main, rest)


def run_main(name: str, main: Any, argv: Sequence[str]) -> int:
    """``main(argv)`` of command ``name`` with the CLI's error rules: a user error (bad value, missing file, ...)
    is one line on stderr and exit 2, Ctrl-C exit 130, a closed stdout pipe ends quietly; a bug keeps its
    traceback (so does everything with ``POLICYLINK_DEBUG=1``). ``python -m policylink.cli.<command>`` (torchrun)
    goes through here too."""
    try:
        return int(main(list(argv)) or 0)
    except KeyboardInterrupt:
        print(f"policylink {name}: interrupted", file=sys.stderr)
        return 130
    except Exception as e:
        if isinstance(e, BrokenPipeError) and _stdout_reader_gone():
            raise  # main() ends quietly
        if os.environ.get(DEBUG_ENV, "") in ("", "0") and report_missing_extra(name, e):
            return 2
        if not is_user_error(e) or os.environ.get(DEBUG_ENV, "") not in ("", "0"):
            raise
        if isinstance(e, (ConfigError, UnknownNameError, EnvKwargsError)):  # a usage mistake: the line says all
            print(f"policylink {name}: error: {e}", file=sys.stderr)
            return 2
        print(f"policylink {name}: error: {type(e).__name__}: {e}", file=sys.stderr)
        print(f"  (set {DEBUG_ENV}=1 for the traceback)", file=sys.stderr)
        return 2


def _stdout_reader_gone() -> bool:
    """True when stdout is a pipe or socket whose reading end is closed (``poll`` reports an error condition on it)."""
    import select

    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(mask & (select.POLLERR | select.POLLHUP) for _, mask in poller.poll(0))
    except (AttributeError, OSError, ValueError):  # no real file descriptor (a test's captured stdout)
        return False


def _discard_stdout() -> None:
    """Point stdout's file descriptor at /dev/null, so that the interpreter's final flush of what is still
    buffered does not print a second BrokenPipeError (the recipe of Python's ``signal`` documentation)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def split_subcommand(
    prog: str, table: Mapping[str, tuple[str | None, str]], argv: Sequence[str], usage: str = "[--option value ...]"
) -> tuple[str, list[str]] | int:
    """The one subcommand dispatcher of ``policylink dataset|finetune <subcommand> ...``.

    Args:
        prog: e.g. ``"policylink dataset"``.
        table: subcommand -> (module implementing ``main(argv)`` or None when ``prog`` handles it, one-line help).
        argv: the arguments after ``prog``.
        usage: what follows ``<subcommand>`` in the usage line.

    Returns:
        ``(name, rest)``; or 0 after printing the list for no argument / ``--help``; or 2 after one stderr line
        for an unknown subcommand (naming the closest one when one is close).
    """
    argv = list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        width = max(len(n) for n in table) + 4
        print(f"usage: {prog} <subcommand> {usage}\n\nsubcommands:")
        for name, (_, text) in table.items():
            print(f"  {name:<{width}}{text}")
        print(f"\nRun '{prog} <subcommand> --help' for its options.")
        return 0
    if argv[0] not in table:
        close = closest_name(argv[0], table)
        hint = f"; did you mean {close!r}?" if close else f"; expected one of {', '.join(table)}"
        print(f"{prog}: unknown subcommand {argv[0]!r}{hint}", file=sys.stderr)
        return 2
    return argv[0], argv[1:]


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
    """Parse a dataclass config from ``argv``: optional ``--config FILE.yaml`` (a file, or a shipped config's name:
    :func:`resolve_config_path`; its ``base`` files merged under it, :func:`policylink.configs.load_config`) then
    field overrides.

    Overrides use the field path (``--policy.lr 1e-4`` or ``--policy.lr=1e-4``), spelled with underscores or
    dashes; every subcommand's flags go through :func:`normalise_flags` (dashes, bare booleans, comma lists).

    Raises:
        SystemExit: on ``-h``/``--help``, after printing :func:`~policylink.cli.help.format_help`.
        ConfigError: an unknown flag (with the closest valid one), a config file that is missing or not valid
            YAML (file, line and column), an invalid value (the message names the field), or a ``device`` this
            machine does not have (:func:`check_device`).
    """
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
    if config_path is not None:
        config_path = resolve_config_path(config_path)
    with tempfile.TemporaryDirectory(prefix="policylink-config-") as tmp:
        cfg = _parse(cls, args, config_path, prog, tmp)
    check_device(cfg)
    return cfg


def check_device(cfg: Any) -> None:
    """Check the ``device`` field of config ``cfg`` (every command's torch device: ``run``, ``eval``, ``serve``,
    ``train``, ``demo``...) when the config is parsed, before any env, dataset or checkpoint is opened: ``"auto"``
    and ``"cpu"`` pass without importing torch; anything else goes through
    :func:`policylink.policies.checkpoint.resolve_device` (torch is imported, then needed by the run anyway).

    Raises:
        ConfigError: an unknown device string (``device: expected 'auto', 'cpu' or 'cuda[:N]', received 'gpu'``),
            CUDA on a machine without it, or ``cuda:N`` past the last device (``device: expected cuda:0 ..
            cuda:0, received 'cuda:7'``).
    """
    device = getattr(cfg, "device", None)
    if not isinstance(device, str) or device in ("auto", "cpu"):
        return
    from policylink.policies.checkpoint import resolve_device

    try:
        resolve_device(device)
    except ValueError as e:
        raise ConfigError(str(e)) from None


def _parse(cls: type[T], args: list[str], config_path: str | None, prog: str | None, tmp: str) -> T:
    """:func:`parse_config` after ``--config`` was taken out of ``args``; composed files are written into ``tmp``."""
    import draccus

    from policylink.configs import ConfigFileError, composed_file, load_config

    if any(a in ("-h", "--help") for a in args):
        from policylink.cli.help import format_help, help_instance

        try:
            config_path = config_path and str(composed_file(config_path, tmp))
        except ConfigFileError:
            pass  # the help shows the defaults; the run itself reports the file
        print(format_help(cls, prog or f"policylink {cls.__name__}", help_instance(cls, args, config_path)))
        raise SystemExit(0)
    doc = None
    if config_path is not None:
        check_yaml_file(config_path)
        try:
            doc = load_config(config_path)  # a mapping of options (bases merged), else one line naming the file
            check_config_keys(cls, doc, config_path)
            config_path = str(composed_file(config_path, tmp)) if doc else None  # an empty file sets nothing
        except ConfigFileError as e:
            raise ConfigError(f"--config {e}") from None
    args = default_type_flags(cls, normalise_flags(cls, args), doc)
    check_flags(cls, args)
    check_choice_types(cls, args, config_path)
    if prog is not None:
        sys.argv[0] = prog
    check_mapping_values(cls, args)
    errors = io.StringIO()
    try:
        with contextlib.redirect_stderr(errors):  # argparse's usage + error, turned into one line below
            parsed = draccus.parse(cls, config_path=config_path, args=args)
    except draccus.utils.DraccusException as e:
        own = _own_validation_error(e)
        raise ConfigError(str(own) if own is not None else f"invalid {cls.__name__}: {e}") from e
    except SystemExit as e:
        if e.code in (0, None):
            raise
        raise ConfigError(_argparse_error(errors.getvalue()) or f"invalid {cls.__name__} (exit {e.code})") from None
    sys.stderr.write(errors.getvalue())  # anything else draccus said (warnings)
    return parsed


def check_choice_types(cls: type, args: Sequence[str], config_path: str | None) -> None:
    """Raise :class:`ConfigError` when a choice field of dataclass ``cls`` (``policy``) is given a type name that is
    not registered, by ``--policy.type NAME`` in ``args`` or ``policy: {type: NAME}`` in the YAML file
    ``config_path``: one line naming the field, the value, the registered types and the closest one
    (``policy.type: expected one of ['act', 'diffusion', ...], received 'diffuson'; did you mean 'diffusion'?``)."""
    import draccus

    from policylink.cli.help import chosen_types

    for name, type_name in chosen_types(args, config_path).items():
        kind = _field_type(cls, name)
        if isinstance(kind, type) and issubclass(kind, draccus.ChoiceRegistry):
            choices = sorted(kind.get_known_choices())
            if type_name not in choices:
                raise ConfigError(unknown_name_message(f"{name}.type", type_name, choices))


def _argparse_error(stderr: str) -> str | None:
    """The message of argparse's last ``<prog>: error: <message>`` line in ``stderr`` (its usage dropped)."""
    lines = [line.split(": error: ", 1)[1] for line in stderr.splitlines() if ": error: " in line]
    return lines[-1] if lines else None


def check_mapping_values(cls: type, args: Sequence[str]) -> None:
    """Raise :class:`ConfigError` for the first value of a mapping option (``--env_kwargs``, ``--perturbation``)
    in ``args`` that is not valid YAML or not a mapping (``null`` too when the option is optional), naming the
    flag, the expected and the received value."""
    import yaml

    pairs = [a.split("=", 1) for a in args if a.startswith("--") and "=" in a]
    pairs += [[a, b] for a, b in zip(args, args[1:]) if a.startswith("--") and "=" not in a]
    for flag, value in pairs:
        kind = _field_type(cls, flag[2:])
        if kind is None or typing.get_origin(kind) not in (dict, Mapping) and kind not in (dict, Mapping):
            continue
        try:
            loaded = yaml.safe_load(value)
        except yaml.YAMLError as e:
            reason = getattr(e, "problem", None) or e
            raise ConfigError(
                f"{flag}: expected a YAML mapping such as '{{key: 0.5}}', received {value!r} ({reason})"
            ) from None
        if not isinstance(loaded, Mapping) and not (loaded is None and _optional(cls, flag[2:])):
            raise ConfigError(f"{flag}: expected a YAML mapping such as '{{key: 0.5}}', received {value!r}")
        glued = _glued_key(loaded)
        if glued is not None:
            key, val = glued.split(":", 1)
            raise ConfigError(
                f"{flag}: expected 'key: value' with a space after the colon (YAML), received {value!r} (read as "
                f"the key {glued!r} with no value; write '{key}: {val}')"
            )


def _glued_key(loaded: Any) -> str | None:
    """The first mapping key, at any depth of ``loaded``, that YAML read from ``key:value`` written without the
    space after the colon: a string key holding ``:`` whose value is None. None when there is none."""
    if isinstance(loaded, Mapping):
        for k, v in loaded.items():
            if isinstance(k, str) and ":" in k and v is None:
                return k
            found = _glued_key(v)
            if found is not None:
                return found
    elif isinstance(loaded, list):
        for item in loaded:
            found = _glued_key(item)
            if found is not None:
                return found
    return None


def _optional(cls: type, dotted: str) -> bool:
    """Whether the top-level field of ``dotted`` (``a`` of ``a.b``) admits None."""
    hint = typing.get_type_hints(cls).get(dotted.split(".")[0]) if dataclasses.is_dataclass(cls) else None
    return type(None) in typing.get_args(hint)


def resolve_config_path(path: str) -> str:
    """``path`` when it exists; else the shipped config it names (:func:`policylink.configs.shipped_config`:
    ``configs/train/x.yaml``, ``train/x.yaml`` or ``x``), so the README's ``--config configs/train/...`` works in any
    working directory and from an installed wheel; else ``path`` unchanged (:func:`check_yaml_file` reports it)."""
    from policylink.configs import shipped_config

    if Path(path).expanduser().exists():
        return path
    found = shipped_config(path)
    return str(found) if found is not None else path


def check_yaml_file(path: str) -> None:
    """Raise :class:`ConfigError` naming ``path`` (and the line and column, 1-based) when it cannot be read or is
    not valid YAML (a missing file names the closest shipped config, when one is close); do nothing otherwise."""
    import yaml

    try:
        text = Path(path).read_text()
    except OSError as e:
        from policylink.configs import shipped_config_names

        names = {Path(n).stem: n for n in shipped_config_names()}
        close = closest_name(Path(path).stem, names) if isinstance(e, FileNotFoundError) else None
        hint = f"; did you mean {names[close]!r}?" if close is not None else ""
        raise ConfigError(f"--config {path}: cannot read it ({e.strerror or e}){hint}") from None
    try:
        yaml.safe_load(text)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else path
        raise ConfigError(f"{where}: invalid YAML: {e.problem or e.context}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: invalid YAML: {e}") from None


def check_flags(cls: type, argv: Sequence[str]) -> None:
    """Raise :class:`ConfigError` for the first ``--flag`` in ``argv`` (as :func:`normalise_flags` writes them)
    that is no option of dataclass ``cls``, naming the closest valid flag when one is close (``difflib``)."""
    valid = set(flag_paths(cls))
    for a in argv:
        if not a.startswith("--") or len(a) == 2:
            continue
        key = a[2:].partition("=")[0]
        if key in valid:
            continue
        close = closest_name(key, sorted(valid))
        hint = f"; did you mean --{close}?" if close else f"; see --help for the {len(valid)} options"
        raise ConfigError(f"unknown flag --{key}{hint}")


def check_config_keys(cls: type, doc: Mapping[str, Any], path: str) -> None:
    """Raise :class:`ConfigError` for the first key of config file ``path`` (its composed mapping ``doc``) that is no
    option of dataclass ``cls``, naming the file, the key and the closest option (as an unknown flag is named)."""
    valid = set(flag_paths(cls))

    def walk(mapping: Mapping[str, Any], prefix: str) -> None:
        for key, value in mapping.items():
            dotted = f"{prefix}{key}"
            if dotted not in valid:
                close = closest_name(dotted, sorted(valid))
                hint = f"; did you mean {close!r}?" if close else f"; see --help for the {len(valid)} options"
                raise ConfigError(f"{path}: unknown option {dotted!r}{hint}")
            if isinstance(value, Mapping) and any(v.startswith(dotted + ".") for v in valid):
                walk(value, dotted + ".")

    walk(doc, "")


def flag_paths(cls: type) -> list[str]:
    """Every dotted option path of dataclass ``cls``: leaves and nested sections (``policy``, ``policy.type`` and
    the fields of every registered policy type for a choice field such as :class:`PolicyConfig`)."""
    from policylink.cli.help import iter_options

    paths = []
    for path, _, _, _ in iter_options(cls, "", None, all_choices=True):
        paths.append(path)
        parts = path.split(".")
        paths += [".".join(parts[:i]) for i in range(1, len(parts))]
    return list(dict.fromkeys(paths))


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


if __name__ == "__main__":  # run the imported module's main, so its exception classes are the ones raised
    from policylink.cli.app import main as _main

    raise SystemExit(_main())
