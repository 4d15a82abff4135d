"""Key hygiene: stored key digests that anyone could authenticate with.

A profile stores each API key as a sha256 (router/keys/auth.py). A digest is *known* when it is the
hash of a key someone published or everyone tries first, and a *placeholder* when it was never
the hash of a random key at all (a template's filler, a digest typed by hand). Either way the
key guards nothing, so `lane-router serve` refuses to listen beyond loopback with one, a reload
of a router that does is refused, and `lane-router render` refuses to render one
(router/commands.py, router/state/live.py, router/deploy/cli.py).
"""

from __future__ import annotations

import hashlib
import ipaddress
import itertools
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal

from router.config.checks import ConfigIssue
from router.config.models import KeyConfig

# What `lane-router render k8s` puts in the Secret for every key hash until an operator fills it
# in (router/deploy/render_k8s.py); someone may well hash it instead of replacing it.
KEY_HASH_PLACEHOLDER = "REPLACE with the sha256 of the key (lane-router hash-key --new)"

FIX = "replace it with a fresh key: `lane-router hash-key --new` prints one and its sha256"

Kind = Literal["published", "placeholder"]


@dataclass(frozen=True, slots=True)
class Source:
    """Plaintexts of one origin; `origin` says where they come from in the issue's message."""

    kind: Kind
    origin: str
    texts: tuple[str, ...]


# `sk-…` keys from OpenAI's and LiteLLM's examples, and what local OpenAI-compatible servers
# (llama.cpp, LM Studio, Ollama) tell clients to send when they check no key.
_TOOL_EXAMPLES = (
    "sk-...", "sk-…", "sk-xxx", "sk-xxxx", "sk-xxxxxxxx", "sk-1234", "sk-12345", "sk-123456",
    "sk-1234567890", "sk-test", "sk-fake", "sk-dummy", "sk-your-key", "sk-your-api-key",
    "sk-no-key-required", "not-needed", "no-key", "dummy", "fake", "none", "null", "lm-studio",
    "ollama", "openai",
)  # fmt: skip

# The first entries of every leaked-password list, and the words templates put where a key goes.
_COMMON_PASSWORDS = (
    "changeme", "change-me", "change_me", "password", "passw0rd", "secret", "test", "testing",
    "admin", "default", "example", "letmein", "qwerty", "abc123", "123456", "12345678",
    "1234567890", "key", "token", "api-key", "apikey", "api_key", "your-api-key", "your_api_key",
    "your-key", "<your-api-key>", "my-api-key",
)  # fmt: skip

KEY_SOURCES: tuple[Source, ...] = (
    Source("published", "the demo key this repository's profiles once shipped", ("demo-key",)),
    # Hashing an unset or blank variable gives the sha256 of nothing.
    Source("published", "the empty string", ("",)),
    Source(
        "published",
        "the api_key vLLM's documentation gives the OpenAI client for a server without a key",
        ("EMPTY",),
    ),
    Source("published", "vLLM's documentation example for --api-key", ("token-abc123",)),
    Source("published", "an example key from the documentation of OpenAI-compatible tools", _TOOL_EXAMPLES),
    Source("published", "a default or common password", _COMMON_PASSWORDS),
    Source(
        "placeholder",
        "a template's placeholder text",
        (KEY_HASH_PLACEHOLDER, "REPLACE", "REPLACE_ME", "replace-me", "TODO", "xxx", "...", "…"),
    ),
)

# A random digest repeats no pattern shorter than itself, uses nearly all 16 hex digits and has
# no long run of one digit; each bound below is met by chance with odds under 1e-11.
_MAX_PERIOD = 32
_MIN_DISTINCT = 8
_MAX_RUN = 12


@dataclass(frozen=True, slots=True)
class Match:
    kind: Kind
    text: str
    origin: str


def _variants(text: str) -> set[str]:
    """As typed, in lower, upper or capitalized case, and with the newline `echo KEY | sha256sum`
    hashes along."""
    cased = {text, text.lower(), text.upper(), text.capitalize()}
    return cased | {t + "\n" for t in cased}


