"""What `lane-router check --workers N` says about processes: each one's part of every limit it
enforces without shared state, and where a part is 0."""

from __future__ import annotations

from router.config.checks import budget_warnings
from router.config.models import ProfileConfig
from router.state.slots.budget import budgets


def budget_lines(cfg: ProfileConfig, workers: int) -> str:
    """The parts table and its warnings; empty for a profile served by one process."""
    if workers * cfg.replicas == 1:
        return ""
    table = budgets(cfg, workers)
    lines = ["processes: " + _processes(cfg, workers)]
    if table:
        width = max(len(b.path) for b in table)
        head = "worker " + " / ".join(str(i) for i in range(workers))
        lines.append(f"  {'limit':<{width}} {'whole':>5}   {head}")
        for b in table:
            parts = " / ".join(str(p) for p in b.parts)
            lines.append(f"  {b.path:<{width}} {b.limit:>5}   {parts}")
    else:
        lines.append("  (no lane or prefill limit to split)")
    warnings = budget_warnings(cfg, workers)
    if warnings:
        lines.append("warnings:")
        lines += [f"  {w}" for w in warnings]
    return "\n".join(lines)


def _processes(cfg: ProfileConfig, workers: int) -> str:
    count = f"{workers} worker{'s' if workers > 1 else ''}"
    if cfg.replicas > 1:
        count += f" in each of {cfg.replicas} replicas (a replica's parts are of limit // {cfg.replicas})"
    if cfg.state.shared:
        return (
            f"{count}; with state: all count against the whole limits in Redis, each against its "
            "part below while Redis is unreachable (a lane's part less what the others held beyond "
            "theirs at its last look)"
        )
    return f"{count}; without state: each enforces its part below"
