"""The router's own subcommands: `serve`, `check` and `hash-key`."""

from __future__ import annotations

import argparse
import getpass
import logging
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from router.config.lanemap import lane_plan, served_models
from router.config.load import ConfigError, load_profile
from router.config.models import PoolConfig, ProfileConfig
from router.config.vllm import server_configuration_hash
from router.evidence.records import EvidenceError
from router.keys.auth import hash_key, new_key
from router.keys.hygiene import is_loopback, key_issues, refusal, warning
from router.request.tokenizer_source import TokenizerNotFound
from router.state.counters import counting_lines, tokenizer_sources
from router.state.slots.report import budget_lines


def configure(name: str, parser: argparse.ArgumentParser) -> None:
    """The arguments of `serve`, `check` or `hash-key` (router/cli.py runs the one named)."""
    {"serve": _serve_arguments, "check": _check_arguments, "hash-key": _hash_key_arguments}[name](parser)


def _serve_arguments(serve: argparse.ArgumentParser) -> None:
    serve.description = "Run the router in front of the pools of a profile."
    serve.add_argument("--config", type=Path, help="profile file (default: $LANE_ROUTER_CONFIG)")
    serve.add_argument("--host", help="listen address (default: $LANE_ROUTER_HOST or 127.0.0.1)")
    serve.add_argument("--port", type=int, help="listen port (default: $LANE_ROUTER_PORT or 8080)")
    serve.add_argument("--log-level", choices=["debug", "info", "warning", "error"])
    tls = serve.add_argument_group("TLS", "serve HTTPS; the files are re-read on SIGHUP")
    tls.add_argument(
        "--tls-cert", type=Path, metavar="FILE", help="PEM certificate chain (default: $LANE_ROUTER_TLS_CERT)"
    )
    tls.add_argument(
        "--tls-key", type=Path, metavar="FILE", help="PEM private key (default: $LANE_ROUTER_TLS_KEY)"
    )
    tls.add_argument(
        "--tls-client-ca",
        type=Path,
        metavar="FILE",
        help="require client certificates signed by this PEM CA bundle, mTLS "
        "(default: $LANE_ROUTER_TLS_CLIENT_CA)",
    )
    _workers_option(serve, "worker processes sharing the port (default: $LANE_ROUTER_WORKERS or 1)")
    serve.add_argument(
        "--access-log",
        metavar="PATH|-",
        help='one JSON line per proxied request, appended to PATH or written to stderr with "-" '
        "(default: $LANE_ROUTER_ACCESS_LOG_FILE, else none)",
    )
    serve.add_argument(
        "--require-evidence",
        type=Path,
        metavar="DIR",
        help="refuse to start unless every lane's capacity evidence in DIR decides PASS",
    )
    serve.add_argument(
        "--allow-conditional",
        action="store_true",
        help="with --require-evidence: also admit CONDITIONAL (e.g. no security boundary note)",
    )
    _slo_option(serve)
    serve.set_defaults(func=cmd_serve)


def _check_arguments(check: argparse.ArgumentParser) -> None:
    check.description = (
        "Validate a profile file. Exit 0 when valid; 2 with every problem and its path. "
        "With --evidence, the worst lane's decision sets the exit status: 0 PASS, 1 CONDITIONAL, 3 DEFER; "
        "evidence that cannot be used (a missing store, an unreadable, tampered or inconsistent record) "
        "is exit 2."
    )
    check.add_argument("file", type=Path, nargs="?", help="the profile (or --config FILE)")
    check.add_argument("--config", type=Path, metavar="FILE", help="the profile, as serve takes it")
    check.add_argument(
        "--evidence",
        type=Path,
        metavar="DIR",
        help="also print, per lane, the capacity-evidence decision for the lane's target",
    )
    _workers_option(check, "print each worker's part of the limits, for `serve --workers N` (default 1)")
    _slo_option(check)
    check.set_defaults(func=cmd_check)


def _hash_key_arguments(hk: argparse.ArgumentParser) -> None:
    hk.description = (
        "Print the sha256 of an API key (read from the argument, or from stdin/prompt). "
        "With --new, make a fresh random key and print it with its hash."
    )
    hk.add_argument("key", nargs="?", help="the key (omit to read it from stdin, safer than argv)")
    hk.add_argument("--new", action="store_true", help="generate a new random key")
    hk.set_defaults(func=cmd_hash_key)


def _workers_option(parser: argparse.ArgumentParser, help: str) -> None:
    parser.add_argument("--workers", type=int, metavar="N", help=help)


def _slo_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--slo",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="SLO bound the evidence must meet, e.g. p95_ttft_ms=1000 (see `evidence decide -h`)",
    )


