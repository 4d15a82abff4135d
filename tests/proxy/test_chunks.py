"""Whole chunks read without the parser: what is taken must be exactly what the parser makes of
the same bytes from the start of a chunk, and everything else must be left to the parser — both
checked against httptools itself, and through the upstream client on a backend that writes one
chunk per read."""

from __future__ import annotations

import asyncio
import itertools

import pytest
from httptools import HttpParserError, HttpResponseParser
from hypothesis import given, settings
from hypothesis import strategies as st

from router.errors import UpstreamError, UpstreamProtocolError
from router.proxy.chunks import one_chunk, whole_chunks
from router.proxy.limits import ResponseLimits
from router.proxy.upstream import UpstreamPool
from router.proxy.upstream_connection import UpstreamConnection
from tests.proxy.rawserver import Handler, RawServer, ServeFn

HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


class _Reading:
    """What httptools makes of a response, up to the end of its message: bytes after it are a
    second response nobody asked for, which the connection does not read."""

    def __init__(self) -> None:
        self.body = bytearray()
        self.complete = False
        self.parser = HttpResponseParser(self)

    def on_body(self, body: bytes) -> None:
        if not self.complete:
            self.body += body

    def on_message_complete(self) -> None:
        self.complete = True


def _parser_reads(data: bytes) -> tuple[bytes, bool] | None:
    """The body the parser reads from `data`, and whether it then stands at a chunk's start (the
    last chunk that follows ends the message with nothing more); None if it fails."""
    parsed = _Reading()
    try:
        parsed.parser.feed_data(HEAD + data)
        body, complete = bytes(parsed.body), parsed.complete
        parsed.parser.feed_data(b"0\r\n\r\n")
    except HttpParserError:
        return None
    return body, not complete and parsed.complete and bytes(parsed.body) == body


@pytest.mark.parametrize(
    ("data", "pieces"),
    [
        (b"5\r\nhello\r\n", [b"hello"]),
        (b"5\r\nhello\r\n1\r\n!\r\n", [b"hello", b"!"]),
        (b"A\r\n0123456789\r\n", [b"0123456789"]),
        (b"000a\r\n0123456789\r\n", [b"0123456789"]),
        (b"4\r\n\r\n\r\n\r\n", [b"\r\n\r\n"]),  # a payload of line ends is payload
    ],
)
def test_whole_chunks_are_taken(data: bytes, pieces: list[bytes]) -> None:
    assert whole_chunks(data) == (pieces, len(data))
    assert _parser_reads(data) == (b"".join(pieces), True)
    start = one_chunk(data)
    assert (data[start:-2] if start > 0 else None) == (pieces[0] if len(pieces) == 1 else None)


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"0\r\n\r\n",  # the last chunk: the parser ends the message
        b"5\r\nhello\r\n0\r\n\r\n",
        b"5\r\nhell",  # cut by the read
        b"5\r\nhello\r",
        b"5\r\nhello\r\n5",
        b"5;ext=1\r\nhello\r\n",  # an extension
        b"5 \r\nhello\r\n",
        b" 5\r\nhello\r\n",
        b"5\nhello\r\n",  # bare LF
        b"5\r\nhello\n",
        b"5\r\nhelloX\r\n",
        b"+5\r\nhello\r\n",
        b"0x5\r\nhello\r\n",
        b"g\r\nhello\r\n",
        b"000000005\r\nhello\r\n",  # nine digits
        b"ffffffff\r\nhello\r\n",
    ],
)
def test_anything_else_is_left_to_the_parser(data: bytes) -> None:
    pieces, taken = whole_chunks(data)
    assert taken < len(data) or not data
    assert one_chunk(data) == -1
    if taken:  # the whole chunks before it are taken, and the parser starts after them
        assert _parser_reads(data[:taken]) == (b"".join(pieces), True)


_CHUNK = st.binary(min_size=1, max_size=40).map(lambda p: b"%x\r\n%b\r\n" % (len(p), p))
_NOISE = st.sampled_from([b"\r", b"\n", b"\r\n", b"0", b"9", b"a", b"F", b"g", b";", b" ", b"0\r\n\r\n"])


