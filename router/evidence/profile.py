"""Judge a whole profile against a set of records: one decision per lane.

A lane's target is what its configuration lets through: `max_in_flight`, `max_prompt_tokens`,
`max_output_tokens`. A limit the lane leaves open falls back to what its pool's servers accept —
`max_model_len` tokens, and `max_num_seqs × data_parallel_size` running sequences per backend —
because that is the load the pool will really see. A pool found by DNS has as many backends as
its name lists at the moment; its `max_backends` is the most the router sends to, so that is the
load it may see.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from router.config.models import LaneConfig, PoolConfig, ProfileConfig, RequestClass
from router.evidence.decide import Decision, decide, no_evidence
from router.evidence.identity import serving_configuration
from router.evidence.records import CapacityEvidenceRecord, ServingConfiguration
from router.evidence.targets import SloTargets, Target
from router.evidence.triggers import retest_triggers, slice_triggers


def lane_target(lane: LaneConfig, pool: PoolConfig) -> Target:
    settings = pool.vllm
    running = settings.max_num_seqs * settings.data_parallel_size * most_backends(pool)
    return Target(
        max_input_tokens=lane.max_prompt_tokens or settings.max_model_len,
        max_output_tokens=lane.max_output_tokens or settings.max_model_len,
        concurrency=lane.max_in_flight or running,
    )


def most_backends(pool: PoolConfig) -> int:
    """The most servers the router sends the pool's requests to: those listed, or, for a pool
    found by DNS, its `max_backends`."""
    return len(pool.backends) if pool.discovery is None else pool.discovery.max_backends


def live_records(records: Iterable[CapacityEvidenceRecord]) -> list[CapacityEvidenceRecord]:
    """The records no other record supersedes, newest measurement first."""
    pool = list(records)
    superseded = {r.supersedes for r in pool if r.supersedes is not None}
    live = [r for r in pool if r.record_id not in superseded]
    return sorted(live, key=lambda r: (r.measured_at, r.record_id), reverse=True)


def select_record(
    records: Iterable[CapacityEvidenceRecord],
    current: ServingConfiguration,
    target: Target | None = None,
) -> CapacityEvidenceRecord | None:
    """The record to judge `current` by.

    Among live records with the current configuration hash, the newest whose measured slice
    covers `target` (several lanes of one pool may each have their own), else the newest of them;
    failing that, the record of the same served model that fires the fewest retest triggers (the
    newest of those), so the decision names what changed since this pool's own last measurement
    rather than how it differs from another pool of the same model; else none.
    """
    live = live_records(records)
    matching = [
        r for r in live if r.identity.server_configuration_hash == current.identity.server_configuration_hash
    ]
    if target is not None:
        covering = [r for r in matching if not slice_triggers(r.measured_slice, target)]
        if covering:
            return covering[0]
    if matching:
        return matching[0]
    same_model = [r for r in live if r.identity.served_model_name == current.identity.served_model_name]
    # `min` keeps the first of equals: `live` is newest first.
    return min(same_model, key=lambda r: len(retest_triggers(r, current, target)), default=None)


def decide_profile(
    cfg: ProfileConfig,
    store: Iterable[CapacityEvidenceRecord],
    slo: SloTargets,
    targets: Mapping[RequestClass, Target] | None = None,
) -> dict[RequestClass, Decision]:
    """A decision per lane of `cfg`; `targets` overrides the target derived from a lane."""
    records = list(store)
    decisions: dict[RequestClass, Decision] = {}
    for cls, lane in cfg.lanes.items():
        pool = cfg.pools[lane.pool]
        target = (targets or {}).get(cls) or lane_target(lane, pool)
        decisions[cls] = decide_lane(records, pool, target, slo)
    return decisions


def decide_lane(
    records: list[CapacityEvidenceRecord], pool: PoolConfig, target: Target, slo: SloTargets
) -> Decision:
    """The decision on a lane of `pool` whose requests reach `target`."""
    current = serving_configuration(pool)
    record = select_record(records, current, target)
    return no_evidence() if record is None else decide(record, target, current, slo)
