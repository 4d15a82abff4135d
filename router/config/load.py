"""Read a profile file: YAML → validated `ProfileConfig`, or every problem with its dotted path."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from router.balance import STRATEGIES
from router.config.checks import ConfigIssue, cross_check
from router.config.models import ProfileConfig


class ConfigError(Exception):
    """The profile cannot be used; `issues` lists every reason with its path."""

    def __init__(self, source: str, issues: Sequence[ConfigIssue]) -> None:
        self.source = source
        self.issues = tuple(issues)
        lines = "\n".join(f"  {issue}" for issue in self.issues)
        super().__init__(f"{source}: {len(self.issues)} problem(s)\n{lines}")


def dotted(loc: Sequence[int | str]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out or "(top level)"


def parse_profile(data: Any, source: str = "<config>") -> ProfileConfig:
    if not isinstance(data, dict):
        raise ConfigError(source, [ConfigIssue("(top level)", "must be a mapping")])
    try:
        cfg = ProfileConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(source, [_issue(e) for e in exc.errors(include_url=False)]) from None
    problems = cross_check(cfg)
    if problems:
        raise ConfigError(source, problems)
    return cfg


_PHRASES = {
    "greater_than_equal": "must be ≥ {ge}",
    "greater_than": "must be > {gt}",
    "less_than_equal": "must be ≤ {le}",
    "less_than": "must be < {lt}",
    "missing": "required",
    "extra_forbidden": "unknown key",
}


def _issue(err: Any) -> ConfigIssue:
    return ConfigIssue(dotted(file_path(err["loc"])), _message(err).removeprefix("Value error, "))


def file_path(loc: Sequence[int | str]) -> list[int | str]:
    """A validation error's location as the file spells it: without the names of validators,
    and without the tag a tagged union puts after the field (`balance.prefix_affinity.slack` is
    `balance.slack` in the file)."""
    out: list[int | str] = []
    for part in loc:
        if isinstance(part, str) and part.startswith("function-"):
            continue
        if out and out[-1] == "balance" and part in STRATEGIES:
            continue
        out.append(part)
    return out


def _message(err: Any) -> str:
    ctx = err.get("ctx", {})
    if err["type"] == "union_tag_invalid":
        return f"unknown {ctx['discriminator'].strip(chr(39))} {ctx['tag']!r} (one of {ctx['expected_tags']})"
    if err["type"] == "union_tag_not_found":
        return f"needs {ctx['discriminator'].strip(chr(39))}"
    phrase = _PHRASES.get(err["type"])
    return phrase.format(**ctx) if phrase else str(err["msg"])


def load_profile(path: str | Path) -> ProfileConfig:
    return parse_profile(read_yaml(path), str(path))


def read_yaml(path: str | Path) -> Any:
    """A YAML file's data, or a ConfigError naming the file or the line and column at fault."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(str(path), [ConfigIssue("(file)", exc.strerror or str(exc))]) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "(file)"
        raise ConfigError(str(path), [ConfigIssue(where, f"invalid YAML: {exc}")]) from None
    return data
