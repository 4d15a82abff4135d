"""Bounded GETs of a backend's own endpoints, for the health checker and the load scraper.

A backend may answer anything, so each GET is bounded in time as a whole (not only per socket
read, which a backend sending a byte now and then would never trip) and in body bytes, read as
they arrive and never past the cap. The response head is bounded by the HTTP client itself:
httpcore hands h11 a 100 KiB limit on an incomplete head, so a larger one is a protocol error.
Compressed bodies are refused rather than inflated: the request asks for `identity`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass

import httpx

HEALTH_BYTES = 64 * 1024
INFO_BYTES = 1024 * 1024  # /version, /v1/models
METRICS_BYTES = 4 * 1024 * 1024

_IDENTITY = {"accept-encoding": "identity"}


@dataclass(frozen=True, slots=True)
class Answer:
    status: int
    body: bytes


async def get_capped(
    client: httpx.AsyncClient,
    url: str,
    *,
    cap: int,
    timeout: float,
    headers: Mapping[str, str] | None = None,
) -> Answer | None:
    """The status and body of a GET; None when it failed, took longer than `timeout` in all,
    sent a body of more than `cap` bytes or a compressed one."""
    try:
        async with asyncio.timeout(timeout):
            request_headers = {**_IDENTITY, **(headers or {})}
            async with client.stream("GET", url, headers=request_headers, timeout=timeout) as resp:
                if resp.headers.get("content-encoding", "identity").lower() != "identity":
                    return None
                body = await _read_capped(resp, cap)
                return None if body is None else Answer(resp.status_code, body)
    except (httpx.HTTPError, TimeoutError):
        return None


async def _read_capped(resp: httpx.Response, cap: int) -> bytes | None:
    declared = resp.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > cap:
        return None
    body = bytearray()
    async for chunk in resp.aiter_raw():
        body += chunk
        if len(body) > cap:
            return None
    return bytes(body)
