"""Who may talk to a server: loopback-only by default, otherwise ZeroMQ CURVE keys or an explicit ``insecure``.

CURVE (ZMTP 3 CurveZMQ, https://rfc.zeromq.org/spec/26/) authenticates and encrypts every connection.
Key folder layout written by :func:`generate_keys` (``policylink keys generate --out DIR``)::

    DIR/server.key, DIR/server.key_secret        server key pair (the public file goes to clients)
    DIR/<client>.key, DIR/<client>.key_secret    client key pairs
    DIR/authorized_clients/<client>.key          public keys the server accepts
"""

from __future__ import annotations

import logging
import os
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


class EndpointError(ValueError):
    """A ZeroMQ endpoint is malformed (no scheme, unknown scheme, no host, port outside 1..65535)."""


class KeysExistError(FileExistsError):
    """:func:`generate_keys` would overwrite existing key files (which breaks every deployed client)."""


ENDPOINT_SCHEMES = ("tcp", "ipc", "inproc")


def check_endpoint(endpoint: str, role: str = "bind") -> str:
    """Check that ``endpoint`` is a ZeroMQ address this package can use; return it unchanged.

    Accepted: ``tcp://HOST:PORT`` with PORT in 1..65535 (HOST a name, an IPv4 address or ``[IPv6]``; for
    ``role="bind"`` also ``*`` for every interface and PORT ``0`` or ``*`` for a free port), ``ipc://PATH``
    and ``inproc://NAME``.

    Args:
        endpoint: the address, e.g. ``"tcp://127.0.0.1:5555"``.
        role: ``"bind"`` (servers) or ``"connect"`` (clients); named in the message.

    Raises:
        EndpointError: naming the role, the expected form and the address received, e.g.
            ``127.0.0.1:5593`` -> "... did you mean 'tcp://127.0.0.1:5593'?".
    """
    if not isinstance(endpoint, str):
        raise EndpointError(f"{role}: expected an address string such as 'tcp://127.0.0.1:5555', received {endpoint!r}")
    expected = "tcp://HOST:PORT (PORT in 1..65535), ipc://PATH or inproc://NAME"
    scheme, sep, rest = endpoint.partition("://")
    if not sep:
        hint = f"; did you mean 'tcp://{endpoint}'?" if ":" in endpoint else ""
        raise EndpointError(f"{role}: expected {expected}, received {endpoint!r} (no scheme){hint}")
    if scheme not in ENDPOINT_SCHEMES:
        raise EndpointError(f"{role}: expected {expected}, received {endpoint!r} (unknown scheme {scheme!r})")
    if scheme != "tcp":
        if not rest:
            raise EndpointError(f"{role}: expected {expected}, received {endpoint!r} (empty {scheme} address)")
        return endpoint
    host, colon, port = rest.rpartition(":")
    if not colon or not host or host == "[]":
        raise EndpointError(f"{role}: expected {expected}, received {endpoint!r} (expected HOST:PORT after tcp://)")
    if role == "bind" and port in ("*", "0"):
        return endpoint
    if role != "bind" and host == "*":
        raise EndpointError(f"{role}: expected a server host name or address, received {endpoint!r} (host '*')")
    if not port.isdigit() or not 1 <= int(port) <= 65535:
        any_port = "; 0 or * picks a free port" if role == "bind" else ""
        raise EndpointError(
            f"{role}: expected {expected}, received {endpoint!r} (port {port!r} is not in 1..65535{any_port})"
        )
    return endpoint


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
        EndpointError: ``endpoint`` is malformed (see :func:`check_endpoint`).
        InsecureBindError: naming the endpoint and both ways out (``--curve-keys DIR`` or ``--insecure``).
    """
    check_endpoint(endpoint, "bind")
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


def generate_keys(out_dir: str | Path, clients: tuple[str, ...] = ("client",), force: bool = False) -> Path:
    """Write a server key pair and one key pair per client name into ``out_dir``; authorize every client.

    Secret files (``*.key_secret``) are created with mode 0600 before any key byte is written; ``out_dir`` and
    ``out_dir/authorized_clients`` get mode 0700 when this call creates them.
    Nothing is written when a key file of the same name exists, unless ``force``: a new server key breaks every
    client deployed with the old ``server.key``.

    Args:
        out_dir: the key folder (created with its parents when missing).
        clients: one key pair per client name (a file-name stem: no ``/``, not ``server``).
        force: overwrite existing key files.

    Returns:
        ``out_dir`` as a Path.

    Raises:
        ValueError: a client name is empty, contains a path separator or is ``"server"``.
        KeysExistError: key files exist and ``force`` is False (the message lists them).
    """
    out = Path(out_dir)
    for name in clients:
        if not name or "/" in name or os.sep in name or name == SERVER_NAME or name.startswith("."):
            raise ValueError(
                f"clients: expected names usable as file stems other than {SERVER_NAME!r}, received {name!r}"
            )
    names = (SERVER_NAME, *clients)
    targets = [out / f"{n}{ext}" for n in names for ext in (".key", ".key_secret")]
    targets += [out / AUTHORIZED_DIR / f"{n}.key" for n in clients]
    existing = [str(p) for p in targets if p.exists()]
    if existing and not force:
        raise KeysExistError(
            f"keys: expected no existing key files in {out} (overwriting them breaks deployed clients), received "
            f"{', '.join(existing)}; pass --force to overwrite or choose another --out"
        )
    for folder in (out, out / AUTHORIZED_DIR):
        if not folder.is_dir():
            folder.mkdir(mode=0o700, parents=True)
            folder.chmod(0o700)  # mkdir's mode is masked by the umask
    for name in names:
        secret_file = out / f"{name}.key_secret"
        secret_file.unlink(missing_ok=True)  # a re-created file takes the mode below, an old one keeps its own
        os.close(os.open(secret_file, os.O_CREAT | os.O_WRONLY | os.O_EXCL, 0o600))  # 0600 before any byte
        secret_file.chmod(0o600)  # exactly 0600 whatever the umask (a 0o2xx umask would leave it unwritable)
        public_file, _ = zmq.auth.create_certificates(out, name)  # opens the files "w": the mode stays
        if name != SERVER_NAME:
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
