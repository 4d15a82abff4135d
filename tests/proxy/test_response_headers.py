"""The allowlist of response headers: what describes the relayed body, and the router's own."""

from __future__ import annotations

import pytest

from router.proxy.response_headers import client_headers

OWN = [(b"x-request-id", b"rid")]


@pytest.mark.parametrize(
    ("upstream", "expected", "sse"),
    [
        (
            [(b"Content-Type", b"application/json"), (b"Content-Length", b"12"), (b"Server", b"x")],
            [(b"content-type", b"application/json"), (b"content-length", b"12")],
            False,
        ),
        # A stream may be extended by an error event: its length cannot be promised.
        ([(b"content-type", b"Text/Event-Stream; charset=utf-8"), (b"content-length", b"9")], None, True),
        ([(b"content-length", b"12"), (b"content-length", b"12")], [], False),
        ([(b"content-length", b"+12")], [], False),
        ([(b"content-length", b"1 2")], [], False),
        ([(b"set-cookie", b"a=b"), (b"x-request-id", b"theirs"), (b"retry-after", b"9")], [], False),
    ],
    ids=["json", "sse", "two-lengths", "signed-length", "spaced-length", "backend-only"],
)
def test_client_headers(
    upstream: list[tuple[bytes, bytes]], expected: list[tuple[bytes, bytes]] | None, sse: bool
) -> None:
    headers, is_sse = client_headers(upstream, OWN)
    assert is_sse is sse
    if expected is None:
        expected = [(b"content-type", upstream[0][1])]
    assert headers == [*expected, *OWN]
