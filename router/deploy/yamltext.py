"""YAML text for rendered documents: keys in the order they were built, multi-line strings (an
embedded profile) as literal blocks so they stay readable and diffable."""

from __future__ import annotations

import textwrap
from collections.abc import Iterable, Sequence
from typing import Any

import yaml


class _Dumper(yaml.SafeDumper):
    """Safe dumping, with literal blocks for multi-line text and every value written out where it
    stands: a selector shared by two fields reads as itself, not as an alias to the other."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def dump(document: Any) -> str:
    return yaml.dump(document, Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=110)


def dump_all(documents: Sequence[Any], comments: Iterable[str] = ()) -> str:
    """A YAML stream: the comments first (`# `, wrapped), then each document after `---`."""
    head = "".join("".join(f"# {line}\n" for line in _wrapped(text)) for text in comments)
    body = "".join("---\n" + dump(doc) for doc in documents)
    return head + body


def _wrapped(text: str) -> list[str]:
    # Names such as vllm-<pool>.lane-router.svc stay whole on one line.
    return textwrap.wrap(text, 98, subsequent_indent="  ", break_on_hyphens=False) or [""]
