"""Evidence as a gate on a profile: the per-lane decisions `check --evidence` prints and
`serve --require-evidence` insists on before the router starts."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from router.config.lanemap import lane_plan
from router.config.models import ProfileConfig, RequestClass
from router.evidence.decide import Decision, FinalDecision
from router.evidence.profile import decide_lane, lane_target
from router.evidence.render import render_table
from router.evidence.store import load_records
from router.evidence.targets import SloTargets, Target


@dataclass(frozen=True, slots=True)
class LaneVerdict:
    cls: RequestClass
    pool: str
    target: Target
    decision: Decision
    lane: str  # its name (router/config/lanemap.py)


def lane_verdicts(cfg: ProfileConfig, evidence: Path, slo: SloTargets) -> list[LaneVerdict]:
    """A verdict on every lane of every model of `cfg`."""
    records = list(load_records(evidence))
    verdicts: list[LaneVerdict] = []
    for planned in lane_plan(cfg):
        pool = cfg.pools[planned.config.pool]
        target = lane_target(planned.config, pool)
        decision = decide_lane(records, pool, target, slo)
        verdicts.append(
            LaneVerdict(
                cls=planned.cls, pool=planned.config.pool, target=target, decision=decision, lane=planned.name
            )
        )
    return verdicts


def admitted(verdicts: list[LaneVerdict], *, allow_conditional: bool) -> bool:
    accepted = {FinalDecision.PASS} | ({FinalDecision.CONDITIONAL} if allow_conditional else set())
    return all(v.decision.final_decision in accepted for v in verdicts)


def verdict_table(verdicts: list[LaneVerdict]) -> str:
    """One row per lane, then what keeps any lane's provenance incomplete, once per problem."""
    header = ("lane", "pool", "target", "decision", "reason", "retest triggers", "slo missed", "record")
    rows = [
        (
            v.lane,
            v.pool,
            f"in≤{v.target.max_input_tokens} out≤{v.target.max_output_tokens} c≤{v.target.concurrency}",
            v.decision.final_decision.value,
            v.decision.reason_class.value,
            ",".join(t.value for t in v.decision.triggers) or "-",
            ",".join(m.value for m in v.decision.slo_misses) or "-",
            (v.decision.record_id or "-").removeprefix("sha256:")[:12],
        )
        for v in verdicts
    ]
    return "\n".join([render_table(header, rows), *gap_notes(verdicts)])


def gap_notes(verdicts: list[LaneVerdict]) -> list[str]:
    lanes: dict[str, list[str]] = {}
    for v in verdicts:
        for gap in v.decision.provenance_gaps:
            lanes.setdefault(gap.message, []).append(v.lane)
    return [f"{', '.join(names)}: {message}" for message, names in lanes.items()]
