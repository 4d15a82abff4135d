"""`lane-router bench tenants --realtime`: the same comparison through the real router, in its
own process, in front of simulated engines, in real time.

Each tenant of the workload sends with a key of its own — `fifo`: one key for every tenant, whose
waiters the router keeps in order; `fair`: a key per tenant with its `weight` and `tier` — made
for the run and given to the router's profile beside the stack's own; `fair-tokens`: the same
keys, every lane of the profile counting turns in tokens (`fair_by: tokens`).
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from router.keys.auth import hash_key, new_key
from router.lab.bench.generate import Item, Request, SessionPlan, Trace
from router.lab.bench.loadclient import Endpoint
from router.lab.bench.realtime import RealtimeOptions, run_items
from router.lab.bench.stack import local_stack
from router.lab.bench.tenants import MODES, ModeRun, tenant_stats
from router.lab.bench.workload import WorkloadSpec

SHARED_KEY = "shared"


def tenant_keys(workload: WorkloadSpec, key_per_tenant: bool) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """The profile's `keys:` entries for the run and each tenant's secret."""
    if not key_per_tenant:
        secret = new_key()
        entry = {"name": SHARED_KEY, "sha256": hash_key(secret)}
        return [entry], {t.name: secret for t in workload.tenants}
    entries, secrets = [], {}
    for tenant in workload.tenants:
        secrets[tenant.name] = new_key()
        entries.append(
            {
                "name": tenant.name,
                "sha256": hash_key(secrets[tenant.name]),
                "weight": tenant.weight,
                "tier": tenant.tier,
            }
        )
    return entries, secrets


def keyed_items(trace: Trace, secrets: Mapping[str, str]) -> tuple[Item, ...]:
    """The trace's items, each request carrying its tenant's key."""

    def keyed(req: Request) -> Request:
        auth = ("authorization", f"Bearer {secrets[req.tenant]}")
        return replace(req, extra_headers=(*req.extra_headers, auth))

    return tuple(
        replace(item, steps=tuple(map(keyed, item.steps))) if isinstance(item, SessionPlan) else keyed(item)
        for item in trace.items
    )


def counted_by(data: Mapping[str, Any], cost: str) -> dict[str, Any]:
    """`data` (a profile mapping) with every lane it writes counting turns by `cost`."""
    out = copy.deepcopy(dict(data))
    lane_sets = [out.get("lanes", {})] + [m.get("lanes", {}) for m in out.get("models", {}).values()]
    for lanes in lane_sets:
        for lane in lanes.values():
            lane["fair_by"] = cost
    return out


def run_mode_realtime(
    trace: Trace, data: Mapping[str, Any], preset: str, mode: str, *, progress: bool = False
) -> ModeRun:
    """`trace` through a fresh router and engines for `data`, keyed as `mode` says."""
    cost, key_per_tenant = MODES[mode]
    entries, secrets = tenant_keys(trace.workload, key_per_tenant)
    items = keyed_items(trace, secrets)
    with local_stack(counted_by(data, cost), preset, keys=entries) as stack:
        # The requests carry their tenants' keys; the stack's own is not sent.
        endpoint = Endpoint(stack.url, None)
        outcomes = asyncio.run(run_items(items, endpoint, RealtimeOptions(progress=progress, desc=mode)))
    return ModeRun(mode, tenant_stats(outcomes, trace.workload, trace.duration))
