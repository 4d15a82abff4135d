"""Bounded GETs of a backend's own endpoints, for the health checker and the load scraper.

A backend may answer anything, so each GET is bounded in time as a whole (not only per socket
read, which a backend sending a byte now and then would never trip) and in body bytes, read as
they arrive and never past the cap. The response head is bounded by the HTTP client itself:
httpcore hands h11 a 100 KiB limit on an incomplete head, so a larger one is a protocol error.
Compressed bodies are refused rather than inflated: the request asks for `identity`.

`ProbeClient` sends each GET with the TLS of the backend's pool (router/tls/upstream.py): the
same CA bundle, client certificate and name to verify as the pool's requests.

httpx logs every request it sends at INFO: a probe every few seconds per backend would fill the
log forever. While a `ProbeClient` GET runs, httpx's lines below WARNING are logged at DEBUG
instead (`ProbeLines`); the router's own lines on what probes find keep their levels.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import httpx

from router.tls.upstream import UpstreamTls

HEALTH_BYTES = 64 * 1024
INFO_BYTES = 1024 * 1024  # /version, /v1/models
METRICS_BYTES = 4 * 1024 * 1024

_IDENTITY = {"accept-encoding": "identity"}
# httpx clients kept, one per TLS setup in use; a reload that rotates files adds one.
MAX_CLIENTS = 16


_PROBING: ContextVar[bool] = ContextVar("lane_router_probing", default=False)
HTTPX_LOGGER = "httpx"


class ProbeLines(logging.Filter):
    """Demotes httpx's lines about a probe's request to DEBUG, dropped unless httpx's logger is
    enabled for DEBUG; lines of any other httpx use pass as they are."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not _PROBING.get() or record.levelno >= logging.WARNING:
            return True
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)


def quiet_probe_lines() -> None:
    """Install `ProbeLines` on httpx's logger, once."""
    logger = logging.getLogger(HTTPX_LOGGER)
    if not any(isinstance(f, ProbeLines) for f in logger.filters):
        logger.addFilter(ProbeLines())


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
    extensions: dict[str, Any] | None = None,
) -> Answer | None:
    """The status and body of a GET; None when it failed, took longer than `timeout` in all,
    sent a body of more than `cap` bytes or a compressed one."""
    return await send_capped(
        client, "GET", url, cap=cap, timeout=timeout, headers=headers, extensions=extensions
    )


async def send_capped(
    client: httpx.AsyncClient,
    method: str,
    url: str,
    *,
    cap: int,
    timeout: float,
    headers: Mapping[str, str] | None = None,
    extensions: dict[str, Any] | None = None,
    content: bytes | None = None,
) -> Answer | None:
    """`get_capped` for any method, with a body to send."""
    probing = _PROBING.set(True)
    try:
        async with asyncio.timeout(timeout):
            request_headers = {**_IDENTITY, **(headers or {})}
            stream = client.stream(
                method, url, headers=request_headers, timeout=timeout, extensions=extensions, content=content
            )
            async with stream as resp:
                if resp.headers.get("content-encoding", "identity").lower() != "identity":
                    return None
                body = await _read_capped(resp, cap)
                return None if body is None else Answer(resp.status_code, body)
    except (httpx.HTTPError, TimeoutError):
        return None
    finally:
        _PROBING.reset(probing)


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


class ProbeClient:
    """Bounded GETs with a pool's TLS: one httpx client per TLS setup (the plain one included),
    the oldest closed once more than MAX_CLIENTS were made."""

    def __init__(self) -> None:
        quiet_probe_lines()
        self._clients: OrderedDict[UpstreamTls | None, httpx.AsyncClient] = OrderedDict()
        self._retired: list[httpx.AsyncClient] = []

    async def get(
        self,
        tls: UpstreamTls | None,
        url: str,
        *,
        cap: int,
        timeout: float,
        headers: Mapping[str, str] | None = None,
    ) -> Answer | None:
        client, extensions = await self._prepared(tls)
        return await get_capped(client, url, cap=cap, timeout=timeout, headers=headers, extensions=extensions)

    async def _prepared(self, tls: UpstreamTls | None) -> tuple[httpx.AsyncClient, dict[str, Any] | None]:
        """The client for `tls` (replaced ones closed first) and the request's SNI extension."""
        await self._close_retired()
        extensions = {"sni_hostname": tls.server_name} if tls is not None and tls.server_name else None
        return self._client(tls), extensions

    async def post(
        self,
        tls: UpstreamTls | None,
        url: str,
        body: bytes,
        *,
        cap: int,
        timeout: float,
        headers: Mapping[str, str] | None = None,
    ) -> Answer | None:
        """A bounded POST of a JSON body (an adapter's load, router/fleet/adapterload.py)."""
        client, extensions = await self._prepared(tls)
        sent = {"content-type": "application/json", **(headers or {})}
        return await send_capped(
            client, "POST", url, cap=cap, timeout=timeout, headers=sent, extensions=extensions, content=body
        )

    async def status(
        self, tls: UpstreamTls | None, url: str, *, timeout: float, headers: Mapping[str, str] | None = None
    ) -> int | None:
        """The status of a GET, its body left unread; None when it failed or took longer than
        `timeout`."""
        client, extensions = await self._prepared(tls)
        probing = _PROBING.set(True)
        try:
            async with asyncio.timeout(timeout):
                request_headers = {**_IDENTITY, **(headers or {})}
                stream = client.stream(
                    "GET", url, headers=request_headers, timeout=timeout, extensions=extensions
                )
                async with stream as resp:
                    return resp.status_code
        except (httpx.HTTPError, TimeoutError):
            return None
        finally:
            _PROBING.reset(probing)

    def _client(self, tls: UpstreamTls | None) -> httpx.AsyncClient:
        client = self._clients.get(tls)
        if client is not None:
            self._clients.move_to_end(tls)
            return client
        client = self._clients[tls] = httpx.AsyncClient(verify=tls.context if tls is not None else True)
        if len(self._clients) > MAX_CLIENTS:
            self._retired.append(self._clients.popitem(last=False)[1])
        return client

    async def _close_retired(self) -> None:
        while self._retired:
            await self._retired.pop().aclose()

    async def aclose(self) -> None:
        self._retired += self._clients.values()
        self._clients.clear()
        await self._close_retired()
