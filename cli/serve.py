"""``policylink serve``: parse, check the policy reference before torch is imported, then
:func:`policylink.serve.server.serve`."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from policylink.adapters import security
from policylink.cli.app import parse_config
from policylink.serve.server import ServeConfig, check_binds, serve


def main(argv: Sequence[str]) -> int:
    """Run ``policylink serve``; returns the exit code (2 for a bad configuration: a malformed ``--bind``, an
    unsafe bind, missing keys, a port already in use; the reason is printed as one line on stderr). A first
    argument that is not a flag is the checkpoint: ``policylink serve CHECKPOINT --protocol xpolicylab``."""
    argv = list(argv)
    if argv and not argv[0].startswith("-"):
        argv = ["--checkpoint", argv[0], *argv[1:]]
    cfg = parse_config(ServeConfig, normalise_flags(argv), prog="policylink serve")
    if (cfg.checkpoint is None) == (cfg.policy is None):
        print(
            "policylink serve: expected exactly one of --checkpoint DIR or --policy NAME, received "
            f"checkpoint={cfg.checkpoint!r}, policy={cfg.policy!r}",
            file=sys.stderr,
        )
        return 2
    try:
        check_binds(cfg)  # a bad address or missing keys first, before the policy reference
    except (security.EndpointError, security.InsecureBindError, security.KeyFileError) as e:
        print(f"policylink serve: {e}", file=sys.stderr)
        return 2
    _check_reference(cfg)
    return serve(cfg)


def normalise_flags(argv: Sequence[str]) -> list[str]:
    """``policylink serve``'s flags through the one rewriter, :func:`policylink.cli.app.normalise_flags`:
    ``--openpi-port 8000`` -> ``--openpi_port 8000``; a bare ``--stats`` / ``--insecure`` -> ``--stats=true``."""
    from policylink.cli.app import normalise_flags as normalise

    return normalise(ServeConfig, argv)


def _check_reference(cfg: ServeConfig) -> None:
    """Before torch is imported: ``--checkpoint`` must be a folder or a served policy to relay (``tcp://``,
    ``ipc://``, ``xpl://``; FileNotFoundError), ``--policy`` a registered name (UnknownNameError naming the field,
    the names and the closest one)."""
    from policylink.adapters.registry import check_policy_name
    from policylink.evaluate.refs import require_checkpoint_folder
    from policylink.policies.loading import REMOTE_SCHEMES

    if cfg.checkpoint is not None and not cfg.checkpoint.startswith(REMOTE_SCHEMES):
        require_checkpoint_folder(cfg.checkpoint, "checkpoint")
    if cfg.policy is not None:
        check_policy_name(cfg.policy, "policy")


if __name__ == "__main__":
    from policylink.cli.app import run_main

    raise SystemExit(run_main("serve", main, sys.argv[1:]))
