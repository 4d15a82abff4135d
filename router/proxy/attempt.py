"""What one proxied request carries from admission to its response's end: its lane and ticket,
its body and target, the record its observers read, and the relay's own counts."""

from __future__ import annotations

from collections.abc import Callable

from router.app.asgi import BodyWriter
from router.lanes.lane import Lane
from router.lanes.poolgate import Ticket
from router.observe.leanmetrics import HistogramValue
from router.observe.record import RequestRecord
from router.proxy.chunklog import UsageTail


class Attempt:
    """One proxied request on its way to a backend and back: the state the relay and its caller
    share (the HTTP server's own per-request state is router/httpserver/exchange.py). A plain
    slotted class, not a dataclass: one is built per request, so `__init__` takes what the
    caller knows (positional is cheapest) and sets the relay's own state from constants."""

    __slots__ = (
        "accept",
        "answered",
        "body",
        "bytes_out",
        "client",
        "content_type",
        "first_byte_at",
        "gaps",
        "gaps_late",
        "gaps_timed",
        "lane",
        "method",
        "on_chunk",
        "prompt_tokens",
        "record",
        "request_id",
        "response_headers",
        "response_started",
        "started",
        "status",
        "stream",
        "target",
        "ticket",
        "trace_headers",
        "usage_tail",
        "writer",
    )

    def __init__(
        self,
        *,
        lane: Lane,
        target: bytes,
        body: bytes,
        request_id: bytes,
        accept: bytes | None,
        ticket: Ticket,
        started: float,
        response_headers: list[tuple[bytes, bytes]],
        gaps: HistogramValue,
        record: RequestRecord,
        stream: bool = True,
        prompt_tokens: int = 0,
        client: tuple[str, bytes | None, str | None] = ("", None, None),
        usage_tail: UsageTail | None = None,
        writer: BodyWriter | None = None,
        method: bytes = b"POST",
        trace_headers: tuple[tuple[bytes, bytes], ...] = (),
    ) -> None:
        self.lane = lane
        self.target = target
        self.body = body
        self.request_id = request_id
        self.accept = accept
        self.ticket = ticket
        self.started = started
        self.response_headers = response_headers
        self.gaps = gaps  # the stream's token gaps (its route's inter-token latency)
        self.record = record  # what the observers read at the end (router/observe/record.py)
        self.stream = stream
        self.prompt_tokens = prompt_tokens
        self.client = client  # key, X-Client-Id, address
        self.usage_tail = usage_tail  # the response's last bytes, kept when usage is wanted
        self.writer = writer  # the server's direct body writer, when it has one
        self.method = method
        self.trace_headers = trace_headers  # traceparent/tracestate for the backend
        self.content_type = b"application/json"
        self.on_chunk: Callable[[bytes], None] | None = None  # sees each upstream chunk (response ids)
        self.response_started = False
        self.first_byte_at: float | None = None
        self.status = 0
        self.bytes_out = 0  # the response's body bytes, set when its relay ends (router/proxy/respond.py)
        # The stream's timed chunk gaps, and those over its lane's ITL bound, set with bytes_out.
        self.gaps_timed = 0
        self.gaps_late = 0
        # The last body message went out: the server reports a disconnect from then on (ASGI),
        # and that is the exchange ending, not the client leaving.
        self.answered = False
