"""The request headers the router reads, whatever case the server hands their names in."""

from __future__ import annotations

import pytest

from router.errors import BadRequest
from router.proxy.intake import Headers


def test_names_in_any_case_are_read_alike() -> None:
    raw = [
        (b"Host", b"h"),
        (b"user-agent", b"sdk"),
        (b"Authorization", b"Bearer a"),
        (b"x-request-class", b"chat"),
        (b"X-Client-Id", b"c"),
        (b"content-length", b"2"),
        (b"Accept", b"text/event-stream"),
        (b"TraceParent", b"00-a"),
        (b"tracestate", b"k=v"),
        (b"x-unknown", b"u"),
    ]
    headers = Headers(raw)
    assert headers.authorization == b"Bearer a"
    assert headers.request_class == b"chat"
    assert headers.client_id == b"c"
    assert (headers.session_id, headers.content_type, headers.request_id) == (None, None, None)
    assert headers.content_length == b"2"
    assert headers.accept == b"text/event-stream"
    assert headers.trace == [(b"traceparent", b"00-a"), (b"tracestate", b"k=v")]


def test_headers_not_read_may_repeat() -> None:
    headers = Headers([(b"host", b"a"), (b"Host", b"b"), (b"connection", b"x"), (b"accept", b"*/*")])
    assert headers.accept == b"*/*"
    assert headers.authorization is None and headers.trace is None


@pytest.mark.parametrize("second", [b"authorization", b"AUTHORIZATION"])
def test_a_second_copy_of_a_deciding_header_is_refused(second: bytes) -> None:
    with pytest.raises(BadRequest) as refused:
        Headers([(b"authorization", b"Bearer a"), (second, b"Bearer b")])
    assert refused.value.code == "duplicate_header"
    assert "more than one authorization header" in str(refused.value)
