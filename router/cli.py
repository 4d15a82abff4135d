"""The `lane-router` command line: a static table of subcommands, each loaded only when run.

The table names every subcommand, its one-line help and the module that defines its arguments
and runs it. Parsing goes in two stages: the words of the command line pick the entry (and, for a
group such as `evidence`, its action); only that entry's module is imported and asked to configure
its parser, while every other entry stays a bare name with its help. So `lane-router serve` loads
the proxy alone — never the lab or the deployment renderers — and `lane-router --help` lists every
subcommand without importing any of them.

A module named in the table exposes `configure(name, parser)`: it adds the arguments of its
subcommand `name` to `parser` and sets `func`, a callable taking the parsed namespace and
returning the exit code.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from router import BUILD, __version__


@dataclass(frozen=True, slots=True)
class Command:
    """A subcommand, or with `actions` a group whose next word picks one of them."""

    name: str
    help: str
    module: str = ""
    actions: tuple[Command, ...] = ()


COMMANDS: tuple[Command, ...] = (
    Command("init", "write a starter profile for running vLLM servers, with a key", "router.config.starter"),
    Command("serve", "run the router", "router.commands"),
    Command(
        "check", "validate a profile and print its lanes, pools and configuration hashes", "router.commands"
    ),
    Command("hash-key", "print the sha256 to store in a profile for an API key", "router.commands"),
    Command(
        "evidence",
        "capacity evidence records: show, decide, diff, and the worked example",
        actions=(
            Command("show", "list records of a file or a store directory", "router.evidence.cli"),
            Command("decide", "judge a lane of a profile against a record", "router.evidence.cli"),
            Command(
                "diff",
                "changed fields and the retest triggers A's evidence fires for B",
                "router.evidence.cli",
            ),
            Command(
                "example",
                "the worked example, for real: measure config A on the simulator, gate, change, re-measure",
                "router.lab.evidence.cli",
            ),
        ),
    ),
    Command(
        "render",
        "render a profile as vllm serve commands, a compose file or Kubernetes manifests",
        "router.deploy.cli",
    ),
    Command("sim", "run simulated vLLM servers (or `sim calibrate`, `sim compare`)", "router.lab.sim.cli"),
    Command(
        "bench", "benchmarks (router overhead, the mixed-traffic lab, lane policies)", "router.lab.bench.cli"
    ),
    Command(
        "demo",
        "a one-minute tour: simulated engines, the router, a mixed run, the per-class table",
        "router.lab.bench.cli",
    ),
)


def build_parser(argv: Sequence[str]) -> argparse.ArgumentParser:
    """The parser for `argv`: every subcommand listed, only the one `argv` names configured."""
    parser = argparse.ArgumentParser(
        prog="lane-router",
        description="Class-aware routing reverse proxy for vLLM pools, and the lab that proves a profile.",
    )
    parser.add_argument(
        "--version", action="version", version=f"lane-router {__version__}, request path {BUILD.describe()}"
    )
    _add(parser, COMMANDS, _words(argv), dest="command")
    return parser


def _words(argv: Sequence[str]) -> list[str]:
    """The leading words that may name a subcommand and its action (options never come between:
    the top level and the groups take none but `--help` and `--version`)."""
    words: list[str] = []
    for arg in argv:
        if arg.startswith("-"):
            break
        words.append(arg)
    return words


def _add(parser: argparse.ArgumentParser, commands: Sequence[Command], words: list[str], dest: str) -> None:
    chosen = words[0] if words else None
    group = dest != "command"
    sub = parser.add_subparsers(dest=dest, metavar="ACTION" if group else "COMMAND", required=group)
    for command in commands:
        child = sub.add_parser(command.name, help=command.help, description=command.help)
        if command.name != chosen:
            continue  # listed by name and help; configured only when it is the one run
        if command.actions:
            _add(child, command.actions, words[1:], dest=f"{command.name}_action")
        else:
            importlib.import_module(command.module).configure(command.name, child)


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    return build_parser(argv).parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args_in = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(args_in)
    args = parser.parse_args(args_in)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
