"""The peers run as one markdown table: a column per target (direct last), a row per measured
quantity, the machine's load average beside it, and each lane-router tree's CPU as a ratio to
vLLM Router's, over the run and round by round. A target that did not run says why in each of
its cells."""

from __future__ import annotations

import statistics
from collections.abc import Callable

from router.lab.bench.peers.harness import Run
from router.lab.bench.peers.scenarios import SCENARIOS, Measure, TargetResult, combined

DIRECT = "direct"
REFERENCE = "vLLM Router"
Cell = Callable[[Measure], str]
# What a ratio compares in each scenario: CPU per request, per chunk.
_PER_UNIT: dict[str, tuple[str, Callable[[Measure], float | None]]] = {
    "nonstream": ("non-streamed", lambda m: m.us_per_request),
    "stream": ("zero-delay", lambda m: m.us_per_chunk),
    "paced": ("paced", lambda m: m.us_per_chunk),
}


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
            f"1 {SCENARIOS['nonstream'].title}: proxy CPU µs/request (of which user; req/s)",
            lambda m: f"{_num(m.us_per_request)} ({_num(m.user_us_per_request)}; {_num(m.req_s)}/s)",
            lambda m: f"— ({_num(m.req_s)}/s)",
        ),
        (
            "stream",
            f"2 {SCENARIOS['stream'].title}: proxy CPU µs/chunk (of which user; chunks/s)",
            lambda m: f"{_num(m.us_per_chunk, 1)} ({_num(m.user_us_per_chunk, 1)}; {_num(m.chunks_s)}/s)",
            lambda m: f"— ({_num(m.chunks_s)}/s)",
        ),
        (
            "paced",
            f"3 {SCENARIOS['paced'].title}: proxy core % @ chunks/s; CPU µs/chunk (of which user)",
            lambda m: (
                f"{_num(m.core_pct, 1)} % @ {_num(m.chunks_s)}/s; {_num(m.us_per_chunk, 1)} µs "
                f"({_num(m.user_us_per_chunk, 1)})"
            ),
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
    """The run's load averages and every error, under the table."""
    out = [f"Load average (1/5/15 min): {run.load_start} at the start, {run.load_end} at the end."]
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


def ratios(run: Run, reference: str = REFERENCE) -> list[str]:
    """Each lane-router tree's CPU per request or chunk divided by `reference`'s, over all rounds,
    in each round (the two took their turns in the same round) and the median of those, and the
    paced streams' TTFT p50 beside the reference's. Without the reference, trees compared with
    one another (`--lane-router-src` repeated) are each divided by the first."""
    theirs = next((r for r in run.results if r.label == reference and r.rounds), None)
    ours = [r for r in run.results if r.label.startswith("lane-router") and r.rounds]
    if theirs is None and len(ours) > 1:
        theirs, *ours = ours
        reference = theirs.label
    if theirs is None or not ours:
        return []
    lines = []
    for result in ours:
        parts = [_ratio_text(name, result, theirs) for name in _PER_UNIT]
        ttft = _ttft_text(result, theirs)
        text = "; ".join(p for p in [*parts, ttft] if p)
        lines.append(f"{result.label} ÷ {reference}, CPU per request or chunk: {text}.")
    return lines


def _ratio_text(name: str, ours: TargetResult, theirs: TargetResult) -> str:
    title, unit = _PER_UNIT[name]
    a, b = ours.rounds.get(name), theirs.rounds.get(name)
    if not a or not b:
        return ""
    each = [_ratio(unit(x), unit(y)) for x, y in zip(a, b, strict=False)]
    rounds = ", ".join(_num(v, 2) for v in each)
    known = [v for v in each if v is not None]
    median = f"median {statistics.median(known):.2f}; " if known else ""
    return f"{title} {_num(_ratio(unit(combined(a)), unit(combined(b))), 2)} ({median}rounds {rounds})"


def _ttft_text(ours: TargetResult, theirs: TargetResult) -> str:
    a, b = ours.rounds.get("paced"), theirs.rounds.get("paced")
    if not a or not b:
        return ""
    each = [_difference(x.load.ttft_p50_ms, y.load.ttft_p50_ms) for x, y in zip(a, b, strict=False)]
    total = _difference(combined(a).load.ttft_p50_ms, combined(b).load.ttft_p50_ms)
    rounds = ", ".join("—" if v is None else f"{v:+.1f}" for v in each)
    return f"paced TTFT p50 {'—' if total is None else f'{total:+.1f}'} ms (rounds {rounds})"


def _ratio(ours: float | None, theirs: float | None) -> float | None:
    return None if ours is None or not theirs else ours / theirs


def _difference(ours: float | None, theirs: float | None) -> float | None:
    return None if ours is None or theirs is None else ours - theirs


def render(run: Run, header: list[str]) -> str:
    compared = [f"- {line}" for line in ratios(run)]
    return "\n".join([*header, "", table(run), "", *compared, *([""] if compared else []), *notes(run)])
