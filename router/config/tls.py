"""A pool's `tls:` block: how the router verifies its `https://` backends and, for mTLS, which
certificate it shows them. Verification is always on: there is no switch to turn it off."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


class UpstreamTlsConfig(BaseModel):
    """`ca_file`: the CA bundle backends' certificates must chain to (unset: the system's CAs).
    `server_name`: the name sent as SNI and checked against the certificate instead of the URL's
    host (for backends addressed by IP, or discovered ones). `client_cert_file` and
    `client_key_file` (both or neither): the certificate shown to backends that require one.
    `verify` may only be true; it is accepted so that a profile saying `verify: false` is refused
    with a reason instead of silently ignored."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    ca_file: Path | None = None
    server_name: str | None = Field(None, min_length=1, max_length=253, pattern=r"^[A-Za-z0-9_.:-]+$")
    client_cert_file: Path | None = None
    client_key_file: Path | None = None
    verify: Literal[True] = True

    @field_validator("verify", mode="before")
    @classmethod
    def _always_verified(cls, value: Any) -> Any:
        if value is not True:
            raise ValueError(
                "must be true: backends' certificates are always verified; for a private CA set "
                "ca_file, for an IP-addressed backend set server_name"
            )
        return value

    @model_validator(mode="after")
    def _cert_with_key(self) -> UpstreamTlsConfig:
        if (self.client_cert_file is None) != (self.client_key_file is None):
            raise ValueError("set both client_cert_file and client_key_file, or neither")
        return self

    @property
    def files(self) -> tuple[tuple[str, Path], ...]:
        """The files the block names, by field."""
        named = (
            ("ca_file", self.ca_file),
            ("client_cert_file", self.client_cert_file),
            ("client_key_file", self.client_key_file),
        )
        return tuple((field, path) for field, path in named if path is not None)
