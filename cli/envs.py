"""``policylink envs install NAME [--force]`` / ``policylink envs list`` / ``policylink envs kwargs ENV``: isolated
benchmark environments, and the keyword arguments an environment takes (``--env_kwargs``).

A benchmark whose simulator pins clash with ours (MetaWorld pins ``mujoco==3.3.0``) gets a venv of its own under
``$POLICYLINK_ENVS_DIR`` (default ``~/.cache/policylink/envs``). Once installed, ``metaworld/<task>`` works wherever
an env is named (``record``, ``train``, ``eval``, ``run``, ``serve``, ``robot --sim``): its env server is started
in that venv and stopped at the end.

``policylink envs kwargs ENV`` prints the keyword arguments env ``ENV`` accepts (its config dataclass: each field's
type and default); ``--env_kwargs`` (and ``--gap``, ``--perturbation``) are checked against them before the env is
built: an unknown key names the closest accepted one.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

ACTIONS = ("install", "list", "kwargs")
USAGE = "usage: policylink envs install NAME [--force]\n       policylink envs list\n       policylink envs kwargs ENV"


def main(argv: Sequence[str]) -> int:
    """Run ``policylink envs <action>``. Returns the exit code (2 for a bad command line, 1 for a failed install).

    Raises:
        UnknownNameError: ``NAME`` is no env family, or ``ENV`` no environment.
    """
    from policylink.adapters.registry import available_env_families, env_family

    args = list(argv)
    if not args or args[0] in ("-h", "--help"):
        print(f"{USAGE}\n\n{__doc__}")
        return 0
    action, rest = args[0], args[1:]
    if action in ACTIONS and any(a in ("-h", "--help") for a in rest):  # policylink envs install --help
        print(f"{USAGE}\n\n{__doc__}")
        return 0
    if action == "list":
        return _list(available_env_families())
    if action == "kwargs":
        if len(rest) != 1 or rest[0].startswith("-"):
            print(f"policylink envs kwargs: expected one env name, received {rest}\n{USAGE}", file=sys.stderr)
            return 2
        return _kwargs(rest[0])
    if action != "install":
        from policylink.adapters.registry import unknown_name_message

        print(f"policylink envs: {unknown_name_message('action', action, ACTIONS)}\n{USAGE}", file=sys.stderr)
        return 2
    force = "--force" in rest
    names = [a for a in rest if a != "--force"]
    if len(names) != 1 or names[0].startswith("-"):
        print(f"policylink envs install: expected one family name, received {names}\n{USAGE}", file=sys.stderr)
        return 2
    from policylink.sim.isolated.venvs import InstallError, install_family

    family = env_family(names[0])
    try:
        install_family(family, force=force)
    except InstallError as e:
        print(f"policylink envs install {family.name}: failed at {e}", file=sys.stderr)
        return 1
    print(
        f"name it as --env {family.name}/<task> in record, train, eval, run (tasks: {', '.join(family.tasks)}); "
        f"its options: policylink envs kwargs {family.name}/{family.tasks[0]}"
    )
    return 0


def _kwargs(name: str) -> int:
    from policylink.adapters.env_config import describe_config
    from policylink.adapters.registry import check_env_name, env_config

    check_env_name(name)
    config = env_config(name)
    if config is None:
        print(f"{name}: declares no kwargs config (its factory's keyword arguments are passed unchecked)")
        return 0
    print(f"{name} kwargs ({config.__module__}.{config.__qualname__}):")
    for line in describe_config(config):
        print(f"  {line}")
    return 0


def _list(families: list[str]) -> int:
    from policylink.adapters.registry import available_envs, env_family
    from policylink.sim.isolated.venvs import envs_dir, installed

    plain = [n for n in available_envs() if "/" not in n]
    print(f"environments ('policylink envs kwargs ENV' lists what one takes): {', '.join(plain)}")
    done = installed()
    print(f"env families (venvs under {envs_dir()}):")
    for name in families:
        entry = done.get(name)
        state = f"installed {entry['installed_at']}: {entry['python']}" if entry else "not installed"
        tasks = env_family(name).tasks
        print(f"  {name:<12} {state}\n  {'':<12} tasks: {', '.join(f'{name}/{t}' for t in tasks)}")
    return 0
