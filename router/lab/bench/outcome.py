"""What happened to one request, as its client saw it: the record every runner produces and
every report reads, one JSON object per line.

Times are seconds. `arrival` is when the request was sent, relative to the start of the run;
`ttft` is from sending to the first generated text (for a non-streamed request: to the whole
answer); `gaps` are the times between successive pieces of streamed text; `e2e` is from sending
to the last byte. `status` is the HTTP status, or 0 when no response arrived (connection error,
timeout).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any

import orjson


@dataclass(slots=True)
class Outcome:
    request_id: str
    cls: str
    arrival: float
    stream: bool
    client_id: str = ""
    prompt_tokens: int = 0
    max_tokens: int = 0
    status: int = 0
    lane: str | None = None
    routed_class: str | None = None
    reason: str | None = None
    backend: str | None = None
    ttft: float | None = None
    gaps: list[float] = field(default_factory=list)
    e2e: float | None = None
    output_tokens: int = 0
    output_chars: int = 0  # characters of generated text received
    error: str | None = None
    session: str | None = None
    step: int = 0
    tenant: str = ""  # the workload tenant that sent it (workloads that name tenants)

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.error is None

    @property
    def finish(self) -> float | None:
        return None if self.e2e is None else self.arrival + self.e2e

    def to_json(self) -> bytes:
        return orjson.dumps(asdict(self))


def outcome_from_dict(data: dict[str, Any]) -> Outcome:
    return Outcome(**data)


def write_jsonl(outcomes: Iterable[Outcome], out: IO[bytes]) -> int:
    n = 0
    for o in outcomes:
        out.write(o.to_json() + b"\n")
        n += 1
    return n


def read_jsonl(path: str | Path) -> Iterator[Outcome]:
    with Path(path).open("rb") as f:
        for line in f:
            if line.strip():
                yield outcome_from_dict(orjson.loads(line))
