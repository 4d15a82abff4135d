"""The listener's TLS: the certificate, key and optional client CA of the settings
(`--tls-cert`, `--tls-key`, `--tls-client-ca`), loaded at start, re-read on SIGHUP.

A reload builds a whole new context from the files; only when that succeeds does it replace
the one new connections are served with (connections already open keep theirs). A file that
cannot be used keeps the old certificate serving and says why, as a refused profile does.

Failed client handshakes are counted by reason (`lane_router_tls_handshake_failures_total`) and
logged at most once per reason every LOG_EVERY_S, with the number since: a port scanner or a
client speaking plain HTTP to the port must not flood the log."""

from __future__ import annotations

import logging
import time
from pathlib import Path

from router.httpserver.tls import TlsTermination
from router.observe.metrics import Metrics
from router.settings import Settings
from router.tls.contexts import files_digest, server_context

log = logging.getLogger("lane_router.tls")

LOG_EVERY_S = 60.0
ROLES = ("--tls-cert", "--tls-key", "--tls-client-ca")


class ServingTls:
    """Build with `ServingTls.of(settings)`; `termination` is what the HTTP server serves with."""

    def __init__(self, cert: Path, key: Path, client_ca: Path | None) -> None:
        self._files = (cert, key, client_ca)
        self._digest = self._files_digest()
        self.termination = TlsTermination(server_context(cert, key, client_ca, roles=ROLES), self._failed)
        self._metrics: Metrics | None = None
        self._logged: dict[str, tuple[float, int]] = {}  # reason → (last logged, failures since)

    @classmethod
    def of(cls, settings: Settings) -> ServingTls | None:
        """The settings' TLS, None without a certificate. Raises `TlsFileError`."""
        if settings.tls_cert is None or settings.tls_key is None:
            return None
        return cls(settings.tls_cert, settings.tls_key, settings.tls_client_ca)

    @property
    def requires_client_certificate(self) -> bool:
        return self._files[2] is not None

    def attach(self, metrics: Metrics) -> None:
        """Count into `metrics` from now on (they exist only once the router's state does)."""
        self._metrics = metrics

    def describe(self) -> str:
        cert, _, client_ca = self._files
        mtls = f", client certificates signed by {client_ca}" if client_ca is not None else ""
        return f"TLS with {cert} (sha256 {self._digest[:12]}){mtls}"

    def reload(self) -> str:
        """Re-read the files; why they cannot be used (the old context still serving), or ""."""
        cert, key, client_ca = self._files
        try:
            context = server_context(cert, key, client_ca, roles=ROLES)
            digest = self._files_digest()
        except ValueError as err:
            log.error("TLS reload refused, the previous certificate keeps serving: %s", err)
            self._count_reload("refused")
            return str(err)
        self.termination.context = context
        changed = "changed" if digest != self._digest else "unchanged"
        self._digest = digest
        log.info("TLS certificate reloaded (%s): %s", changed, self.describe())
        self._count_reload("ok")
        return ""

    def _files_digest(self) -> str:
        return files_digest(tuple(path for path in self._files if path is not None))

    def _count_reload(self, result: str) -> None:
        if self._metrics is not None:
            self._metrics.tls_certificate_reloads.labels(result).inc()

    def _failed(self, reason: str) -> None:
        if self._metrics is not None:
            self._metrics.tls_handshake_failures.labels(reason).inc()
        now = time.monotonic()
        last, since = self._logged.get(reason, (float("-inf"), 0))
        if now - last < LOG_EVERY_S:
            self._logged[reason] = (last, since + 1)
            return
        self._logged[reason] = (now, 0)
        more = f" ({since} more since the last report)" if since else ""
        log.warning("a client's TLS handshake failed: %s%s", reason.replace("_", " "), more)
