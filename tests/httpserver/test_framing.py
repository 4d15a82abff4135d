"""Response heads and body framing, decided when the app starts its response."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest

from router.httpserver.framing import CHUNKED, LENGTH, NO_BODY, UNTIL_CLOSE, chunk, plan_response
from router.httpserver.wire import DateHeader


@dataclass
class Planned:
    head: bytes
    framing: int
    length: int
    keep_alive: bool
    event_stream: bool


def plan(status: int = 200, headers: list[tuple[bytes, bytes]] | None = None, **kw: bool) -> Planned:
    options = {"head_request": False, "http11": True, "keep_alive": True, **kw}
    return Planned(*plan_response(status, headers or [], date=DateHeader(), **options))


def test_a_length_is_kept_and_no_length_means_chunked_on_http_11() -> None:
    sized = plan(headers=[(b"content-length", b"5")])
    assert (sized.framing, sized.length) == (LENGTH, 5)
    assert b"transfer-encoding" not in sized.head
    streamed = plan(headers=[(b"Content-Type", b"text/event-stream; charset=utf-8")])
    assert streamed.framing == CHUNKED
    assert streamed.event_stream
    assert streamed.head.endswith(b"transfer-encoding: chunked\r\n\r\n")
    assert b"Content-Type: text/event-stream" in streamed.head  # the app's spelling, as given


def test_http_10_without_a_length_ends_with_the_connection() -> None:
    result = plan(http11=False)
    assert result.framing == UNTIL_CLOSE
    assert not result.keep_alive
    assert b"connection: close\r\n" in result.head
    kept = plan(headers=[(b"content-length", b"0")], http11=False)
    assert kept.keep_alive and b"connection: keep-alive\r\n" in kept.head


@pytest.mark.parametrize(("status", "head_request"), [(204, False), (304, False), (200, True)])
def test_bodiless_answers_are_not_framed(status: int, head_request: bool) -> None:
    result = plan(status, [(b"content-length", b"10")], head_request=head_request)
    assert result.framing == NO_BODY
    assert b"transfer-encoding" not in result.head


@pytest.mark.parametrize("spell", [bytes.lower, bytes.upper, bytes.title])
def test_the_headers_the_server_reads_are_read_in_any_case(spell: Callable[[bytes], bytes]) -> None:
    result = plan(
        headers=[
            (b"", b"nameless"),  # passed on as given: the server does not judge names
            (spell(b"content-length"), b"7"),
            (spell(b"transfer-encoding"), b"chunked"),
            (spell(b"connection"), b"close"),
            (spell(b"date"), b"then"),
            (spell(b"content-type"), b"text/event-stream"),
        ]
    )
    assert (result.framing, result.length, result.keep_alive, result.event_stream) == (LENGTH, 7, False, True)
    assert b"chunked" not in result.head and result.head.lower().count(b"date:") == 1


def test_the_server_owns_framing_and_connection_headers() -> None:
    result = plan(headers=[(b"transfer-encoding", b"gzip"), (b"Connection", b"close"), (b"date", b"then")])
    assert b"gzip" not in result.head
    assert result.head.count(b"connection: close") == 1 and not result.keep_alive
    assert result.head.count(b"date:") == 1 and b"date: then" in result.head


@pytest.mark.parametrize(
    "header",
    [
        (b"x-bad", b"a\r\nset-cookie: evil"),
        (b"x-bad\r\nx-injected", b"v"),
        (b"x-bad", b"a\nb"),
        (b"x-bad", b"a\rb"),
        (b"x-bad", b"\n\r"),
        (b"content-type\r", b"text/plain"),
        (b"\n", b"v"),
    ],
)
def test_cr_or_lf_in_a_header_is_refused(header: tuple[bytes, bytes]) -> None:
    with pytest.raises(RuntimeError, match="CR or LF"):
        plan(headers=[header])
    # Wherever it stands among others, the server's own headers included.
    around = [(b"x-a", b"1"), (b"content-type", b"text/event-stream"), header, (b"date", b"then")]
    with pytest.raises(RuntimeError, match="CR or LF"):
        plan(headers=around)
    with pytest.raises(RuntimeError, match="CR or LF"):
        plan(headers=[*around[::-1], (b"x-last", b"ok")])


def test_invalid_lengths_and_statuses_are_refused() -> None:
    with pytest.raises(RuntimeError):
        plan(headers=[(b"content-length", b"-1")])
    with pytest.raises(RuntimeError):
        plan(101)
    assert plan(599).head.startswith(b"HTTP/1.1 599 \r\n")


def test_chunks() -> None:
    assert chunk(b"hello", False) == b"5\r\nhello\r\n"
    assert chunk(b"x" * 26, True) == b"1a\r\n" + b"x" * 26 + b"\r\n0\r\n\r\n"
