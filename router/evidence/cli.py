"""`lane-router evidence show | decide | diff`: read records, judge a lane, compare two records.

The read-only half of the evidence commands, what an operator runs beside `serve`; measuring
(`bench run --evidence`) and the worked example (`evidence example`) are the lab's.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from types import MappingProxyType

from pydantic import ValidationError

from router.config.lanemap import lane_plan
from router.config.load import ConfigError, load_profile
from router.config.models import LaneConfig, ProfileConfig, RequestClass
from router.evidence.decide import FinalDecision, decide
from router.evidence.diff import changed_fields, transfer_triggers
from router.evidence.identity import serving_configuration
from router.evidence.profile import lane_target
from router.evidence.reading import validation_problems
from router.evidence.records import EvidenceError, dump_record, validated_mix
from router.evidence.render import SHOW_HEADER, cell, decision_rows, render_table, summary_row
from router.evidence.store import load_records, read_record
from router.evidence.targets import SloTargets, Target
from router.evidence.triggers import CLASS_MIX_TOLERANCE

EXIT_CODES: Mapping[FinalDecision, int] = MappingProxyType(
    {FinalDecision.PASS: 0, FinalDecision.CONDITIONAL: 1, FinalDecision.DEFER: 3}
)
EXIT_UNUSABLE = 2
DECIDE_EPILOG = (
    "exit status: 0 PASS, 1 CONDITIONAL (passes, but the record has no security boundary note), "
    "2 unusable input (unreadable, tampered or inconsistent record, bad profile, --slo or "
    "--class-mix), 3 DEFER"
)


def configure(name: str, parser: argparse.ArgumentParser) -> None:
    """The arguments of `evidence show`, `decide` or `diff` (router/cli.py runs the one named)."""
    {"show": _show_arguments, "decide": _decide_arguments, "diff": _diff_arguments}[name](parser)


def _show_arguments(show: argparse.ArgumentParser) -> None:
    show.add_argument("path", metavar="FILE|DIR")
    show.add_argument("--json", action="store_true", help="print the records as JSON")
    show.set_defaults(func=run_show)


def _decide_arguments(judge: argparse.ArgumentParser) -> None:
    judge.epilog = DECIDE_EPILOG
    judge.add_argument("--record", required=True, metavar="FILE")
    judge.add_argument("--config", required=True, metavar="PROFILE.yaml")
    judge.add_argument(
        "--lane",
        required=True,
        metavar="LANE",
        help="the lane's name: its class, or MODEL:CLASS (as `check` prints)",
    )
    judge.add_argument(
        "--concurrency",
        type=positive_int,
        metavar="N",
        help="requests in flight (default: the lane's max_in_flight)",
    )
    judge.add_argument(
        "--max-input",
        type=positive_int,
        metavar="T",
        help="prompt tokens (default: the lane's max_prompt_tokens)",
    )
    judge.add_argument(
        "--max-output",
        type=positive_int,
        metavar="T",
        help="output tokens (default: the lane's max_output_tokens)",
    )
    judge.add_argument(
        "--class-mix",
        metavar="CLASS=SHARE,...",
        help="the class mix the lane must carry, e.g. chat=0.6,rag=0.4 (shares add up to 1); the "
        "record must have measured every class in it, within a total variation distance of "
        f"{CLASS_MIX_TOLERANCE:g} (default: no mix required)",
    )
    judge.add_argument(
        "--slo",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help=f"override an SLO target ({', '.join(SloTargets.model_fields)}); VALUE 'none' drops the bound",
    )
    judge.set_defaults(func=run_decide)


def _diff_arguments(compare: argparse.ArgumentParser) -> None:
    compare.epilog = "exit status: 0 same content, 1 records differ, 2 unusable input"
    compare.add_argument("a", metavar="A")
    compare.add_argument("b", metavar="B")
    compare.set_defaults(func=run_diff)


def run_show(args: argparse.Namespace) -> int:
    try:
        records = load_records(args.path)
    except EvidenceError as exc:
        return unusable(str(exc))
    if args.json:
        for record in records:
            sys.stdout.write(dump_record(record).decode())
        return 0
    rows = [summary_row(r) for r in records]
    print(render_table(SHOW_HEADER, rows))
    return 0


def run_decide(args: argparse.Namespace) -> int:
    try:
        record = read_record(args.record)
        cfg = load_profile(args.config)
        slo = parse_slo(args.slo)
        lane = _lane_named(cfg, args.lane)
        pool = cfg.pools[lane.pool]
        target = _with_overrides(lane_target(lane, pool), args)
    except (EvidenceError, ConfigError, ValueError) as exc:
        return unusable(str(exc))
    decision = decide(record, target, serving_configuration(pool), slo)
    print(render_table(("field", "value"), decision_rows(decision, target)))
    return EXIT_CODES[decision.final_decision]


def _lane_named(cfg: ProfileConfig, name: str) -> LaneConfig:
    lanes = {planned.name: planned.config for planned in lane_plan(cfg)}
    lane = lanes.get(name)
    if lane is None:
        raise ValueError(f"no lane {name!r} in the profile (lanes: {', '.join(lanes)})")
    return lane


def run_diff(args: argparse.Namespace) -> int:
    try:
        a, b = read_record(args.a), read_record(args.b)
    except EvidenceError as exc:
        return unusable(str(exc))
    changes = changed_fields(a, b)
    rows = [(c.path, cell(c.before), cell(c.after)) for c in changes]
    print(render_table(("field", "A", "B"), rows) if rows else "no field differs")
    fired = transfer_triggers(a, b)
    print("retest triggers (A's evidence for B): " + (", ".join(fired) or "none"))
    return 1 if changes else 0


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be ≥ 1, got {value}")
    return value


def parse_slo(pairs: Sequence[str]) -> SloTargets:
    values: dict[str, str | None] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or key not in SloTargets.model_fields:
            raise ValueError(
                f"--slo {pair!r}: expected KEY=VALUE, KEY one of " + ", ".join(SloTargets.model_fields)
            )
        values[key] = None if value.strip().lower() == "none" else value
    try:
        return SloTargets.model_validate(values)
    except ValidationError as exc:
        raise ValueError(f"--slo: {validation_problems(exc)}") from None


def parse_class_mix(text: str | None) -> Mapping[RequestClass, float] | None:
    """`chat=0.6,rag=0.4` as a class mix (None: no mix required); `ValueError` naming the problem."""
    if text is None:
        return None
    mix: dict[RequestClass, float] = {}
    for pair in text.split(","):
        name, _, share = pair.partition("=")
        try:
            cls, value = RequestClass(name.strip()), float(share)
        except ValueError:
            raise ValueError(
                f"--class-mix {pair!r}: expected CLASS=SHARE, CLASS one of "
                + ", ".join(c.value for c in RequestClass)
            ) from None
        if cls in mix:
            raise ValueError(f"--class-mix: {cls.value} is given twice")
        mix[cls] = value
    try:
        return validated_mix(mix)
    except ValueError as exc:
        raise ValueError(f"--class-mix: {exc}") from None


def _with_overrides(target: Target, args: argparse.Namespace) -> Target:
    return Target(
        max_input_tokens=args.max_input or target.max_input_tokens,
        max_output_tokens=args.max_output or target.max_output_tokens,
        concurrency=args.concurrency or target.concurrency,
        class_mix=parse_class_mix(args.class_mix),
    )


def unusable(message: str) -> int:
    print(f"lane-router evidence: {message}", file=sys.stderr)
    return EXIT_UNUSABLE
