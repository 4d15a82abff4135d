"""The peers run as one markdown table: a column per target (direct last), a row per measured
quantity, and the machine's load average beside it. A target that did not run says why in each
of its cells; direct, measured at the start and again at the end, shows both values."""

from __future__ import annotations

from collections.abc import Callable

from router.lab.bench.peers.harness import Run
from router.lab.bench.peers.scenarios import SCENARIOS, Measure, TargetResult

DIRECT = "direct"
Cell = Callable[[Measure], str]


def _num(value: float | None, digits: int = 0) -> str:
    return "—" if value is None else f"{value:,.{digits}f}"


def _ttft_base(directs: list[TargetResult]) -> tuple[float, float] | None:
    """Mean TTFT p50 and p99 of the direct paced runs: the base of the added TTFT."""
    pairs = []
    for result in directs:
        measure = result.measures.get("paced")
        if measure and measure.load.ttft_p50_ms is not None and measure.load.ttft_p99_ms is not None:
            pairs.append((measure.load.ttft_p50_ms, measure.load.ttft_p99_ms))
    if not pairs:
        return None
    return sum(p for p, _ in pairs) / len(pairs), sum(q for _, q in pairs) / len(pairs)


def _rows(base: tuple[float, float] | None) -> list[tuple[str, str, Cell, Cell]]:
    """(scenario, row label, proxy cell, direct cell) for each row of the table."""

    def added(m: Measure) -> str:
        p50, p99 = m.load.ttft_p50_ms, m.load.ttft_p99_ms
        if p50 is None or p99 is None:
            return "—"
        if base is None:
            return f"{p50:.1f} / {p99:.1f}"
        return f"{p50 - base[0]:+.1f} / {p99 - base[1]:+.1f}"

    ttft = "added TTFT p50 / p99 vs direct (ms)" if base else "TTFT p50 / p99 (ms)"
    return [
        (
            "nonstream",
            f"1 {SCENARIOS['nonstream'].title}: proxy CPU µs/request (req/s)",
            lambda m: f"{_num(m.us_per_request)} ({_num(m.req_s)}/s)",
            lambda m: f"— ({_num(m.req_s)}/s)",
        ),
        (
            "stream",
            f"2 {SCENARIOS['stream'].title}: proxy CPU µs/chunk (chunks/s)",
            lambda m: f"{_num(m.us_per_chunk, 1)} ({_num(m.chunks_s)}/s)",
            lambda m: f"— ({_num(m.chunks_s)}/s)",
        ),
        (
            "paced",
            f"3 {SCENARIOS['paced'].title}: proxy core % @ chunks/s; CPU µs/chunk",
            lambda m: f"{_num(m.core_pct, 1)} % @ {_num(m.chunks_s)}/s; {_num(m.us_per_chunk, 1)} µs",
            lambda m: f"— @ {_num(m.chunks_s)}/s",
        ),
        (
            "paced",
            f"4 same: {ttft}",
            added,
            lambda m: f"{_num(m.load.ttft_p50_ms, 1)} / {_num(m.load.ttft_p99_ms, 1)}",
        ),
    ]


def table(run: Run) -> str:
    proxies = [r for r in run.results if r.label != DIRECT]
    directs = [r for r in run.results if r.label == DIRECT]
    labels = [r.label for r in proxies] + ([DIRECT] if directs else [])
    lines = ["| scenario | " + " | ".join(labels) + " |", "|---" + "|---:" * len(labels) + "|"]
    ran = {name for r in run.results for name in r.measures}
    for scenario, label, proxy_cell, direct_cell in _rows(_ttft_base(directs)):
        if scenario not in ran:
            continue
        cells = [_cell(r, scenario, proxy_cell) for r in proxies]
        if directs:
            cells.append(" ; ".join(_cell(r, scenario, direct_cell) for r in directs))
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _cell(result: TargetResult, scenario: str, cell: Cell) -> str:
    measure = result.measures.get(scenario)
    if measure is not None:
        return cell(measure)
    return result.missing or "—"


def notes(run: Run) -> list[str]:
    """Load averages (run and each target) and every error, under the table."""
    out = [f"Load average (1/5/15 min): {run.load_start} at the start, {run.load_end} at the end."]
    spans = [f"{r.label} {r.load_before} → {r.load_after}" for r in run.results if r.load_before]
    if spans:
        out.append("Per target: " + "; ".join(spans) + ".")
    problems = [
        f"{r.label} {name}: {m.load.errors} errors, {m.load.bad_counts} streams with a wrong token count"
        for r in run.results
        for name, m in r.measures.items()
        if m.load.errors or m.load.bad_counts
    ]
    out.append(
        "Errors: " + ("; ".join(problems) if problems else "none (every stream delivered every token).")
    )
    return out


def render(run: Run, header: list[str]) -> str:
    return "\n".join([*header, "", table(run), "", *notes(run)])
