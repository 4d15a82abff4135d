"""Which response headers reach the client: an allowlist, not a list of what to drop.

A backend's headers speak for the backend — hop-by-hop fields, the fields its `Connection` names,
cookies, auth challenges, server banners — and none of that is the router's answer. Only what
describes the relayed body passes: `content-type`, and `content-length` where the body goes out
unchanged. Everything else the client sees (`x-request-id`, `x-lane-router-*`, `x-ratelimit-*`,
`retry-after`) comes from the router itself (`router.proxy.attempt.Attempt.response_headers`).
"""

from __future__ import annotations

from typing import Final

Headers = list[tuple[bytes, bytes]]

_SSE: Final = b"text/event-stream"


def client_headers(
    upstream: list[tuple[bytes, bytes]], own: list[tuple[bytes, bytes]]
) -> tuple[Headers, bool]:
    """The headers to answer with, and whether the body is a stream of server-sent events.

    A stream's `content-length` is dropped: a failure mid-stream appends an error event to it.
    So is a length that is not one plain decimal number."""
    content_type: bytes | None = None
    length: bytes | None = None
    lengths = 0
    for name, value in upstream:
        size = len(name)  # compares lengths first: most fields are neither of the two
        if size == 12 and name.lower() == b"content-type":
            content_type = value
        elif size == 14 and name.lower() == b"content-length":
            length = value
            lengths += 1
    headers: Headers = []
    is_sse = False
    if content_type is not None:
        headers.append((b"content-type", content_type))
        is_sse = content_type.lstrip()[:17].lower() == _SSE
    if length is not None and lengths == 1 and not is_sse and length.isdigit():
        headers.append((b"content-length", length))
    headers.extend(own)
    return headers, is_sse
