"""Plain-text tables of records and decisions, for `evidence show | decide | diff` and the gate."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from router.evidence.decide import Decision
from router.evidence.records import CapacityEvidenceRecord
from router.evidence.targets import Target


def decision_rows(decision: Decision, target: Target) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = list(decision.fields())
    rows += [
        ("record_id", decision.record_id or "-"),
        ("triggers", ", ".join(decision.triggers) or "-"),
        ("slo_misses", ", ".join(decision.slo_misses) or "-"),
        ("provenance_gaps", "; ".join(gap.message for gap in decision.provenance_gaps) or "-"),
        ("target", target_text(target)),
    ]
    return rows


SHOW_HEADER = (
    "record",
    "measured_at",
    "model",
    "config",
    "vllm",
    "hardware",
    "tp/pp/dp",
    "max_len",
    "seqs",
    "batched",
    "warmup",
    "slice",
    "p95_ttft",
    "p95_itl",
    "p95_e2e",
    "tok/s",
    "err/timeout",
    "note",
    "supersedes",
)


def summary_row(r: CapacityEvidenceRecord) -> tuple[str, ...]:
    knobs, sl, m = r.context.knobs, r.measured_slice, r.measurements
    return (
        short(r.record_id),
        r.measured_at.strftime("%Y-%m-%dT%H:%M:%SZ"),
        r.identity.served_model_name,
        short(r.identity.server_configuration_hash),
        r.identity.vllm_version or "?",
        r.identity.hardware_profile or "?",
        f"{knobs.tensor_parallel_size}/{knobs.pipeline_parallel_size}/{knobs.data_parallel_size}",
        str(knobs.max_model_len),
        str(knobs.max_num_seqs),
        str(knobs.max_num_batched_tokens),
        r.context.warmup.value,
        f"in≤{sl.input_tokens.max} out≤{sl.output_tokens.max} c≤{sl.concurrency}",
        f"{m.ttft.p95_ms:.0f}",
        f"{m.itl.p95_ms:.1f}",
        f"{m.e2e.p95_ms:.0f}",
        f"{m.output_tokens_per_s:.0f}",
        f"{m.error_count}/{m.timeout_count}",
        "yes" if r.security_boundary_note and r.security_boundary_note.strip() else "no",
        short(r.supersedes),
    )


def render_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(row[i]) for row in (header, *rows)) for i in range(len(header))]
    lines = [
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in (header, *rows)
    ]
    return "\n".join(lines)


def target_text(t: Target) -> str:
    text = f"in≤{t.max_input_tokens} out≤{t.max_output_tokens} concurrency {t.concurrency}"
    if t.class_mix is None:
        return text
    return text + " mix " + ",".join(f"{cls.value}={share:g}" for cls, share in t.class_mix.items())


def short(digest: str | None) -> str:
    return digest.removeprefix("sha256:")[:12] if digest else "-"


def cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"  # measured values: beyond six digits is noise
    return "-" if value is None else str(value)
