"""Just enough PromQL reading to check that queries use the router's real metric and label names."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry

# Labels Prometheus adds to every scraped series, and the histogram bucket bound.
TARGET_LABELS = frozenset({"job", "instance", "namespace", "pod", "le"})
# Series Prometheus itself synthesizes for each target.
SYNTHETIC = frozenset({"up", "scrape_duration_seconds", "scrape_samples_scraped"})
_FUNCTIONS = frozenset(
    {"sum", "max", "min", "avg", "count", "rate", "increase", "irate", "histogram_quantile", "round",
     "by", "without", "and", "or", "unless", "on", "ignoring", "group_left", "group_right", "bool",
     "offset", "label_values", "abs", "clamp_min", "clamp_max", "topk", "bottomk", "humanizePercentage"}
)  # fmt: skip
_IDENT = re.compile(r"(?<![\w:.$])[a-zA-Z_:][a-zA-Z0-9_:]*(?![\w:])")
_MATCHER = re.compile(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_DURATION = re.compile(r"\[[^\]]*\]")
_BRACES = re.compile(r"\{[^}]*\}")


@dataclass(frozen=True, slots=True)
class Family:
    """One metric family as Prometheus stores it: the series names it produces and its labels."""

    series: frozenset[str]
    labels: frozenset[str]


def registry_families(registry: CollectorRegistry) -> dict[str, Family]:
    """Series name → family, for every family, whether or not it has samples yet."""
    out: dict[str, Family] = {}
    suffixes = {"counter": ("_total",), "gauge": ("",), "histogram": ("_bucket", "_count", "_sum")}
    for metric in registry.collect():
        labels = _declared_labels(registry, metric.name)
        names = frozenset(metric.name + s for s in suffixes[metric.type])
        for name in names:
            out[name] = Family(names, labels)
    return out


def _declared_labels(registry: CollectorRegistry, name: str) -> frozenset[str]:
    collector = registry._names_to_collectors.get(name) or registry._names_to_collectors[name + "_total"]
    # prometheus_client's own metrics keep their label names private; router/observe/leanmetrics.py's
    # families name them publicly.
    return frozenset(getattr(collector, "labelnames", None) or getattr(collector, "_labelnames", ()))


@dataclass(frozen=True, slots=True)
class Selector:
    name: str
    labels: frozenset[str]


def selectors(expr: str) -> Iterator[Selector]:
    """Every series selector `name{matchers}` in an expression (functions and keywords skipped)."""
    text = _GROUPING.sub(" ", _DURATION.sub("", _STRING.sub('""', expr)))
    blocks: list[str] = []

    def stash(match: re.Match[str]) -> str:
        blocks.append(match.group(0))
        return f"{{{len(blocks) - 1}}}"

    text = _BRACES.sub(stash, text)
    for match in _IDENT.finditer(text):
        name, rest = match.group(0), text[match.end() :].lstrip()
        if name in _FUNCTIONS or rest.startswith("("):
            continue
        braces = blocks[int(rest[1 : rest.index("}")])] if rest.startswith("{") else ""
        yield Selector(name, frozenset(_MATCHER.findall(braces)))


def grouping_labels(expr: str) -> set[str]:
    labels: set[str] = set()
    for group in _GROUPING.findall(expr):
        labels |= {part.strip() for part in group.split(",") if part.strip()}
    return labels
