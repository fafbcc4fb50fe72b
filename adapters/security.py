"""Who may talk to a server: loopback-only by default, otherwise ZeroMQ CURVE keys or an explicit ``insecure``.

CURVE (ZMTP 3 CurveZMQ, https://rfc.zeromq.org/spec/26/) authenticates and encrypts every connection.
Key folder layout written by :func:`generate_keys` (``policylink keys generate --out DIR``)::

    DIR/server.key, DIR/server.key_secret        server key pair (the public file goes to clients)
    DIR/<client>.key, DIR/<client>.key_secret    client key pairs
    DIR/authorized_clients/<client>.key          public keys the server accepts
"""

from __future__ import annotations

import logging
import shutil
from dataclasses import dataclass
from pathlib import Path

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator

LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1", "[::1]"})
SERVER_NAME = "server"
AUTHORIZED_DIR = "authorized_clients"

log = logging.getLogger(__name__)


class InsecureBindError(ValueError):
    """A server would listen beyond loopback without CURVE keys and without ``insecure=True``."""


class KeyFileError(FileNotFoundError):
    """A CURVE key file is missing or unreadable; the message names the path expected."""


@dataclass(frozen=True)
class ServerKeys:
    """A server's CURVE key pair (z85 bytes) and the folder of client public keys it accepts."""

    public: bytes
    secret: bytes
    authorized_dir: Path


@dataclass(frozen=True)
class ClientKeys:
    """A client's CURVE key pair and the server's public key (all z85 bytes)."""

    public: bytes
    secret: bytes
    server_public: bytes


def is_loopback(endpoint: str) -> bool:
    """True for ``tcp://127.0.0.1:*``, ``tcp://localhost:*``, ``tcp://[::1]:*``, ``ipc://`` and ``inproc://``."""
    scheme, _, rest = endpoint.partition("://")
    if scheme in ("ipc", "inproc"):
        return True
    host = rest.rsplit(":", 1)[0]
    return host in LOOPBACK_HOSTS


def check_bind(endpoint: str, keys: ServerKeys | None, insecure: bool) -> None:
    """Refuse to listen on a non-loopback ``endpoint`` without CURVE ``keys`` unless ``insecure``.

    Raises:
        InsecureBindError: naming the endpoint and both ways out (``--curve-keys DIR`` or ``--insecure``).
    """
    if keys is not None or is_loopback(endpoint):
        return
    if not insecure:
        raise InsecureBindError(
            f"bind: {endpoint!r} is reachable from other machines; expected 127.0.0.1 (default), CURVE keys "
            "(--curve-keys DIR, see 'policylink keys generate') or an explicit --insecure"
        )
    log.warning(
        "serving on %s WITHOUT authentication or encryption (--insecure): anyone who can reach this "
        "port can drive the policy",
        endpoint,
    )


def generate_keys(out_dir: str | Path, clients: tuple[str, ...] = ("client",)) -> Path:
    """Write a server key pair and one key pair per client name into ``out_dir``; authorize every client.

    Returns:
        ``out_dir`` as a Path. Existing key files of the same names are overwritten.
    """
    out = Path(out_dir)
    (out / AUTHORIZED_DIR).mkdir(parents=True, exist_ok=True)
    zmq.auth.create_certificates(out, SERVER_NAME)
    for name in clients:
        public_file, _ = zmq.auth.create_certificates(out, name)
        shutil.copy(public_file, out / AUTHORIZED_DIR / Path(public_file).name)
    return out


def load_server_keys(key_dir: str | Path) -> ServerKeys:
    """Read ``server.key_secret`` and locate ``authorized_clients/`` in ``key_dir``. Raises :class:`KeyFileError`."""
    d = Path(key_dir)
    public, secret = _load(d / f"{SERVER_NAME}.key_secret")
    if not (d / AUTHORIZED_DIR).is_dir():
        raise KeyFileError(
            f"curve keys: expected folder {d / AUTHORIZED_DIR} of client public keys; "
            "run 'policylink keys generate --out DIR'"
        )
    return ServerKeys(public, secret, d / AUTHORIZED_DIR)


def load_client_keys(key_dir: str | Path, client: str = "client") -> ClientKeys:
    """Read ``<client>.key_secret`` and ``server.key`` from ``key_dir``. Raises :class:`KeyFileError`."""
    d = Path(key_dir)
    public, secret = _load(d / f"{client}.key_secret")
    server_public, _ = _load(d / f"{SERVER_NAME}.key")
    return ClientKeys(public, secret, server_public)


def secure_server_socket(ctx: zmq.Context, sock: zmq.Socket, keys: ServerKeys) -> ThreadAuthenticator:
    """Make ``sock`` a CURVE server that accepts only the public keys in ``keys.authorized_dir``.

    Call before ``bind``. Returns the started authenticator; stop it when the socket closes.
    """
    auth = ThreadAuthenticator(ctx)
    auth.start()
    auth.configure_curve(domain="*", location=str(keys.authorized_dir))
    sock.curve_secretkey = keys.secret
    sock.curve_publickey = keys.public
    sock.curve_server = True
    return auth


def secure_client_socket(sock: zmq.Socket, keys: ClientKeys) -> None:
    """Make ``sock`` a CURVE client of the server whose public key is ``keys.server_public``. Call before connect."""
    sock.curve_secretkey = keys.secret
    sock.curve_publickey = keys.public
    sock.curve_serverkey = keys.server_public


def _load(path: Path) -> tuple[bytes, bytes | None]:
    if not path.is_file():
        raise KeyFileError(f"curve keys: expected key file {path}; run 'policylink keys generate --out DIR'")
    return zmq.auth.load_certificate(path)
