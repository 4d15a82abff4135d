"""Whether a backend still holds a response of a given id: asked before a request names it.

The router remembers a response's id for a while (`response_ids.ttl_s`, at most
`max_entries`, until it restarts or Redis loses its data); vLLM keeps a stored response until it
restarts. An id the router no longer remembers may still name another key's response on a
backend, and a request naming it does not always replace that response there (`store: false`,
a stream cut short, a stored response that was cancelled): bound to the namer, the id would hand
it the other key's response. So each backend the request could reach is asked first, with the
retrieve route vLLM serves: 404 is free, 200 is taken."""

from __future__ import annotations

import asyncio
from enum import Enum

from router.app.routes import RESPONSES_PREFIX
from router.fleet.backend import Backend
from router.fleet.pool import Pool
from router.fleet.probes import ProbeClient


class Held(Enum):
    FREE = "free"  # every backend that takes requests answered 404
    HELD = "held"  # one answered 200
    UNKNOWN = "unknown"  # one could not say


async def held_upstream(pool: Pool, response_id: str, timeout: float) -> Held:
    """Whether a backend of `pool` that takes requests holds a response `response_id`."""
    backends = [b for b in pool.backends if b.routable]
    if not backends:
        return Held.FREE  # the request goes nowhere: the pool refuses it itself
    probes = ProbeClient()
    try:
        answers = await asyncio.gather(*(_ask(probes, pool, b, response_id, timeout) for b in backends))
    finally:
        await probes.aclose()
    if Held.HELD in answers:
        return Held.HELD
    return Held.UNKNOWN if Held.UNKNOWN in answers else Held.FREE


async def _ask(probes: ProbeClient, pool: Pool, backend: Backend, response_id: str, timeout: float) -> Held:
    headers = {"authorization": "Bearer " + pool.upstream_key.decode()} if pool.upstream_key else {}
    url = backend.name + RESPONSES_PREFIX.decode() + response_id
    # Only the status matters: the body (as large as the conversation) is left unread.
    status = await probes.status(pool.tls, url, timeout=timeout, headers=headers)
    if status == 404:
        return Held.FREE
    return Held.HELD if status == 200 else Held.UNKNOWN
