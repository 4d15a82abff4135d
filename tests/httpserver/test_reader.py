"""The reader's own reading of a request line's version, held to the parser's: where it names
one for a head the parser reads, it is the one the parser reads."""

from __future__ import annotations

import httptools
from hypothesis import given
from hypothesis import strategies as st

from router.httpserver.reader import line_version


class _Heads:
    def __init__(self) -> None:
        self.complete = 0

    def on_headers_complete(self) -> None:
        self.complete += 1


def _parsed_version(data: bytes) -> str | None:
    """The version httptools reads from `data`'s first request head, None if it reads none."""
    heads = _Heads()
    parser = httptools.HttpRequestParser(heads)
    try:
        parser.feed_data(data)
    except httptools.HttpParserError:
        return None
    return parser.get_http_version() if heads.complete else None


_METHOD = st.sampled_from([b"GET", b"POST", b"HEAD", b"OPTIONS"])
_TARGET = st.sampled_from([b"/", b"/v1/chat/completions", b"/a?x=HTTP/1.1", b"*", b"/p%20q"])
_VERSION = st.sampled_from([b"1.1", b"1.0", b"0.9", b"2.0", b"1.2", b"11", b"1.1 ", b""])
_LEAD = st.sampled_from([b"", b"\r\n", b" "])


@given(_LEAD, _METHOD, _TARGET, _VERSION, st.integers(min_value=0, max_value=60))
def test_a_version_read_from_the_line_is_the_parsers(
    lead: bytes, method: bytes, target: bytes, version: bytes, cut: int
) -> None:
    head = lead + method + b" " + target + b" HTTP/" + version + b"\r\nHost: t\r\n\r\n"
    read = head[:cut] if cut else head
    named, parsed = line_version(read), _parsed_version(head)
    # Where the parser refuses the line, no head completes and no version is asked for.
    if named is not None and parsed is not None:
        assert named == parsed


def test_only_a_whole_line_naming_1_1_or_1_0_is_read() -> None:
    assert line_version(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n") == "1.1"
    assert line_version(b"POST /v1/chat/completions HTTP/1.0\r\n") == "1.0"
    assert line_version(b"GET / HTTP/1.1") is None  # the line's end not read yet
    assert line_version(b"\r\nGET / HTTP/1.1\r\n") is None  # an empty line before it
    assert line_version(b"GET / HTTP/2.0\r\n") is None
    assert line_version(b"") is None