@dataclass(frozen=True, slots=True)
class _Gate:
    table: str
    admitted: bool  # every lane PASS (or CONDITIONAL, when allowed)
    exit_code: int  # the worst lane's, as `evidence decide` exits: 0 PASS, 1 CONDITIONAL, 3 DEFER


def _evidence_gate(cfg: ProfileConfig, args: argparse.Namespace, directory: Path) -> _Gate:
    """The lanes' decisions on the records in `directory`.

    Raises `EvidenceError` when the evidence cannot be used (no store, an unreadable, tampered or
    inconsistent record) and `ValueError` for a bad `--slo`: both refuse with exit 2, never with a
    decision's exit status.
    """
    from router.evidence.cli import EXIT_CODES, parse_slo
    from router.evidence.verdicts import admitted, lane_verdicts, verdict_table

    verdicts = lane_verdicts(cfg, directory, parse_slo(args.slo))
    allow = getattr(args, "allow_conditional", False)
    worst = max((EXIT_CODES[v.decision.final_decision] for v in verdicts), default=0)
    return _Gate(verdict_table(verdicts), admitted(verdicts, allow_conditional=allow), worst)


def cmd_serve(args: argparse.Namespace) -> int:
    from router.server import serve
    from router.settings import Settings

    overrides = {
        k: v
        for k, v in (
            ("config", args.config),
            ("host", args.host),
            ("port", args.port),
            ("log_level", args.log_level),
            ("workers", args.workers),
            ("tls_cert", args.tls_cert),
            ("tls_key", args.tls_key),
            ("tls_client_ca", args.tls_client_ca),
            ("access_log_file", args.access_log),
        )
        if v is not None
    }
    try:
        settings = Settings(**overrides)
    except ValueError as err:
        print(f"lane-router serve: {err}", file=sys.stderr)
        return 2
    if args.require_evidence is not None:
        refused = _refuse_without_evidence(settings.config, args)
        if refused is not None:
            return refused
    who = "" if settings.worker_index is None else f"worker {settings.worker_index} "
    logging.basicConfig(
        level=settings.log_level.upper(), format=f"%(asctime)s %(levelname)s {who}%(name)s: %(message)s"
    )
    try:
        cfg = load_profile(settings.config) if settings.config is not None else None
        if cfg is not None and _refuse_guessable_keys(cfg, settings.host):
            return 2
        return serve(settings, cfg)
    except ConfigError as err:
        print(err, file=sys.stderr)
        return 2
    except ValueError as err:
        print(f"lane-router serve: {err}", file=sys.stderr)
        return 2


def _refuse_guessable_keys(cfg: ProfileConfig, host: str) -> bool:
    """Whether a key anyone can use forbids listening on `host`; on loopback it is only a warning.
    `sha256_env` keys are checked on the environment `serve` builds them from."""
    issues = key_issues(cfg.keys, os.environ)
    if not issues:
        return False
    if is_loopback(host):
        logging.getLogger("lane_router.keys").warning(warning(issues))
        return False
    refused = f"to listen on {host!r}, beyond loopback (bind 127.0.0.1 for a local trial)"
    print(refusal("lane-router serve", refused, issues), file=sys.stderr)
    return True


def _refuse_without_evidence(config: Path | None, args: argparse.Namespace) -> int | None:
    if config is None:
        print("lane-router serve: --require-evidence needs a profile file (--config)", file=sys.stderr)
        return 2
    try:
        gate = _evidence_gate(load_profile(config), args, args.require_evidence)
    except (ConfigError, EvidenceError, ValueError, OSError) as err:
        print(f"lane-router serve: {err}", file=sys.stderr)
        return 2
    if gate.admitted:
        print(gate.table)
        return None
    wanted = "PASS or CONDITIONAL" if args.allow_conditional else "PASS"
    print(
        f"lane-router serve: refusing to start: every lane must be {wanted} on the evidence in "
        f"{args.require_evidence}\n{gate.table}",
        file=sys.stderr,
    )
    return 3


def cmd_check(args: argparse.Namespace) -> int:
    if (args.file is None) == (args.config is None):
        print("lane-router check: give the profile once: FILE or --config FILE", file=sys.stderr)
        return 2
    try:
        cfg = load_profile(args.file if args.file is not None else args.config)
    except ConfigError as err:
        print(err, file=sys.stderr)
        return 2
    print(describe(cfg))
    try:
        sources = tokenizer_sources(cfg, os.environ)
    except TokenizerNotFound as err:  # gone since the profile was checked
        print(f"lane-router check: {err}", file=sys.stderr)
        return 2
    print("\nprompt counts:\n" + "\n".join(counting_lines(sources)))
    workers = args.workers or 1
    if workers < 1:
        print("lane-router check: --workers must be at least 1", file=sys.stderr)
        return 2
    parts = budget_lines(cfg, workers)
    if parts:
        print("\n" + parts)
    if args.evidence is None:
        return 0
    try:
        gate = _evidence_gate(cfg, args, args.evidence)
    except (EvidenceError, ValueError, OSError) as err:
        print(f"lane-router check: {err}", file=sys.stderr)
        return 2
    print("\nevidence:\n" + gate.table)
    return gate.exit_code


