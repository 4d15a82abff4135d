"""Capacity evidence from a benchmark run: one record per lane it measured (docs/evidence.md).

A record binds the lane's measurements to its pool's identity. The identity is the configured
one, corrected by what the backends themselves report when every backend of the pool agrees
(`/version`, `max_model_len` on `/v1/models`) — the evidence is about the servers that answered,
so a drifted server yields a record with its real identity and a different configuration hash.
The boundary note is derived from the router's profile.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

import orjson

from router.config.models import PoolConfig, ProfileConfig, RequestClass
from router.evidence import new_record, security_boundary_note
from router.evidence.identity import workload_sha256
from router.evidence.records import (
    CapacityEvidenceRecord,
    LatencySummary,
    MeasuredSlice,
    MeasurementProtocol,
    Measurements,
    TokenRange,
    WarmupState,
)
from router.lab.bench.outcome import Outcome
from router.lab.bench.report import percentile
from router.lab.sim.profile import pool_api_key
from router.proxy.upstream import UpstreamPool

TOOL = "lane-router bench run"


@dataclass(frozen=True, slots=True)
class Observed:
    """What one backend says about itself (None: it did not say)."""

    version: str | None
    max_model_len: int | None


async def observe_backend(origin: str, api_key: str | None, timeout: float = 3.0) -> Observed:
    pool = UpstreamPool(origin, connect_timeout=timeout, read_timeout=timeout)
    headers = [(b"authorization", b"Bearer " + api_key.encode())] if api_key else []
    version: str | None = None
    max_len: int | None = None
    try:
        with contextlib.suppress(Exception):
            resp = await pool.request(b"GET", b"/version", [], b"")
            body = await resp.read()
            if resp.status == 200:
                version = str(orjson.loads(body)["version"])
        with contextlib.suppress(Exception):
            resp = await pool.request(b"GET", b"/v1/models", headers, b"")
            body = await resp.read()
            if resp.status == 200:
                lengths = {m.get("max_model_len") for m in orjson.loads(body)["data"]}
                if len(lengths) == 1 and isinstance(next(iter(lengths)), int):
                    max_len = next(iter(lengths))
    finally:
        await pool.aclose()
    return Observed(version, max_len)


async def observed_pools(cfg: ProfileConfig) -> dict[str, PoolConfig]:
    """Every pool as its backends report it (configured values where they are silent or disagree)."""
    out: dict[str, PoolConfig] = {}
    for name, pool in cfg.pools.items():
        seen = await asyncio.gather(*(observe_backend(o, pool_api_key(pool)) for o in pool.origins))
        out[name] = as_observed(pool, seen)
    return out


def as_observed(pool: PoolConfig, seen: Sequence[Observed]) -> PoolConfig:
    updates: dict[str, object] = {}
    versions = {o.version for o in seen}
    if len(versions) == 1 and None not in versions:
        updates["version"] = versions.pop()
    lengths = {o.max_model_len for o in seen}
    if len(lengths) == 1 and None not in lengths:
        updates["max_model_len"] = lengths.pop()
    if not updates:
        return pool
    return pool.model_copy(update={"vllm": pool.vllm.model_copy(update=updates)})


def _summary(values: Sequence[float]) -> LatencySummary:
    if not values:
        # Nothing of this kind was measured (e.g. gaps of a lane that does not stream).
        return LatencySummary(p50_ms=0.0, p95_ms=0.0)
    ordered = sorted(values)
    return LatencySummary(p50_ms=percentile(ordered, 50) * 1e3, p95_ms=percentile(ordered, 95) * 1e3)


def peak_concurrency(outcomes: Sequence[Outcome]) -> int:
    """The most requests in flight at once (each from its sending to its last byte)."""
    events: list[tuple[float, int]] = []
    for o in outcomes:
        if o.finish is not None:
            events += [(o.arrival, 1), (o.finish, -1)]
    level = peak = 0
    for _, step in sorted(events, key=lambda e: (e[0], e[1])):
        level += step
        peak = max(peak, level)
    return max(1, peak)


def _is_timeout(o: Outcome) -> bool:
    return o.status == 504 or (o.error is not None and "timeout" in o.error.lower())


def lane_measurements(outcomes: Sequence[Outcome], window: float) -> Measurements:
    ok = [o for o in outcomes if o.ok]
    start = min(o.arrival for o in outcomes)
    end = max((o.finish for o in ok if o.finish is not None), default=start)
    span = max(end - start, 1e-9)
    failed = [o for o in outcomes if not o.ok]
    timeouts = sum(1 for o in failed if _is_timeout(o))
    return Measurements(
        ttft=_summary([o.ttft for o in ok if o.ttft is not None]),
        itl=_summary([g for o in ok for g in o.gaps]),
        e2e=_summary([o.e2e for o in ok if o.e2e is not None]),
        output_tokens_per_s=sum(o.output_tokens for o in ok) / span,
        requests_per_s=len(ok) / window if window > 0 else None,
        error_count=len(failed) - timeouts,
        timeout_count=timeouts,
    )


def lane_slice(outcomes: Sequence[Outcome]) -> MeasuredSlice:
    counts: dict[RequestClass, int] = {}
    for o in outcomes:
        with contextlib.suppress(ValueError):
            cls = RequestClass(o.cls)
            counts[cls] = counts.get(cls, 0) + 1
    total = sum(counts.values())
    mix = {cls: n / total for cls, n in counts.items()}
    if mix:  # shares must add up to one exactly enough for the record's validator
        last = max(mix, key=lambda c: mix[c])
        mix[last] = 1.0 - math.fsum(v for c, v in mix.items() if c != last)
    outputs = [o.output_tokens if o.ok else o.max_tokens for o in outcomes]
    prompts = [o.prompt_tokens for o in outcomes]
    return MeasuredSlice(
        input_tokens=TokenRange(min=min(prompts), max=max(prompts)),
        output_tokens=TokenRange(min=min(outputs), max=max(outputs)),
        concurrency=peak_concurrency(outcomes),
        class_mix=mix,
    )


def lane_records(
    cfg: ProfileConfig,
    outcomes: Sequence[Outcome],
    *,
    pools: Mapping[str, PoolConfig],
    workload: bytes,
    window: float,
    warmup: WarmupState,
    measured_at: datetime,
) -> dict[str, CapacityEvidenceRecord]:
    """One record per lane named by the outcomes (lanes come from the router's debug headers);
    `pools` is each pool as observed (see `observed_pools`)."""
    by_lane: dict[str, list[Outcome]] = {}
    for o in outcomes:
        if o.lane is not None:
            by_lane.setdefault(o.lane, []).append(o)
    note = security_boundary_note(cfg)
    records: dict[str, CapacityEvidenceRecord] = {}
    for lane_name, items in sorted(by_lane.items()):
        try:
            lane = cfg.lanes[RequestClass(lane_name)]
        except (ValueError, KeyError):
            continue  # a lane this profile does not have: the answers came from another router
        records[lane_name] = new_record(
            pools[lane.pool],
            warmup=warmup,
            protocol=MeasurementProtocol(
                tool=TOOL,
                workload_sha256=workload_sha256(workload),
                duration_s=window,
                sample_count=len(items),
            ),
            measured_slice=lane_slice(items),
            measurements=lane_measurements(items, window),
            measured_at=measured_at,
            security_boundary_note=note,
        )
    return records