def _known_digests() -> Mapping[str, Match]:
    table: dict[str, Match] = {}
    for source in KEY_SOURCES:
        for text in source.texts:
            for variant in _variants(text):
                digest = hashlib.sha256(variant.encode("utf-8")).hexdigest()
                table.setdefault(digest, Match(source.kind, text, source.origin))
    return MappingProxyType(table)


KNOWN: Mapping[str, Match] = _known_digests()


def pattern_flaw(digest: str) -> str | None:
    """Why `digest` (64 lower-case hex digits) is no plausible random digest, or None."""
    for period in range(1, _MAX_PERIOD + 1):
        if digest == (digest[:period] * (64 // period + 1))[:64]:
            if period == 1:
                return f"one digit repeated ({digest[0]!r})"
            return f"the pattern {digest[:period]!r} repeated"
    distinct = len(set(digest))
    if distinct < _MIN_DISTINCT:
        return f"only {distinct} distinct hex digits"
    run = max(len(list(group)) for _, group in itertools.groupby(digest))
    if run >= _MAX_RUN:
        return f"a run of {run} equal digits"
    return None


def digest_flaw(digest: str) -> str | None:
    """What makes the stored `digest` guessable, phrased to follow "is …", or None."""
    digest = digest.removeprefix("sha256:").strip().lower()
    match = KNOWN.get(digest)
    if match is not None:
        what = "a placeholder" if match.kind == "placeholder" else "a key anyone can guess"
        return f"the sha256 of {match.text!r}, {what} ({match.origin})"
    flaw = pattern_flaw(digest)
    return None if flaw is None else f"a placeholder, not the sha256 of a random key: {flaw}"


def key_issues(keys: Sequence[KeyConfig], environ: Mapping[str, str] | None = None) -> list[ConfigIssue]:
    """One issue per guessable key, at its dotted path. Keys named by `sha256_env` are checked on
    the variable's value in `environ`; without `environ` only literal digests are."""
    return list(_issues(keys, environ))


def _issues(keys: Sequence[KeyConfig], environ: Mapping[str, str] | None) -> Iterator[ConfigIssue]:
    for i, key in enumerate(keys):
        if key.sha256 is not None:
            flaw = digest_flaw(key.sha256)
            if flaw is not None:
                yield ConfigIssue(f"keys[{i}].sha256", f"key {key.name!r} is {flaw}; {FIX}")
        elif key.sha256_env and environ is not None and key.sha256_env in environ:
            value = environ[key.sha256_env].removeprefix("sha256:").strip().lower()
            # A value that is no digest at all is router/keys/auth.py's to refuse.
            flaw = digest_flaw(value) if _is_digest(value) else None
            if flaw is not None:
                message = f"key {key.name!r}: ${key.sha256_env} holds {flaw}; {FIX}"
                yield ConfigIssue(f"keys[{i}].sha256_env", message)


def _is_digest(value: str) -> bool:
    return len(value) == 64 and all(c in "0123456789abcdef" for c in value)


def is_loopback(host: str) -> bool:
    """Whether a listen address reaches this machine alone: 127.0.0.0/8, ::1 or `localhost`.
    Any other name may resolve anywhere, and an empty host means every interface."""
    name = host.strip().strip("[]").lower()
    if name in ("localhost", "localhost."):
        return True
    try:
        address = ipaddress.ip_address(name)
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback


def refusal(command: str, refused: str, issues: Sequence[ConfigIssue]) -> str:
    """The lines a command exits with: what it refuses and why, then one line per key."""
    head = f"{command}: refusing {refused}: {len(issues)} key(s) anyone can use"
    return "\n".join([head, *(f"  {issue}" for issue in issues)])


def warning(issues: Sequence[ConfigIssue]) -> str:
    lines = (f"  {issue}" for issue in issues)
    return "\n".join([f"{len(issues)} key(s) anyone can use (tolerated on loopback only):", *lines])