def describe(cfg: ProfileConfig) -> str:
    lines = [f"profile: {cfg.profile}  (valid)", ""]
    if len(cfg.pools) == 1:
        (only,) = cfg.pools
        lines += [f"one pool, {only!r}: every request class goes to it", ""]
    lines += _route_table(cfg)
    lines += ["", "pools:"]
    for name, pool in cfg.pools.items():
        v = pool.vllm
        lines.append(f"  {name}: model={pool.model} vllm={v.version}")
        lines.append(f"    backends: {_backends_source(pool)}")
        if pool.uses_tls:
            lines.append(f"    tls: {_tls_summary(pool)}")
        lines.append(
            f"    max_model_len={v.max_model_len} max_num_batched_tokens={v.max_num_batched_tokens} "
            f"max_num_seqs={v.max_num_seqs} long_prefill_token_threshold={v.long_prefill_token_threshold} "
            f"stream_interval={v.stream_interval} prefix_caching={v.enable_prefix_caching}"
        )
        adm = pool.admission
        if adm.max_prefilling is not None:
            lines.append(
                f"    admission: max_prefilling={adm.max_prefilling} "
                f"max_long_prefilling={adm.max_long_prefilling}"
            )
        lines.append(f"    server_configuration_hash={server_configuration_hash(v, pool.model)}")
    lines += ["", f"keys: {len(cfg.keys)}"]
    return "\n".join(lines)


def _route_table(cfg: ProfileConfig) -> list[str]:
    """Each served model's names and pools, then its (model, class) → lane → pool rows."""
    served = served_models(cfg)
    lines = ["models:"]
    for model, pools in served.items():
        names = [f"{n} (alias)" for p in pools for n in cfg.pools[p].aliases]
        names += [f"{n} (adapter)" for p in pools for n in cfg.pools[p].adapters]
        also = f", also as {', '.join(dict.fromkeys(names))}" if names else ""
        lines.append(f"  {model}: pools {', '.join(pools)}{also}")
    plan = lane_plan(cfg)
    mw = max(len("model"), *(len(p.model) for p in plan))
    lw = max(len("lane"), *(len(p.name) for p in plan))
    pw = max(len("pool"), *(len(p.config.pool) for p in plan))
    lines += ["", "routes: (model, class) → lane → pool"]
    head = f"  {'model':<{mw}} {'class':<13} {'lane':<{lw}} {'pool':<{pw}} {'balance':<18} {'priority':>8}"
    lines.append(head + f" {'max_in_flight':>13}")
    for p in plan:
        lane = p.config
        mif = lane.max_in_flight if lane.max_in_flight is not None else "-"
        lines.append(
            f"  {p.model:<{mw}} {p.cls.value:<13} {p.name:<{lw}} {lane.pool:<{pw}} "
            f"{lane.balance.strategy:<18} {lane.priority:>8} {mif!s:>13}"
        )
    return lines


def _backends_source(pool: PoolConfig) -> str:
    found = pool.discovery
    if found is None:
        return f"{len(pool.backends)} listed"
    via = f" via {', '.join(found.nameservers)}" if found.nameservers else ""
    return f"dns {found.dns}:{found.port} every {found.interval_s:g}s, at most {found.max_backends}{via}"


def _tls_summary(pool: PoolConfig) -> str:
    tls = pool.tls
    name = tls.server_name if tls is not None else None
    if name is None and pool.discovery is not None:
        name = pool.discovery.dns.rstrip(".")
    parts = [f"verify against {tls.ca_file if tls is not None and tls.ca_file else 'the system CAs'}"]
    parts.append(f"name {name}" if name else "name from each backend's URL")
    if tls is not None and tls.client_cert_file is not None:
        parts.append(f"client certificate {tls.client_cert_file}")
    return ", ".join(parts)


def cmd_hash_key(args: argparse.Namespace) -> int:
    if args.new:
        key = new_key()
        print(f"key:    {key}")
        print(f"sha256: {hash_key(key)}")
        return 0
    key = args.key
    if key is None:
        key = getpass.getpass("API key: ") if sys.stdin.isatty() else sys.stdin.readline().strip()
    if not key:
        print("lane-router hash-key: empty key", file=sys.stderr)
        return 2
    print(hash_key(key))
    return 0
