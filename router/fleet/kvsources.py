"""Where a backend's engine publishes its KV events: the pure decisions of router/fleet/kvfollow.py.

A pool follows its engines when one of its lanes balances `precise_prefix` (`followed`), or when
its `kv_events.follow` says so. Each backend's publishers are either the ports the pool names, on
the backend's own host, one per data-parallel rank at port + rank as vLLM binds them
(`configured`), or what the backend lists at `GET /kv_event_sources` (`listed`): vLLM answers
`{"RANK": {"endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:5558", ...}}`, each rank's
ports already moved up by its rank.

A wildcard host (`*`, `0.0.0.0`, `::`) means the backend's own host. Any other host in a PUB
endpoint means vLLM's publisher *connects* there instead of binding (vLLM binds only wildcard,
ipc and inproc endpoints): nobody can subscribe to the engine itself, so such a rank is refused
with the reason, unless the host is the backend's own (vLLM reports `tcp://*:0` as the address it
bound). ipc and inproc endpoints are not reachable from another process's network stack and are
refused too. The router connects to the backend's own host only: a replay endpoint naming another
host is dropped (the rank is followed without replays), whatever the engine binds.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from router.balance import BalanceSettings, places_on_token_ids
from router.config.models import KVEventsConfig, PoolConfig

WILDCARDS = frozenset({"*", "0.0.0.0", "::", "[::]", ""})
DISCOVERED = KVEventsConfig()


@dataclass(frozen=True, slots=True)
class Publisher:
    """One data-parallel rank's PUB endpoint and its replay endpoint (None: it has none)."""

    endpoint: str
    replay_endpoint: str | None


@dataclass(frozen=True, slots=True)
class Listed:
    """What a backend's `/kv_event_sources` answer gives: the publishers the router can follow,
    and why each other rank cannot be."""

    publishers: tuple[Publisher, ...]
    refused: tuple[str, ...]


def followed(pool: PoolConfig, balances: Iterable[BalanceSettings]) -> KVEventsConfig | None:
    """How the pool finds its publishers, when it follows them at all: when `kv_events.follow`
    says so, else when a lane of the pool places on token ids; unset, by discovery."""
    cfg = pool.kv_events or DISCOVERED
    follow = cfg.follow
    if follow is None:
        follow = any(places_on_token_ids(b) for b in balances)
    return cfg if follow else None


def backend_host(origin: str) -> str:
    """The host of `http://HOST:PORT`, as a ZMQ TCP endpoint writes it (IPv6 in brackets)."""
    host = urlsplit(origin).hostname or ""
    return f"[{host}]" if ":" in host else host


def configured(origin: str, cfg: KVEventsConfig) -> tuple[Publisher, ...]:
    """The ranks of the ports the pool names, on the backend's host."""
    assert cfg.port is not None
    host = backend_host(origin)
    replay = cfg.replay_port
    return tuple(
        Publisher(
            f"tcp://{host}:{cfg.port + rank}",
            None if replay is None else f"tcp://{host}:{replay + rank}",
        )
        for rank in range(cfg.data_parallel_size)
    )


def listed(origin: str, answer: Any) -> Listed:
    """The publishers of a `/kv_event_sources` answer, ranks in order."""
    if not isinstance(answer, dict):
        return Listed((), ("/kv_event_sources did not answer a JSON object",))
    host = backend_host(origin)
    publishers: list[Publisher] = []
    refused: list[str] = []
    for rank, source in sorted(answer.items(), key=lambda item: _rank_order(item[0])):
        if not isinstance(source, dict):
            refused.append(f"rank {rank}: not an object")
            continue
        if not source.get("enable_kv_cache_events") or source.get("publisher", "zmq") != "zmq":
            refused.append(f"rank {rank}: publishes no KV events (enable_kv_cache_events, publisher: zmq)")
            continue
        endpoint, why = _reachable(source.get("endpoint"), host)
        if endpoint is None:
            refused.append(f"rank {rank}: {why}")
            continue
        replay = _replay(source.get("replay_endpoint"), host, rank, refused)
        publishers.append(Publisher(endpoint, replay))
    return Listed(tuple(publishers), tuple(refused))


def _replay(endpoint: Any, host: str, rank: Any, refused: list[str]) -> str | None:
    """The rank's replay endpoint, when it has one on the backend's host (vLLM binds it whatever
    its host, but the router connects nowhere else)."""
    if endpoint is None:
        return None
    replay, _ = _reachable(endpoint, host)
    if replay is None:
        refused.append(
            f"rank {rank}: replay endpoint {endpoint} is not a TCP port of the backend's host; "
            "lost batches are not asked again"
        )
    return replay


def _rank_order(rank: Any) -> tuple[int, str]:
    text = str(rank)
    return (int(text), text) if _is_number(text) else (1 << 30, text)


def _is_number(text: str) -> bool:
    """ASCII digits only: `str.isdigit` also takes other scripts' digits and superscripts."""
    return text.isascii() and text.isdigit()


def _reachable(endpoint: Any, host: str) -> tuple[str | None, str]:
    """The endpoint a subscriber on another host connects to, or None and why there is none."""
    if not isinstance(endpoint, str) or not endpoint:
        return None, "no endpoint"
    if not endpoint.startswith("tcp://"):
        return None, f"{endpoint} is not a TCP endpoint another host can reach"
    address, _, port = endpoint[len("tcp://") :].rpartition(":")
    if not _is_number(port) or not 0 < int(port) < 1 << 16:
        return None, f"{endpoint} names no port"
    if address in WILDCARDS:
        return f"tcp://{host}:{port}", ""
    if address.lower() == host:
        return f"tcp://{host}:{port}", ""
    return None, (
        f"{endpoint} has a host, so the engine connects out to it instead of binding; "
        "start vLLM with endpoint tcp://*:PORT so the router can subscribe"
    )
