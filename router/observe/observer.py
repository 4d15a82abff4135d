"""Who watches finished requests: the tracer and the access log, built once at startup from the
settings and handed to every runtime. With neither configured the observer does nothing but
carry the client's trace headers upstream, and no OpenTelemetry module is ever imported.

The request path makes one `RequestRecord` per request (`start`), fills it as it goes, and
hands it back once (`finish`); the readers take what they need from it."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Protocol

from router.observe.accesslog import AccessLog
from router.observe.record import RequestIds, RequestRecord, TraceIds
from router.observe.tracecontext import ClientTrace, format_traceparent

if TYPE_CHECKING:
    from router.settings import Settings


class Tracer(Protocol):
    def begin(self, client: ClientTrace) -> TraceIds: ...
    def export(self, rec: RequestRecord) -> None: ...
    def close(self) -> None: ...


class Observer:
    __slots__ = ("access", "ids", "tracer", "wants_usage")

    def __init__(self, tracer: Tracer | None = None, access: AccessLog | None = None) -> None:
        self.tracer = tracer
        self.access = access
        self.ids = RequestIds()  # for requests that bring no usable X-Request-Id
        # The usage report sits in the response's last bytes; they are kept only for a reader.
        self.wants_usage = access is not None

    @property
    def active(self) -> bool:
        return self.tracer is not None or self.access is not None

    def start(self, request_id: bytes, route: str, client: ClientTrace, started: float) -> RequestRecord:
        rec = RequestRecord(
            request_id=request_id, route=route, wall=time.time(), started=started, client_trace=client
        )
        if self.tracer is not None:
            rec.trace = self.tracer.begin(client)
        return rec

    def upstream_headers(self, rec: RequestRecord) -> tuple[tuple[bytes, bytes], ...]:
        """The trace headers the backend gets: the router's upstream span under the request's
        trace when tracing, else the client's own context unchanged (if it sent a valid one)."""
        ids = rec.trace
        if ids is None:
            return rec.client_trace.forwarded()
        parent = format_traceparent(ids.trace_id, ids.upstream_span_id, ids.sampled)
        state = rec.client_trace.state
        if state is None:
            return ((b"traceparent", parent),)
        return ((b"traceparent", parent), (b"tracestate", state))

    def finish(self, rec: RequestRecord) -> None:
        if self.tracer is not None:
            self.tracer.export(rec)
        if self.access is not None:
            self.access.write(rec)

    def close(self) -> None:
        if self.tracer is not None:
            self.tracer.close()
        if self.access is not None:
            self.access.close()


def build_observer(settings: Settings) -> Observer:
    """The observer the settings ask for: tracing when an OTLP exporter is configured, the
    access log when `access_log_file` names a file or "-"."""
    tracer: Tracer | None = None
    if tracing_enabled(settings):
        from router.observe.otel import OtelTracer  # only now: tracing off loads no OpenTelemetry

        tracer = OtelTracer(settings.otel_service_name or "lane-router", traces_endpoint(settings))
    access = None
    if settings.access_log_file is not None:
        access = AccessLog(settings.access_log_file, settings.access_log_queue)
    return Observer(tracer, access)


def traces_endpoint(settings: Settings) -> str:
    """Where spans go, as the OTLP exporter specification says: the traces endpoint as given,
    else the base endpoint with `/v1/traces`, else the local collector's default."""
    if settings.otel_exporter_otlp_traces_endpoint:
        return settings.otel_exporter_otlp_traces_endpoint
    base = settings.otel_exporter_otlp_endpoint or "http://localhost:4318"
    return base.rstrip("/") + "/v1/traces"


def tracing_enabled(settings: Settings) -> bool:
    """Tracing is on when an OTLP endpoint is given or OTEL_TRACES_EXPORTER=otlp, unless
    OTEL_SDK_DISABLED=true or OTEL_TRACES_EXPORTER=none. Only OTLP over HTTP/protobuf is
    shipped: another exporter or protocol is refused rather than silently ignored."""
    if (settings.otel_sdk_disabled or "").strip().lower() == "true":
        return False
    exporter = (settings.otel_traces_exporter or "").strip().lower()
    if exporter == "none":
        return False
    if exporter not in ("", "otlp"):
        raise ValueError(f"OTEL_TRACES_EXPORTER={exporter!r}: only 'otlp' (or 'none') is supported")
    protocol = settings.otel_exporter_otlp_traces_protocol or settings.otel_exporter_otlp_protocol or ""
    protocol = protocol.strip()
    if protocol not in ("", "http/protobuf"):
        raise ValueError(f"OTLP protocol {protocol!r}: only 'http/protobuf' is supported")
    endpoint = settings.otel_exporter_otlp_traces_endpoint or settings.otel_exporter_otlp_endpoint
    return exporter == "otlp" or bool(endpoint)
