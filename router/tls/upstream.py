"""A pool's TLS towards its `https://` backends, and how a failed handshake is named.

`UpstreamTls` is built with the pool's settings, before any live object changes, so a `tls:`
block whose files cannot be used refuses the profile (or the reload) instead of failing every
request. Two of them are equal when the block and the files' contents are: a reload that keeps
both keeps the backends' open connections; a rotated file gives them new ones.

A handshake that fails is an `UpstreamTlsError`, raised before a byte of the request was
written (the connection is handed over only once the handshake completed): it is retried on
another backend like a refused connection, and ends as 502. Its code, the upstream error
metric's reason, is one of a fixed few; its message names the pool and backend, never an
address or the name asked for."""

from __future__ import annotations

import ssl
from dataclasses import dataclass, field
from pathlib import Path

from router.config.models import PoolConfig
from router.config.tls import UpstreamTlsConfig
from router.errors import UpstreamConnectError
from router.tls.contexts import client_context, files_digest


class UpstreamTlsError(UpstreamConnectError):
    code = "upstream_tls_failed"


# ssl's verify codes (X509_V_ERR_*) by what an operator has to fix.
_UNTRUSTED = frozenset({2, 18, 19, 20, 21, 27})  # no issuer, self-signed, chain not trusted
_EXPIRED = frozenset({9, 10})  # not yet valid, expired
_NAME_MISMATCH = frozenset({62, 64})  # hostname or IP address mismatch


@dataclass(frozen=True, slots=True)
class UpstreamTls:
    """The context and the name asked for (SNI and certificate check; None: the URL's host)."""

    config: UpstreamTlsConfig | None
    server_name: str | None
    digest: str
    context: ssl.SSLContext = field(compare=False, hash=False, repr=False)


def upstream_tls(pc: PoolConfig, prefix: str) -> UpstreamTls | None:
    """The pool's TLS, None when no backend of it speaks https. A discovered backend is an
    address: unless `tls.server_name` says otherwise, its certificate must match the name the
    pool discovers (a headless Service's name is the one its pods' certificates carry).
    Raises `TlsFileError` (its role prefixed with `prefix`) for a file that cannot be used."""
    if not pc.uses_tls:
        return None
    cfg = pc.tls
    name = cfg.server_name if cfg is not None else None
    if name is None and pc.discovery is not None:
        name = pc.discovery.dns.rstrip(".")
    if cfg is None:
        context = client_context(None)
        paths: tuple[Path, ...] = ()
    else:
        context = client_context(
            cfg.ca_file, cfg.client_cert_file, cfg.client_key_file, prefix=f"{prefix}.tls"
        )
        paths = tuple(path for _, path in cfg.files)
    return UpstreamTls(config=cfg, server_name=name, digest=files_digest(paths), context=context)


def handshake_failure(exc: ssl.SSLError, label: str) -> UpstreamTlsError:
    """What a failed handshake with a backend is, for clients and the upstream error metric."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        code = exc.verify_code
        if code in _NAME_MISMATCH:
            return _error(
                label,
                "its certificate does not name the backend (see the pool's tls.server_name)",
                "upstream_tls_name_mismatch",
            )
        if code in _EXPIRED:
            return _error(label, "its certificate is expired or not yet valid", "upstream_tls_expired")
        if code in _UNTRUSTED:
            return _error(
                label,
                "its certificate is not signed by a trusted CA (see the pool's tls.ca_file)",
                "upstream_tls_untrusted",
            )
        return _error(label, "its certificate failed verification", "upstream_tls_untrusted")
    reason = getattr(exc, "reason", None) or ""
    if reason.startswith(("SSLV3_ALERT", "TLSV1_ALERT", "TLSV13_ALERT")):
        return _error(
            label,
            "the backend refused the handshake (a client certificate it wants?)",
            "upstream_tls_refused",
        )
    if reason in ("WRONG_VERSION_NUMBER", "UNSUPPORTED_PROTOCOL", "RECORD_LAYER_FAILURE"):
        return _error(
            label, "the backend does not speak TLS 1.2 or later on that port", "upstream_tls_failed"
        )
    return _error(label, "the TLS handshake failed", "upstream_tls_failed")


def _error(label: str, what: str, code: str) -> UpstreamTlsError:
    return UpstreamTlsError(f"{label}: TLS: {what}", code=code)
