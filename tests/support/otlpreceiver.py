"""An OTLP/HTTP trace receiver on loopback: what a collector would get, decoded from the protobuf
`ExportTraceServiceRequest` bodies the exporters POST to `/v1/traces`."""

from __future__ import annotations

import contextlib
import gzip
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue


@dataclass(frozen=True)
class Span:
    service: str
    trace_id: str
    span_id: str
    parent_id: str
    name: str
    kind: int
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]


def _value(v: AnyValue) -> Any:
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind is not None else None


class Receiver:
    """Spans received so far, and every raw body (to search for text that must not be there)."""

    def __init__(self) -> None:
        self.spans: list[Span] = []
        self.bodies: list[bytes] = []
        self._changed = threading.Condition()
        self.url = ""

    def add(self, body: bytes) -> None:
        request = ExportTraceServiceRequest.FromString(body)
        found = []
        for rs in request.resource_spans:
            resource = {a.key: _value(a.value) for a in rs.resource.attributes}
            for ss in rs.scope_spans:
                for s in ss.spans:
                    found.append(
                        Span(
                            service=str(resource.get("service.name", "")),
                            trace_id=s.trace_id.hex(),
                            span_id=s.span_id.hex(),
                            parent_id=s.parent_span_id.hex(),
                            name=s.name,
                            kind=s.kind,
                            start_ns=s.start_time_unix_nano,
                            end_ns=s.end_time_unix_nano,
                            attributes={a.key: _value(a.value) for a in s.attributes},
                        )
                    )
        with self._changed:
            self.bodies.append(body)
            self.spans.extend(found)
            self._changed.notify_all()

    def wait_for(self, holds: Callable[[list[Span]], bool], timeout: float = 30.0) -> list[Span]:
        """The spans once `holds(spans)`; fails at the deadline (the exporters send in batches)."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while not holds(self.spans):
                left = deadline - time.monotonic()
                assert left > 0, f"spans never matched; received: {[(s.service, s.name) for s in self.spans]}"
                self._changed.wait(left)
            return list(self.spans)

    def trace(self, trace_id: str) -> list[Span]:
        with self._changed:
            return [s for s in self.spans if s.trace_id == trace_id]


def _handler(receiver: Receiver) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length", "0")))
            if self.headers.get("content-encoding") == "gzip":
                body = gzip.decompress(body)
            if self.path != "/v1/traces":
                self.send_error(404)
                return
            receiver.add(body)
            answer = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("content-type", "application/x-protobuf")
            self.send_header("content-length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, format: str, *args: Any) -> None:
            return

    return Handler


@contextlib.contextmanager
def otlp_receiver() -> Iterator[Receiver]:
    """A receiver on a free loopback port, its base URL in `.url`, until the block ends."""
    receiver = Receiver()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(receiver))
    server.daemon_threads = True
    receiver.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, name="otlp-receiver", daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def main() -> None:
    """`python -m tests.support.otlpreceiver PORT`: receive until interrupted, then print the span count
    (a collector stand-in for `lane-router bench overhead` with tracing on)."""
    import signal
    import sys

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)  # a background job ignores SIGINT
    receiver = Receiver()
    server = ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), _handler(receiver))
    print(f"OTLP/HTTP receiver on http://127.0.0.1:{server.server_address[1]}/v1/traces", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        print(f"received {len(receiver.spans)} spans in {len(receiver.bodies)} exports", flush=True)


if __name__ == "__main__":
    main()
