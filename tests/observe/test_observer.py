"""Which settings turn tracing on, where its spans go, and what the backend is sent either way."""

from __future__ import annotations

import time

import pytest

from router.keys.ratelimit import USAGE_TAIL_BYTES
from router.observe.observer import Observer, traces_endpoint, tracing_enabled
from router.observe.record import RequestRecord
from router.observe.tracecontext import client_trace
from router.settings import Settings

VALID = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@pytest.mark.parametrize(
    ("env", "on"),
    [
        ({}, False),
        ({"otel_exporter_otlp_endpoint": "http://c:4318"}, True),
        ({"otel_exporter_otlp_traces_endpoint": "http://c:4318/v1/traces"}, True),
        ({"otel_traces_exporter": "otlp"}, True),
        ({"otel_traces_exporter": "none", "otel_exporter_otlp_endpoint": "http://c:4318"}, False),
        ({"otel_sdk_disabled": "true", "otel_exporter_otlp_endpoint": "http://c:4318"}, False),
        ({"otel_exporter_otlp_protocol": "http/protobuf", "otel_traces_exporter": "otlp"}, True),
    ],
)
def test_tracing_follows_the_standard_variables(env: dict[str, str], on: bool) -> None:
    assert tracing_enabled(Settings(**env)) is on


@pytest.mark.parametrize(
    "env",
    [
        {"otel_traces_exporter": "zipkin"},
        {"otel_traces_exporter": "otlp", "otel_exporter_otlp_traces_protocol": "grpc"},
        {"otel_exporter_otlp_endpoint": "http://c:4317", "otel_exporter_otlp_protocol": "grpc"},
    ],
)
def test_an_exporter_or_protocol_not_shipped_is_refused(env: dict[str, str]) -> None:
    with pytest.raises(ValueError):
        tracing_enabled(Settings(**env))


def test_the_traces_endpoint_is_the_signal_one_else_the_base_one_with_its_path() -> None:
    assert traces_endpoint(Settings(otel_exporter_otlp_traces_endpoint="http://c/x")) == "http://c/x"
    assert (
        traces_endpoint(Settings(otel_exporter_otlp_endpoint="http://c:4318/")) == "http://c:4318/v1/traces"
    )
    assert traces_endpoint(Settings()) == "http://localhost:4318/v1/traces"


def test_without_observers_the_record_carries_the_clients_context_and_nothing_is_read() -> None:
    observer = Observer()
    assert not observer.active and not observer.wants_usage
    rec = observer.start(b"r", "/v1/completions", client_trace([VALID], [b"a=1"]), time.monotonic())
    assert observer.upstream_headers(rec) == ((b"traceparent", VALID), (b"tracestate", b"a=1"))
    assert rec.trace is None and rec.trace_id() == VALID[3:35]
    observer.finish(rec)


def test_the_usage_report_is_read_from_the_responses_tail() -> None:
    rec = RequestRecord(b"r", "/v1/completions", time.time(), time.monotonic())
    assert rec.usage() == (None, None)
    rec.usage_tail = b'data: {"usage": {"prompt_tokens": 7, "total_tokens": 12, "completion_tokens": 5}}\n\n'
    assert rec.usage() == (7, 5)
    # Only its last USAGE_TAIL_BYTES are searched, as the rate limits search them.
    rec.usage_tail += b" " * (USAGE_TAIL_BYTES - 20)
    assert rec.usage() == (None, None)