@st.composite
def _near_chunk(draw: st.DrawFn) -> bytes:
    """A chunk, or one with its size, size line or end a little wrong."""
    payload = draw(st.binary(min_size=0, max_size=20))
    size = len(payload) + draw(st.sampled_from([0, 0, 0, 1, -1]))
    digits = draw(st.sampled_from([b"%x", b"%X", b"0%x", b"%x;e=1", b"%x ", b"%x\r"]))
    line_end = draw(st.sampled_from([b"\r\n", b"\r\n", b"\n", b"\r", b"\rX"]))
    end = draw(st.sampled_from([b"\r\n", b"\r\n", b"\n", b"\r", b"\rX", b"", b"\r\n\r\n"]))
    return (digits % max(size, 0)) + line_end + payload + end


@settings(max_examples=3000, deadline=None)
@given(
    st.lists(st.one_of(_CHUNK, _near_chunk(), _NOISE, st.binary(max_size=4)), min_size=1, max_size=6).map(
        b"".join
    ),
    st.integers(min_value=0, max_value=64),
)
def test_what_is_taken_is_what_the_parser_reads(data: bytes, cut: int) -> None:
    for read in (data, data[:cut], data[cut:]):
        pieces, taken = whole_chunks(read)
        assert _parser_reads(read[:taken]) == (b"".join(pieces), True)
        # One whole chunk and nothing else, or -1: what the paced path takes the parser reads too.
        start = one_chunk(read)
        one = len(pieces) == 1 and taken == len(read)
        assert (read[start:-2] if start > 0 else None) == (pieces[0] if one else None)


@settings(max_examples=500, deadline=None)
@given(st.lists(_CHUNK, min_size=1, max_size=8))
def test_every_run_of_whole_chunks_is_taken(chunks: list[bytes]) -> None:
    data = b"".join(chunks)
    pieces, taken = whole_chunks(data)
    assert (len(pieces), taken) == (len(chunks), len(data))


