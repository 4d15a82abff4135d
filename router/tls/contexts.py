"""SSL contexts made from certificate files. Both sides speak TLS 1.2 at least and offer only
HTTP/1.1 by ALPN; a backend's certificate is always verified, a client's when a client CA is set.

Every failure to read or use a file is a `TlsFileError` naming the file's role, so a profile
check, a start and a reload can all say which file is wrong and why."""

from __future__ import annotations

import hashlib
import ssl
from pathlib import Path

MINIMUM_VERSION = ssl.TLSVersion.TLSv1_2
ALPN = ["http/1.1"]


class TlsFileError(ValueError):
    """A certificate, key or CA file that cannot be used; `role` names it (`tls.ca_file`,
    `--tls-cert`, …)."""

    def __init__(self, role: str, reason: str) -> None:
        super().__init__(f"{role}: {reason}")
        self.role = role
        self.reason = reason


def server_context(
    cert: Path, key: Path, client_ca: Path | None, *, roles: tuple[str, str, str]
) -> ssl.SSLContext:
    """The listener's context; with `client_ca`, a client must show a certificate it signed.
    `roles` names the three files in errors (the flags or settings they came from)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = MINIMUM_VERSION
    ctx.options |= ssl.OP_NO_RENEGOTIATION
    ctx.set_alpn_protocols(ALPN)
    _load_chain(ctx, cert, key, roles[0], roles[1])
    if client_ca is not None:
        _load_cas(ctx, client_ca, roles[2])
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


def client_context(
    ca_file: Path | None, cert: Path | None = None, key: Path | None = None, *, prefix: str = "tls"
) -> ssl.SSLContext:
    """A context for connections to backends: their certificate must chain to `ca_file` (else
    the system's CAs) and match the name the connection asks for; with `cert` and `key`, the
    router shows that certificate to a backend that asks for one. `prefix` names the files'
    block in errors."""
    if ca_file is None:
        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    else:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # verifies, and checks the name
        _load_cas(ctx, ca_file, f"{prefix}.ca_file")  # the bundle replaces the system's CAs
    ctx.minimum_version = MINIMUM_VERSION
    ctx.set_alpn_protocols(ALPN)
    if cert is not None and key is not None:
        _load_chain(ctx, cert, key, f"{prefix}.client_cert_file", f"{prefix}.client_key_file")
    return ctx


def files_digest(paths: tuple[Path, ...]) -> str:
    """The sha256 of the files' contents, in order: tells a rotated file from an unchanged one."""
    digest = hashlib.sha256()
    for path in paths:
        digest.update(_read(path, str(path)))
        digest.update(b"\0")
    return digest.hexdigest()


def _read(path: Path, role: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as err:
        raise TlsFileError(role, f"cannot read {path}: {err.strerror or err}") from None


def _load_chain(ctx: ssl.SSLContext, cert: Path, key: Path, cert_role: str, key_role: str) -> None:
    _read(cert, cert_role)
    _read(key, key_role)
    try:
        ctx.load_cert_chain(cert, key)
    except ssl.SSLError as err:
        raise TlsFileError(cert_role, f"{_chain_reason(err)} (key: {key_role})") from None


def _load_cas(ctx: ssl.SSLContext, cafile: Path, role: str) -> None:
    _read(cafile, role)
    try:
        ctx.load_verify_locations(cafile=cafile)
    except ssl.SSLError as err:
        raise TlsFileError(role, f"not a PEM CA bundle ({err.reason or err})") from None
    if not ctx.get_ca_certs():
        raise TlsFileError(role, "holds no CA certificate")


def _chain_reason(err: ssl.SSLError) -> str:
    if err.reason == "KEY_VALUES_MISMATCH":
        return "the key does not belong to the certificate"
    return f"not a PEM certificate and its key ({err.reason or err})"
