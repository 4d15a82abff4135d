"""`lane-router init URL [URL …]`: a starter profile for running vLLM servers.

Each server is asked what it serves (router/config/survey.py). Servers serving the same model
make one pool, with the model's other served names as aliases, its LoRA adapters, the smallest
`max_model_len` among them and the version they run; with one pool every request class goes to
it (router/config/models.py), so the profile names no lanes. A fresh API key is made: the profile
stores its sha256 only, and the key itself is printed once, on stdout (alone, so a script can
take it); what was written is said on stderr. The profile is validated as `check` would before
it is written.

Servers serving different models are refused: each lane sends every request of its class to
one pool, whatever model it names, so every pool of a profile must serve the same models.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from router.config.load import ConfigError, parse_profile
from router.config.survey import ServerFacts, SurveyError, survey
from router.keys.auth import hash_key, new_key

DEFAULT_OUTPUT = Path("lane-router.yaml")
DEFAULT_KEY_NAME = "client"
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class StarterError(Exception):
    """The servers cannot make one profile; the message says why."""


@dataclass(frozen=True, slots=True)
class Starter:
    profile: dict[str, Any]
    notes: tuple[str, ...]  # what the operator should know of what was chosen


def configure(name: str, parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Write a starter profile for running vLLM servers: ask each URL what it serves "
        "(/health, /version, /v1/models), put the servers serving the model in one pool "
        "(backends, max_model_len, served names, LoRA adapters), and make an API key for it. "
        "The key is printed once, on stdout; the profile stores only its sha256. "
        "Then: lane-router check --config FILE; lane-router serve --config FILE."
    )
    parser.add_argument("urls", nargs="+", metavar="URL", help="a vLLM server, e.g. http://127.0.0.1:8000")
    parser.add_argument(
        "--output",
        type=Path,
        default=DEFAULT_OUTPUT,
        metavar="FILE",
        help=f"the profile to write (default {DEFAULT_OUTPUT})",
    )
    parser.add_argument("--force", action="store_true", help="overwrite FILE if it exists")
    parser.add_argument(
        "--key-name",
        default=DEFAULT_KEY_NAME,
        metavar="NAME",
        help=f"the API key's name (default {DEFAULT_KEY_NAME})",
    )
    parser.add_argument(
        "--backend-api-key-env",
        metavar="VAR",
        help="the environment variable holding the key the servers were started with (vLLM's "
        "--api-key): read now to ask them, named in the profile for `serve` to read",
    )
    parser.add_argument(
        "--timeout", type=float, default=10.0, metavar="SECONDS", help="per request to a server (default 10)"
    )
    parser.set_defaults(func=cmd_init)


def cmd_init(args: argparse.Namespace) -> int:
    output: Path = args.output
    if output.exists() and not args.force:
        return _fail(f"{output} exists: pass --force to overwrite it, or --output another file")
    try:
        api_key = _backend_key(args.backend_api_key_env, os.environ)
        servers = [survey(url, api_key=api_key, timeout_s=args.timeout) for url in args.urls]
        key = new_key()
        starter = starter_profile(servers, args.key_name, hash_key(key), args.backend_api_key_env)
        parse_profile(starter.profile, str(output))
    except (SurveyError, StarterError) as err:
        return _fail(str(err))
    except ConfigError as err:
        return _fail(f"the starter profile would not be valid:\n{err}")
    try:
        output.write_text(render(starter.profile, servers), encoding="utf-8")
    except OSError as err:
        return _fail(f"cannot write {output}: {err.strerror or err}")
    print(key)
    sys.stdout.flush()
    print(_summary(starter, output, args.key_name), file=sys.stderr)
    return 0


def _fail(message: str) -> int:
    print(f"lane-router init: {message}", file=sys.stderr)
    return 2


def _backend_key(var: str | None, env: dict[str, str] | os._Environ[str]) -> str | None:
    if var is None:
        return None
    if not _ENV_NAME.match(var):
        raise StarterError(f"--backend-api-key-env {var!r} is not an environment variable's name")
    value = env.get(var)
    if not value:
        raise StarterError(f"--backend-api-key-env {var}: the variable is not set (export it, then run init)")
    return value


def starter_profile(
    servers: Sequence[ServerFacts], key_name: str, key_sha256: str, backend_key_env: str | None = None
) -> Starter:
    """The profile for these servers: pure, from what they said."""
    names = {s.bases[0].name for s in servers}
    if len(names) > 1:
        served = "; ".join(f"{s.origin} serves {s.bases[0].name!r}" for s in servers)
        raise StarterError(
            f"the servers serve different models ({served}): every pool of a profile must serve "
            "the same models, since a lane sends each request of its class to one pool; run init "
            "once per model"
        )
    origins = list(dict.fromkeys(s.origin for s in servers))
    first = servers[0]
    model = first.bases[0].name
    notes: list[str] = []
    aliases = _common([b.name for b in s.bases[1:]] for s in servers)
    adapters = _common([a.name for a in s.adapters] for s in servers)
    notes += _partly_served(servers, aliases, adapters)
    lengths = {s.origin: s.bases[0].max_model_len or 0 for s in servers}
    context = min(lengths.values())
    if len(set(lengths.values())) > 1:
        spread = ", ".join(f"{o} {n}" for o, n in lengths.items())
        notes.append(f"the servers differ in max_model_len ({spread}): the pool states the smallest")
    versions = {s.origin: s.version for s in servers}
    if len(set(versions.values())) > 1:
        spread = ", ".join(f"{o} {v}" for o, v in versions.items())
        notes.append(f"the servers run different vLLM versions ({spread}): the pool states the first")
    pool: dict[str, Any] = {"model": model}
    if aliases:
        pool["aliases"] = aliases
    if adapters:
        pool["adapters"] = adapters
    pool["backends"] = origins
    if backend_key_env is not None:
        pool["upstream_api_key_env"] = backend_key_env
    pool["vllm"] = {"version": first.version, "max_model_len": context}
    profile = {
        "profile": "starter",
        "description": f"{model} on {len(origins)} vLLM server(s), written by lane-router init",
        "pools": {pool_name(model): pool},
        "keys": [{"name": key_name, "sha256": f"sha256:{key_sha256}"}],
    }
    return Starter(profile, tuple(notes))


def pool_name(model: str) -> str:
    """A pool name (router/config/models.py `Name`) from a model's name: its last path part."""
    base = model.rstrip("/").rsplit("/", 1)[-1]
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", base).strip("-.")[:64]
    return name or "pool"


