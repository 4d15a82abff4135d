"""The `lane-router` command line: one parser, each subcommand defined beside the code it runs."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

# Each module exposes `register(subparsers)`; it adds its subcommand(s) and sets `func`,
# a callable taking the parsed namespace and returning the exit code.
COMMAND_MODULES: tuple[str, ...] = (
    "router.commands",
    "router.bench.cli",
    "router.evidence.cli",
    "router.sim.cli",
    "router.deploy.cli",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lane-router",
        description="Class-aware routing reverse proxy for vLLM pools, and the lab that proves a profile.",
    )
    from router import __version__

    parser.add_argument("--version", action="version", version=f"lane-router {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
