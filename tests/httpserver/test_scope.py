"""Request targets into the scope's path, raw_path and query_string."""

from __future__ import annotations

import pytest

from router.httpserver.scope import split_target


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        (b"/v1/chat/completions", ("/v1/chat/completions", b"/v1/chat/completions", b"")),
        (b"/a%20b?x=1&y=%20", ("/a b", b"/a%20b", b"x=1&y=%20")),
        (b"/%C3%A9t%C3%A9", ("/été", b"/%C3%A9t%C3%A9", b"")),
        (b"/v1/%2e%2e/invocations", ("/v1/../invocations", b"/v1/%2e%2e/invocations", b"")),
        (b"/p#frag", ("/p", b"/p", b"")),
        (b"/p?q=1#frag", ("/p", b"/p", b"q=1")),
        (b"http://host:8080/p/q?r=s", ("/p/q", b"/p/q", b"r=s")),
        (b"http://host", ("/", b"/", b"")),
        (b"*", ("*", b"*", b"")),
        (b"example.com:443", ("example.com:443", b"example.com:443", b"")),
    ],
)
def test_targets(target: bytes, expected: tuple[str, bytes, bytes]) -> None:
    assert split_target(target) == expected
