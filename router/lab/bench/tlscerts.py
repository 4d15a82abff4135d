"""Certificates for a benchmark run's TLS: a CA made for the run (never trusted anywhere else),
the router's certificate for 127.0.0.1 as files, and the load client's context trusting it."""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path

import trustme


@dataclass(frozen=True, slots=True)
class RunCertificates:
    cert: Path
    key: Path
    client: ssl.SSLContext

    def serve_args(self) -> list[str]:
        """`lane-router serve` flags that serve this certificate."""
        return ["--tls-cert", str(self.cert), "--tls-key", str(self.key)]


def run_certificates(directory: Path) -> RunCertificates:
    ca = trustme.CA()
    leaf = ca.issue_cert("127.0.0.1")
    cert, key = directory / "router-cert.pem", directory / "router-key.pem"
    leaf.cert_chain_pems[0].write_to_path(str(cert))
    leaf.private_key_pem.write_to_path(str(key))
    client = ssl.create_default_context()
    ca.configure_trust(client)
    return RunCertificates(cert, key, client)
