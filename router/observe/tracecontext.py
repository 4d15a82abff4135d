"""W3C Trace Context (https://www.w3.org/TR/trace-context/): reading a client's `traceparent` and
`tracestate`, and writing the `traceparent` the router sends upstream.

Pure functions over header bytes. A header that does not follow the specification is dropped,
never forwarded: a backend must not receive a trace context the router could not vouch for."""

from __future__ import annotations

import re
from dataclasses import dataclass

# version "-" trace-id "-" parent-id "-" trace-flags, lowercase hex only. A later version may
# append fields after a '-', which a version-00 reader ignores (the specification, §3.2.4).
_TRACEPARENT = re.compile(rb"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?\Z", re.DOTALL)
_ZERO_TRACE = b"0" * 32
_ZERO_SPAN = b"0" * 16

# list-member = key "=" value; a key is a simple lowercase name or tenant@system.
_KEY = rb"(?:[a-z][a-z0-9_\-*/]{0,255}|[a-z0-9][a-z0-9_\-*/]{0,240}@[a-z][a-z0-9_\-*/]{0,13})"
_VALUE = rb"[\x20-\x2b\x2d-\x3c\x3e-\x7e]{0,255}[\x21-\x2b\x2d-\x3c\x3e-\x7e]"
_MEMBER = re.compile(_KEY + rb"=" + _VALUE + rb"\Z")
MAX_TRACESTATE_MEMBERS = 32
MAX_TRACESTATE_BYTES = 512
SAMPLED = 0x01


@dataclass(frozen=True, slots=True)
class TraceParent:
    """A valid incoming trace context: the caller's trace, its span, its flags."""

    trace_id: bytes  # 32 lowercase hex digits
    parent_id: bytes  # 16 lowercase hex digits
    flags: int

    @property
    def sampled(self) -> bool:
        return bool(self.flags & SAMPLED)

    def header(self) -> bytes:
        """The header as a version-00 participant forwards it."""
        return format_traceparent(self.trace_id, self.parent_id, self.sampled)


def parse_traceparent(value: bytes | None) -> TraceParent | None:
    """The client's trace context, or None when it is absent or not valid."""
    if value is None:
        return None
    match = _TRACEPARENT.match(value.strip(b" \t"))
    if match is None:
        return None
    version, trace_id, parent_id, flags, rest = match.groups()
    if version == b"ff" or (version == b"00" and rest is not None):
        return None
    if trace_id == _ZERO_TRACE or parent_id == _ZERO_SPAN:
        return None
    return TraceParent(trace_id, parent_id, int(flags, 16))


def parse_tracestate(values: list[bytes]) -> bytes | None:
    """The client's tracestate, its header lines joined, or None when it is empty or any list
    member is malformed (the specification forbids propagating a tracestate that failed to parse)."""
    joined = b",".join(values)
    if not joined or len(joined) > MAX_TRACESTATE_BYTES * 2:
        return None
    members = [m.strip(b" \t") for m in joined.split(b",")]
    members = [m for m in members if m]
    if not members or len(members) > MAX_TRACESTATE_MEMBERS:
        return None
    keys = set()
    for member in members:
        if _MEMBER.match(member) is None:
            return None
        key = member.split(b"=", 1)[0]
        if key in keys:
            return None
        keys.add(key)
    return b",".join(members)


def format_traceparent(trace_id: bytes, span_id: bytes, sampled: bool) -> bytes:
    return b"00-" + trace_id + b"-" + span_id + (b"-01" if sampled else b"-00")


@dataclass(frozen=True, slots=True)
class ClientTrace:
    """The trace headers a request came with, validated."""

    parent: TraceParent | None
    state: bytes | None

    def forwarded(self) -> tuple[tuple[bytes, bytes], ...]:
        """What a router that does not trace sends upstream: the client's context unchanged."""
        if self.parent is None:
            return ()
        if self.state is None:
            return ((b"traceparent", self.parent.header()),)
        return ((b"traceparent", self.parent.header()), (b"tracestate", self.state))


def client_trace(traceparent: list[bytes], tracestate: list[bytes]) -> ClientTrace:
    """A request's trace headers: exactly one valid traceparent, else none; a tracestate only
    beside a valid traceparent."""
    parent = parse_traceparent(traceparent[0]) if len(traceparent) == 1 else None
    state = parse_tracestate(tracestate) if parent is not None and tracestate else None
    return ClientTrace(parent, state)


NO_CLIENT_TRACE = ClientTrace(None, None)
