"""Tracing with OpenTelemetry: the spans of one finished request, exported over OTLP/HTTP.

Imported only when tracing is configured (router/observe/observer.py), so a router without it loads no
OpenTelemetry module. The ids are fixed when the request arrives (`begin`), because the upstream
request must carry the upstream span's id before that span ends; the spans themselves are built
from the `RequestRecord` once the request is over and handed to the SDK's batch processor, whose
thread does the export. The exporter, the sampler and the resource read the standard `OTEL_*`
variables; a span never holds a key or a prompt."""

from __future__ import annotations

import random

from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.sampling import Decision
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import (
    NonRecordingSpan,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    TraceState,
    set_span_in_context,
)
from opentelemetry.util.types import AttributeValue

from router.observe.record import RequestRecord, TraceIds
from router.observe.tracecontext import ClientTrace, TraceParent

_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_SCOPE = InstrumentationScope("lane_router")


def _random_id(bits: int) -> int:
    # As the SDK's own id generator: random, not secret (ids are seen by every collector).
    while True:
        value = random.getrandbits(bits)
        if value:
            return value


def _new_id(size: int) -> bytes:
    return b"%0*x" % (size * 2, _random_id(size * 8))


class OtelTracer:
    """Ids at arrival, spans at the end; `close` flushes what is queued."""

    def __init__(self, service_name: str, endpoint: str) -> None:
        self._resource = Resource.create({"service.name": service_name})
        # The provider is built only for its sampler, read from OTEL_TRACES_SAMPLER(_ARG).
        self._sampler = TracerProvider(resource=self._resource, shutdown_on_exit=False).sampler
        self._processor = BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint))

    def begin(self, client: ClientTrace) -> TraceIds:
        parent = client.parent
        trace_id = parent.trace_id if parent is not None else _new_id(16)
        return TraceIds(trace_id, _new_id(8), _new_id(8), self._sampled(parent, trace_id))

    def _sampled(self, parent: TraceParent | None, trace_id: bytes) -> bool:
        context: Context | None = None
        if parent is not None:
            context = set_span_in_context(NonRecordingSpan(_remote(parent)))
        result = self._sampler.should_sample(context, int(trace_id, 16), "request", SpanKind.SERVER)
        return result.decision is Decision.RECORD_AND_SAMPLE

    def export(self, rec: RequestRecord) -> None:
        ids = rec.trace
        if ids is None or not ids.sampled or rec.ended is None:
            return
        for span in _spans(rec, ids, self._resource):
            self._processor.on_end(span)

    def close(self) -> None:
        self._processor.shutdown()  # type: ignore[no-untyped-call]


def _remote(parent: TraceParent) -> SpanContext:
    flags = TraceFlags(parent.flags)
    return SpanContext(int(parent.trace_id, 16), int(parent.parent_id, 16), is_remote=True, trace_flags=flags)


def _ctx(trace_id: int, span_id: int, state: TraceState) -> SpanContext:
    return SpanContext(
        trace_id=trace_id, span_id=span_id, is_remote=False, trace_flags=_SAMPLED, trace_state=state
    )


def _attributes(rec: RequestRecord) -> dict[str, AttributeValue]:
    """What a span may say: names, numbers, the outcome — never a key or a prompt."""
    found: dict[str, AttributeValue | None] = {
        "http.request.method": "POST",
        "http.route": rec.route,
        "http.response.status_code": rec.status,
        "lane_router.request_id": rec.request_id.decode("ascii"),
        "lane_router.key_name": rec.key_name,
        "lane_router.class": rec.cls,
        "lane_router.reason": rec.reason,
        "lane_router.lane": rec.lane,
        "lane_router.pool": rec.pool,
        "lane_router.backend": rec.backend,
        "lane_router.retries": rec.retries,
        "lane_router.stream": rec.stream,
        "lane_router.client_disconnect": rec.client_disconnect,
        "error.type": rec.error_code,
    }
    return {k: v for k, v in found.items() if v is not None}


def _status(rec: RequestRecord) -> Status:
    if rec.status >= 500:
        return Status(StatusCode.ERROR, rec.error_code or f"HTTP {rec.status}")
    return Status(StatusCode.UNSET)


def _spans(rec: RequestRecord, ids: TraceIds, resource: Resource) -> list[ReadableSpan]:
    """The request's span and its phases: auth and classification, the wait for a backend slot,
    and the upstream call with its connect, first byte and stream."""
    base_ns = int(rec.wall * 1e9)

    def ns(t: float) -> int:
        return base_ns + int((t - rec.started) * 1e9)

    assert rec.ended is not None
    ended = rec.ended
    state = TraceState()
    if rec.client_trace.state is not None:
        state = TraceState.from_header([rec.client_trace.state.decode("ascii")])
    trace_id = int(ids.trace_id, 16)
    root = _ctx(trace_id, int(ids.span_id, 16), state)
    parent = _remote(rec.client_trace.parent) if rec.client_trace.parent is not None else None
    attrs = _attributes(rec)
    request = ReadableSpan(
        f"POST {rec.route}",
        context=root,
        parent=parent,
        resource=resource,
        attributes=attrs,
        kind=SpanKind.SERVER,
        status=_status(rec),
        start_time=ns(rec.started),
        end_time=ns(ended),
        instrumentation_scope=_SCOPE,
    )
    spans = [request]

    def child(name: str, start: float | None, end: float | None, under: SpanContext = root) -> None:
        if start is None:
            return
        span = ReadableSpan(
            name,
            context=_ctx(trace_id, _random_id(64), state),
            parent=under,
            resource=resource,
            attributes={},
            start_time=ns(start),
            end_time=ns(end if end is not None else ended),
            instrumentation_scope=_SCOPE,
        )
        spans.append(span)

    child("auth_classify", rec.started, rec.classified_at)
    child("queue", rec.classified_at, rec.admitted_at)
    if rec.admitted_at is not None:
        upstream = _ctx(trace_id, int(ids.upstream_span_id, 16), state)
        call = ReadableSpan(
            "upstream",
            context=upstream,
            parent=root,
            resource=resource,
            attributes={k: attrs[k] for k in _UPSTREAM if k in attrs},
            kind=SpanKind.CLIENT,
            status=_status(rec),
            start_time=ns(rec.admitted_at),
            end_time=ns(ended),
            instrumentation_scope=_SCOPE,
        )
        spans.append(call)
        child("upstream.connect", rec.admitted_at, rec.connected_at, upstream)
        child("upstream.first_byte", rec.connected_at, rec.first_byte_at, upstream)
        child("upstream.stream", rec.first_byte_at, ended, upstream)
    return spans


_UPSTREAM = ("lane_router.pool", "lane_router.backend", "lane_router.retries", "http.response.status_code")