def _common(lists: Any) -> list[str]:
    """The names every server serves, in the first server's order."""
    sets = [list(names) for names in lists]
    first = sets[0]
    return [n for n in first if all(n in other for other in sets[1:])]


def _partly_served(servers: Sequence[ServerFacts], aliases: list[str], adapters: list[str]) -> list[str]:
    kept = {servers[0].bases[0].name, *aliases, *adapters}
    notes = []
    for s in servers:
        left = [m.name for m in s.models if m.name not in kept]
        if left:
            notes.append(f"{s.origin} also serves {', '.join(left)}, which not every server does: left out")
    return notes


def render(profile: dict[str, Any], servers: Sequence[ServerFacts]) -> str:
    asked = ", ".join(s.origin for s in servers)
    head = (
        f"# Written by `lane-router init` from what {asked} served.\n"
        "# One pool: every request class goes to it (add `lanes:` and more pools to split them).\n"
        "# The key's plaintext is not stored here: only its sha256.\n"
    )
    return head + yaml.safe_dump(profile, sort_keys=False, allow_unicode=True)


def _summary(starter: Starter, output: Path, key_name: str) -> str:
    ((name, pool),) = starter.profile["pools"].items()
    lines = [
        f"wrote {output}: pool {name!r}, model {pool['model']!r}, {len(pool['backends'])} backend(s), "
        f"max_model_len {pool['vllm']['max_model_len']}, vLLM {pool['vllm']['version']}",
        f"the line above on stdout is API key {key_name!r}: it is shown this once "
        "(the profile keeps its sha256 only)",
    ]
    lines += [f"note: {note}" for note in starter.notes]
    lines += [f"next: lane-router check --config {output}", f"      lane-router serve --config {output}"]
    return "\n".join(lines)
