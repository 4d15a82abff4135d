"""`lane-router bench compare` and `bench plot`: run a comparison (or read one back), then write
report.md, results.json and the plots, and print the side-by-side and capacity tables."""

from __future__ import annotations

from pathlib import Path

from router.lab.bench.compare import CompareSpec, Comparison, run_compare
from router.lab.bench.plots import write_plots
from router.lab.bench.render import capacity_table, report_md, side_by_side
from router.lab.bench.results import merge, read_results, write_results


def write_outputs(c: Comparison, out: Path, plot_rate: float | None) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    write_results(c, out / "results.json")
    plots: list[Path] = []
    try:
        plots = write_plots(c, out, plot_rate)
    except ImportError:
        print("matplotlib is not installed (pip install 'lane-router[lab]'): no plots")
    (out / "report.md").write_text(report_md(c, [p.name for p in plots], c.command), encoding="utf-8")
    return plots


def print_tables(c: Comparison, out: Path, plots: list[Path]) -> None:
    for rate in c.spec.rates:
        print(f"\nat {rate:g} req/s\n")
        print(side_by_side(c, rate))
    print("\n" + capacity_table(c))
    print(
        f"\nreport → {out / 'report.md'}, results → {out / 'results.json'}"
        + (f", plots → {', '.join(str(p) for p in plots)}" if plots else "")
    )


def compare_and_write(spec: CompareSpec, out: Path, plot_rate: float | None, command: str) -> int:
    comparison = run_compare(spec)
    comparison.command = command
    plots = write_outputs(comparison, out, plot_rate)
    print_tables(comparison, out, plots)
    return 0


def replot(results: list[Path], out: Path | None, plot_rate: float | None) -> int:
    """Redraw from results.json files; several are merged into one report."""
    comparison = merge([(path.parent.name, read_results(path)) for path in results])
    out = out or results[0].parent
    plots = write_outputs(comparison, out, plot_rate)
    print_tables(comparison, out, plots)
    return 0
