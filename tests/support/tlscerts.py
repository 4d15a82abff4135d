"""Certificates made for a test: a CA of its own (trustme) and the files the router reads."""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path

import trustme


@dataclass(frozen=True)
class Issued:
    cert: Path  # the chain, leaf first
    key: Path


class TestCA:
    """A CA whose certificate is written to `ca_file`, issuing leaf certificates as files."""

    __test__ = False  # not a test class, whatever its name

    def __init__(self, directory: Path, name: str = "ca") -> None:
        self._ca = trustme.CA()
        self._dir = directory
        self._name = name
        self.ca_file = directory / f"{name}.pem"
        self._ca.cert_pem.write_to_path(str(self.ca_file))
        self._issued = 0

    def issue(self, *names: str) -> Issued:
        """A certificate for `names` (DNS names or IP addresses), as new files."""
        self._issued += 1
        leaf = self._ca.issue_cert(*names)
        cert = self._dir / f"{self._name}-{self._issued}-cert.pem"
        key = self._dir / f"{self._name}-{self._issued}-key.pem"
        for i, pem in enumerate(leaf.cert_chain_pems):
            pem.write_to_path(str(cert), append=i > 0)
        leaf.private_key_pem.write_to_path(str(key))
        return Issued(cert, key)

    def client_context(self, client: Issued | None = None) -> ssl.SSLContext:
        """A client's context trusting this CA, showing `client` when given."""
        ctx = ssl.create_default_context(cafile=str(self.ca_file))
        if client is not None:
            ctx.load_cert_chain(client.cert, client.key)
        return ctx


def serial_of(issued: Issued) -> str:
    """The certificate's serial number as `getpeercert()` spells it (upper-case hex)."""
    decoded = ssl._ssl._test_decode_cert(str(issued.cert))  # type: ignore[attr-defined]
    return str(decoded["serialNumber"])
