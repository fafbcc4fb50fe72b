"""``policylink keys generate --out DIR``: CURVE key pairs for a server and its clients (ZeroMQ CurveZMQ).

The folder holds ``server.key`` / ``server.key_secret``, ``<client>.key`` / ``<client>.key_secret`` per client,
and ``authorized_clients/`` with the client public keys the server accepts. Give the server the whole folder
(``policylink serve --curve-keys DIR``); give each client its own ``.key_secret`` plus ``server.key``.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass, field

from policylink.adapters.registry import unknown_name_message
from policylink.adapters.security import AUTHORIZED_DIR, generate_keys
from policylink.cli.app import parse_config

USAGE = "usage: policylink keys generate --out DIR [--clients client,robot2] [--force]"


@dataclass
class KeysConfig:
    """``policylink keys generate``: CURVE key pairs for a server and its clients (ZeroMQ CurveZMQ).

    Attributes:
        out: folder to write the keys into (created with mode 0700; secret files are written 0600).
        clients: one key pair per client name; all are authorized.
        force: overwrite existing key files of the same names (breaks clients deployed with the old keys);
            without it an existing key file is an error and nothing is written.
    """

    out: str = "keys"
    clients: list[str] = field(default_factory=lambda: ["client"])
    force: bool = False


def main(argv: Sequence[str]) -> int:
    """Run ``policylink keys <action>``; the only action is ``generate``. Returns the exit code.

    Raises:
        KeysExistError: key files exist in ``--out`` and ``--force`` was not given (nothing is written).
        ValueError: a bad client name.
    """
    args = list(argv)
    if not args or args[0] in ("-h", "--help"):
        print(f"{USAGE}\n\n{__doc__}")
        return 0
    if args[0] != "generate":
        print(f"policylink keys: {unknown_name_message('action', args[0], ['generate'])}\n{USAGE}", file=sys.stderr)
        return 2
    cfg = parse_config(KeysConfig, args[1:], prog="policylink keys generate")  # a bare --force means --force=true
    out = generate_keys(cfg.out, tuple(cfg.clients), force=cfg.force)
    print(
        f"wrote CURVE keys to {out}: server.key(+_secret), "
        + ", ".join(f"{c}.key(+_secret)" for c in cfg.clients)
        + f"; authorized clients in {out / AUTHORIZED_DIR}"
    )
    return 0
