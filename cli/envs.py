"""``policylink envs install NAME [--force]`` / ``policylink envs list``: isolated benchmark environments.

A benchmark whose simulator pins clash with ours (MetaWorld pins ``mujoco==3.3.0``) gets a venv of its own under
``$POLICYLINK_ENVS_DIR`` (default ``~/.cache/policylink/envs``). Once installed, ``metaworld/<task>`` works wherever
an env is named (``record``, ``train``, ``eval``, ``run``, ``serve``, ``robot --sim``): its env server is started
in that venv and stopped at the end.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

USAGE = "usage: policylink envs install NAME [--force]\n       policylink envs list"


def main(argv: Sequence[str]) -> int:
    """Run ``policylink envs <action>``. Returns the exit code (2 for a bad command line, 1 for a failed install).

    Raises:
        UnknownNameError: ``NAME`` is no env family.
    """
    from policylink.adapters.registry import available_env_families, env_family

    args = list(argv)
    if not args or args[0] in ("-h", "--help"):
        print(f"{USAGE}\n\n{__doc__}")
        return 0
    action, rest = args[0], args[1:]
    if action == "list":
        return _list(available_env_families())
    if action != "install":
        print(f"policylink envs: unknown action {action!r}; expected 'install' or 'list'\n{USAGE}", file=sys.stderr)
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
    print(f"try: policylink run --env {family.name}/{family.tasks[0]} ...  (tasks: {', '.join(family.tasks)})")
    return 0


def _list(families: list[str]) -> int:
    from policylink.adapters.registry import env_family
    from policylink.sim.isolated.venvs import envs_dir, installed

    done = installed()
    print(f"env families (venvs under {envs_dir()}):")
    for name in families:
        entry = done.get(name)
        state = f"installed {entry['installed_at']}: {entry['python']}" if entry else "not installed"
        tasks = env_family(name).tasks
        print(f"  {name:<12} {state}\n  {'':<12} tasks: {', '.join(f'{name}/{t}' for t in tasks)}")
    return 0