def _lockstep(chunks: list[bytes], acks: asyncio.Queue[None]) -> Handler:
    """A backend that writes the head, then each chunk only once the client has taken the one
    before: every chunk reaches the router in a read of its own."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: RawServer) -> None:
        await server.next_request(reader)
        writer.write(HEAD)
        for chunk in chunks:
            await acks.get()
            writer.write(chunk)
            await writer.drain()
        await server.wait_eof(reader)

    return handler


async def _relay(serve: ServeFn, chunks: list[bytes]) -> list[bytes]:
    acks: asyncio.Queue[None] = asyncio.Queue()
    server = await serve(_lockstep(chunks, acks))
    got: list[bytes] = []
    async with UpstreamPool(server.origin, label="pool 'p' backend 0") as pool:
        response = await pool.request(b"POST", b"/", [], b"{}")
        try:
            acks.put_nowait(None)
            async for piece in response:
                got.append(piece)
                acks.put_nowait(None)
        finally:
            await response.aclose()
    return got


async def test_a_paced_stream_relays_every_chunk_and_ends(serve: ServeFn) -> None:
    events = [b"data: %d\n\n" % i for i in range(20)]
    chunks = [b"%x\r\n%b\r\n" % (len(e), e) for e in events]
    chunks[7] = b"%x;ext=1\r\n%b\r\n" % (len(events[7]), events[7])  # the parser's, mid-stream
    got = await _relay(serve, [*chunks, b"0\r\n\r\n"])
    assert b"".join(got) == b"".join(events)


@pytest.mark.parametrize(
    "bad",
    [b"zz\r\nhello\r\n", b"5\r\nhelloXY", b"5\nhello\r\n", b"5\r\nhello\r\n\r\n"],
    ids=["size", "payload-end", "bare-lf", "empty-size-line"],
)
async def test_broken_framing_after_paced_chunks_fails_the_stream(serve: ServeFn, bad: bytes) -> None:
    chunks = [b"8\r\ndata: 1\n\r\n", b"8\r\ndata: 2\n\r\n", bad, b"8\r\ndata: 3\n\r\n", b"0\r\n\r\n"]
    with pytest.raises(UpstreamProtocolError, match="malformed response"):
        await _relay(serve, chunks)


class _Transport(asyncio.Transport):
    """What the upstream connection writes to and closes: nothing reaches a socket."""

    def __init__(self) -> None:
        super().__init__()
        self.closing = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        pass

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def abort(self) -> None:
        self.closing = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def _connection_reads(reads: list[bytes]) -> tuple[bytes, bool, bool]:
    """The body, completion and failure the upstream connection makes of a response arriving in
    `reads`: the bytes a read delivers are taken before the next read comes."""
    loop = asyncio.new_event_loop()
    try:
        conn = UpstreamConnection(loop, ResponseLimits(), "pool 'p' backend 0", lambda _: None)
        conn.connection_made(_Transport())
        conn.send(b"POST / HTTP/1.1\r\n\r\n", b"", head_request=False)
        body = bytearray()
        for read in reads:
            conn.data_received(read)
            try:
                while piece := conn.take():
                    body += piece
            except UpstreamError:
                return bytes(body), False, True
        return bytes(body), conn.drained, False
    finally:
        loop.close()


def _parsed_whole(response: bytes) -> tuple[bytes, bool, bool]:
    """What httptools makes of the response fed in one piece."""
    whole = _Reading()
    try:
        whole.parser.feed_data(response)
    except HttpParserError:
        return bytes(whole.body), whole.complete, not whole.complete
    return bytes(whole.body), whole.complete, False


@settings(max_examples=1500, deadline=None)
@given(
    st.lists(st.one_of(_CHUNK, _CHUNK, _CHUNK, _near_chunk()), min_size=1, max_size=8).map(b"".join),
    st.lists(st.integers(min_value=1, max_value=600), max_size=12),
)
def test_a_response_split_into_any_reads_is_read_as_the_parser_reads_it_whole(
    chunks: bytes, cuts: list[int]
) -> None:
    """Wherever the reads split the response (inside a size line, a payload, its CRLF, the head),
    the connection knows whether the parser stands at a chunk's start."""
    response = HEAD + chunks + b"0\r\n\r\n"
    edges = [0, *sorted({c for c in cuts if c < len(response)}), len(response)]
    reads = [response[a:b] for a, b in itertools.pairwise(edges) if b > a]
    body, complete, failed = _parsed_whole(response)
    got_body, got_complete, got_failed = _connection_reads(reads)
    assert (got_failed, got_complete) == (failed, complete)
    assert got_body == body if not failed else body.startswith(got_body)


_PAYLOAD = b"X\r\n" + b"0123456789abcd"  # 17 bytes whose start reads as a whole chunk "1\r\nX\r\n"


@pytest.mark.parametrize(
    "reads",
    [
        # The head's read ends inside the first size line ("11"): the next read is no chunk start.
        [HEAD + b"1", b"1\r\nX\r\n", _PAYLOAD[3:] + b"\r\n0\r\n\r\n"],
        # A read the parser took ends inside a size line: so does the connection's knowledge.
        [HEAD, b"5\r\nhello\r\n1", b"1\r\nX\r\n", _PAYLOAD[3:] + b"\r\n0\r\n\r\n"],
        # ... and inside a payload.
        [HEAD, b"11\r\nX", b"\r\n", b"1\r\nX\r\n", b"01234567\r\n0\r\n\r\n"],
    ],
    ids=["head-read", "size-line", "payload"],
)
def test_a_read_that_looks_like_a_chunk_mid_chunk_is_the_parsers(reads: list[bytes]) -> None:
    response = b"".join(reads)
    body, complete, failed = _parsed_whole(response)
    assert complete and not failed
    assert _connection_reads(reads) == (body, True, False)


@pytest.mark.parametrize(
    "head",
    [
        b"HTTP/1.1 200 OK\r\nContent-Length: 20\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: identity\r\n\r\n",
    ],
    ids=["length", "not-last-coding"],
)
def test_a_body_that_is_not_chunked_last_is_never_read_as_chunks(head: bytes) -> None:
    reads = [head, b"5\r\nhello\r\n", b"5\r\nworld\r\n"]
    body = b"".join(reads[1:])
    assert _parsed_whole(b"".join(reads))[0] == body  # the parser's reading: no chunks
    assert _connection_reads(reads)[0] == body
