"""W3C Trace Context headers: which are valid, and what is forwarded."""

from __future__ import annotations

import pytest

from router.observe.tracecontext import client_trace, format_traceparent, parse_traceparent, parse_tracestate

TRACE = b"4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = b"00f067aa0ba902b7"
VALID = b"00-" + TRACE + b"-" + PARENT + b"-01"


def test_a_valid_traceparent_is_read() -> None:
    found = parse_traceparent(VALID)
    assert found is not None
    assert (found.trace_id, found.parent_id, found.sampled) == (TRACE, PARENT, True)
    assert found.header() == VALID
    unsampled = parse_traceparent(VALID[:-2] + b"00")
    assert unsampled is not None and not unsampled.sampled


@pytest.mark.parametrize(
    "value",
    [
        b"",
        b"00-" + TRACE.upper() + b"-" + PARENT + b"-01",  # uppercase hex
        b"00-" + b"0" * 32 + b"-" + PARENT + b"-01",  # all-zero trace id
        b"00-" + TRACE + b"-" + b"0" * 16 + b"-01",  # all-zero parent id
        b"ff-" + TRACE + b"-" + PARENT + b"-01",  # the forbidden version
        VALID + b"-extra",  # version 00 has exactly four fields
        VALID + b"x",
        b"00-" + TRACE[:-1] + b"-" + PARENT + b"-01",  # short trace id
        b"00-" + TRACE + b"-" + PARENT + b"-1",
        b"00_" + TRACE + b"_" + PARENT + b"_01",
        b"0g-" + TRACE + b"-" + PARENT + b"-01",
    ],
)
def test_an_invalid_traceparent_is_refused(value: bytes) -> None:
    assert parse_traceparent(value) is None


def test_a_later_version_is_read_as_version_00_and_its_extra_fields_ignored() -> None:
    found = parse_traceparent(b"cc-" + TRACE + b"-" + PARENT + b"-01-what-comes-later")
    assert found is not None and found.header() == VALID


@pytest.mark.parametrize(
    ("lines", "expected"),
    [
        ([b"congo=t61rcWkgMzE"], b"congo=t61rcWkgMzE"),
        ([b"rojo=00f067aa0ba902b7, congo=t61rcWkgMzE"], b"rojo=00f067aa0ba902b7,congo=t61rcWkgMzE"),
        ([b"rojo=1", b"congo=2"], b"rojo=1,congo=2"),  # header lines combine
        ([b"tenant@vendor=v"], b"tenant@vendor=v"),
        ([b"a=1,,b=2"], b"a=1,b=2"),  # empty members are allowed and dropped
    ],
)
def test_a_valid_tracestate_is_kept(lines: list[bytes], expected: bytes) -> None:
    assert parse_tracestate(lines) == expected


@pytest.mark.parametrize(
    "lines",
    [
        [b"Rojo=1"],  # keys are lowercase
        [b"rojo"],
        [b"rojo=1,rojo=2"],  # a key at most once
        [b"rojo=a,b"],
        [b"rojo=tab\there"],
        [b"rojo="],  # a value has at least one character
        [b",".join(b"k%d=v" % i for i in range(33))],  # at most 32 members
        [b""],
    ],
)
def test_an_invalid_tracestate_is_dropped(lines: list[bytes]) -> None:
    assert parse_tracestate(lines) is None


def test_only_a_single_valid_traceparent_is_forwarded_and_tracestate_only_beside_it() -> None:
    ok = client_trace([VALID], [b"rojo=1"])
    assert ok.forwarded() == ((b"traceparent", VALID), (b"tracestate", b"rojo=1"))
    assert client_trace([VALID, VALID], [b"rojo=1"]).forwarded() == ()
    assert client_trace([b"00-bad"], [b"rojo=1"]).forwarded() == ()
    assert client_trace([], [b"rojo=1"]).forwarded() == ()
    assert client_trace([VALID], [b"Bad=1"]).forwarded() == ((b"traceparent", VALID),)


def test_the_router_writes_version_00() -> None:
    assert format_traceparent(TRACE, PARENT, True) == VALID
    assert format_traceparent(TRACE, PARENT, False).endswith(b"-00")
