"""The bounded multipart/form-data reader of the audio routes, checked against the reader vLLM's
audio routes take their form through (Starlette's `Request.form()`, on python-multipart): every
form the router accepts is read there with the same names, text values, filenames and file
sizes, however the body is cut into chunks; forms the two could read apart are refused."""

from __future__ import annotations

import asyncio
import random
import string
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st
from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException
from starlette.formparsers import MultiPartException
from starlette.requests import Request

from router.errors import BadRequest
from router.request.audiofacts import parse_audio_facts
from router.request.multipart import MAX_PARTS, boundary_of, parse_form, with_field
from router.request.tokens import PromptCosts, PromptCounter, Utf8ByteCounter
from tests.proxy.apistack import api_stack, client

# name -> its values in order; a file as (filename, size)
Reading = dict[str, list[str | tuple[str, int]]]
_FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
_CT = b"multipart/form-data; boundary=B"


def _part(name: str, value: bytes, filename: str | None = None) -> bytes:
    extra = f'; filename="{filename}"' if filename else ""
    return f'--B\r\nContent-Disposition: form-data; name="{name}"{extra}\r\n\r\n'.encode() + value + b"\r\n"


def _body(*parts: bytes) -> bytes:
    return b"".join(parts) + b"--B--\r\n"


def _raw_part(head: bytes, value: bytes = b"v") -> bytes:
    return b"--B\r\n" + head + b"\r\n\r\n" + value + b"\r\n"


# -- the two readers -------------------------------------------------------------------------------


def _router(content_type: bytes, body: bytes) -> Reading | None:
    """What the router reads, or None when it refuses the form."""
    try:
        form = parse_form(body, boundary_of(content_type))
    except BadRequest as err:
        assert err.code in ("invalid_multipart", "invalid_content_type"), err.code
        return None
    reading: Reading = {}
    for name, value in form.fields.items():
        reading[name] = list(value) if isinstance(value, list) else [value]
    for upload in form.files:
        reading.setdefault(upload.name, []).append((upload.filename, upload.size))
    return reading


def _starlette(content_type: bytes, body: bytes, cuts: Sequence[int] = ()) -> Reading | None:
    """What vLLM's reader reads from `body` arriving in pieces cut at `cuts`, or None on a 400."""
    return asyncio.run(_starlette_form(content_type, body, cuts))


async def _starlette_form(content_type: bytes, body: bytes, cuts: Sequence[int]) -> Reading | None:
    ends = sorted({c % (len(body) + 1) for c in cuts} | {len(body)})
    pieces = [body[a:b] for a, b in zip([0, *ends], ends, strict=False)]
    messages: list[dict[str, Any]] = [
        {"type": "http.request", "body": piece, "more_body": i < len(pieces) - 1}
        for i, piece in enumerate(pieces)
    ]

    async def receive() -> dict[str, Any]:
        return messages.pop(0)

    scope = {
        "type": "http",
        "method": "POST",
        "path": "/",
        "query_string": b"",
        "headers": [(b"content-type", content_type)],
    }
    request = Request(scope, receive)
    try:
        form = await request.form()
    except (HTTPException, MultiPartException):  # a 400 in vLLM
        return None
    reading: Reading = {}
    try:
        for name, value in form.multi_items():
            item = (value.filename or "", value.size or 0) if isinstance(value, UploadFile) else value
            reading.setdefault(name, []).append(item)
    finally:
        await form.close()
    return reading


def _agree(content_type: bytes, body: bytes, cuts: Sequence[int] = ()) -> Reading | None:
    """The router's reading; whenever it accepts, vLLM's reader must read the same form."""
    ours = _router(content_type, body)
    if ours is not None:
        assert _starlette(content_type, body, cuts) == ours, (content_type, body)
    return ours


# -- canonical forms -------------------------------------------------------------------------------

_BCHARS = string.ascii_letters + string.digits + "'()+_,-./:=? "
_TOKEN_CHARS = set(string.ascii_letters + string.digits + "!#$%&'*+-.^_`|~")
_NAME_CHARS = "".join(c for c in string.printable if c not in '"\\' and c.isprintable())
_FILENAME_CHARS = _NAME_CHARS + "éß中ü\u00a0"


def _quote(value: str, draw: Any) -> str:
    if value and set(value) <= _TOKEN_CHARS and draw(st.booleans()):
        return value
    return f'"{value}"'


@st.composite
def _canonical(draw: Any) -> tuple[bytes, bytes]:
    boundary = draw(st.text(_BCHARS, min_size=1, max_size=70).filter(lambda b: not b.endswith(" ")))
    kind = draw(st.sampled_from(["multipart/form-data", "Multipart/Form-Data", "MULTIPART/FORM-DATA"]))
    params = [f"boundary={_quote(boundary, draw)}"]
    if draw(st.booleans()):
        params.insert(
            draw(st.integers(0, 1)), f"charset={_quote(draw(st.sampled_from(['utf-8', 'UTF-8'])), draw)}"
        )
    content_type = kind + "".join(";" + " " * draw(st.integers(0, 2)) + p for p in params)
    marker = b"--" + boundary.encode()
    names = draw(st.lists(st.text(_NAME_CHARS, min_size=1, max_size=12), min_size=1, max_size=6, unique=True))
    repeats = draw(st.lists(st.sampled_from(["t[]", "u[]"]), max_size=3))
    parts = []
    for name in [*names, *repeats]:
        filename = None if name.endswith("[]") else draw(st.none() | st.text(_FILENAME_CHARS, max_size=12))
        disposition = f"form-data; name={_quote(name, draw)}"
        if filename is not None:
            disposition += ";" + " " * draw(st.integers(0, 2)) + f"filename={_quote(filename, draw)}"
        header = draw(st.sampled_from(["Content-Disposition", "content-disposition", "CONTENT-DISPOSITION"]))
        lines = [f"{header}:{' ' * draw(st.integers(0, 2))}{disposition}".encode()]
        media = ["text/plain", "text/plain; charset=utf-8", "Text/Plain;charset=UTF-8"]
        if filename is not None:
            media = ["audio/wav", "application/octet-stream", 'audio/x-wav; rate="16000"']
        if draw(st.booleans()):
            lines.insert(draw(st.integers(0, 1)), b"Content-Type: " + draw(st.sampled_from(media)).encode())
        if filename is None:
            value = draw(st.text(max_size=40)).encode()
        else:
            near = [b"\r\n", b"--", b"\r\n--", b"\r\n-" + marker[2:], marker[:-1], b"\r\n" + marker[:-1]]
            value = draw(st.binary(max_size=64) | st.sampled_from(near))
        assume(marker not in value)
        parts.append(marker + b"\r\n" + b"\r\n".join(lines) + b"\r\n\r\n" + value + b"\r\n")
    body = b"".join(parts) + marker + b"--" + draw(st.sampled_from([b"", b"\r\n"]))
    return content_type.encode(), body


_CUTS = st.lists(st.integers(min_value=0, max_value=10_000), max_size=6)


@_FUZZ
@given(_canonical(), _CUTS)
def test_a_canonical_form_is_accepted_and_read_alike(form: tuple[bytes, bytes], cuts: list[int]) -> None:
    content_type, body = form
    assert _agree(content_type, body, cuts) is not None


# -- forms near the canonical ones: whatever the router accepts is read alike ----------------------

_HOSTILE = [
    b"\\", b'"', b";", b" ", b"\t", b"\r", b"\n", b"\r\n", b"\r\n ", b"\r\n\t", b"\x00", b"\xff",
    "é".encode(),
    b"=", b"*", b":", b" :", b"--", b"\r\n--", b"; name=\"x\"", b'; filename="f"', b"; filename*=utf-8''f",
    b"; name*=utf-8''model", b'\\"', b"\\\\", b"\r\nX-A: b", b"\r\nContent-Transfer-Encoding: base64",
    b"\r\nContent-Disposition: form-data; name=\"y\"", b"\r\n\r\n", b"form-data", b"'", b"%22", b"[]",
]  # fmt: skip


@st.composite
def _mutated(draw: Any) -> tuple[bytes, bytes, list[int]]:
    content_type, body = draw(_canonical())
    boundary = boundary_of(content_type)
    # Places drawn evenly: hypothesis' own integers favour the ends of their range.
    spread = random.Random(draw(st.integers(0, 2**32)))
    for _ in range(draw(st.integers(1, 2))):
        target_type = spread.random() < 0.1
        text = content_type if target_type else body
        at = spread.randint(0, len(text))
        action = draw(st.sampled_from(["insert", "replace", "delete", "marker"]))
        if action == "marker":  # the boundary itself, somewhere it does not belong
            piece = b"--" + boundary[: draw(st.integers(1, 70))]
            text = text[:at] + draw(st.sampled_from([b"", b"\r\n", b"\n"])) + piece + text[at:]
        elif action == "delete":
            text = text[:at] + text[at + draw(st.integers(1, 4)) :]
        else:
            drop = 1 if action == "replace" else 0
            text = text[:at] + draw(st.sampled_from(_HOSTILE)) + text[at + drop :]
        if target_type:
            content_type = text
        else:
            body = text
    return content_type, body, draw(_CUTS)


@settings(_FUZZ, max_examples=1000)
@given(_mutated())
def test_whatever_the_router_accepts_vllms_reader_reads_alike(case: tuple[bytes, bytes, list[int]]) -> None:
    content_type, body, cuts = case
    event("accepted" if _agree(content_type, body, cuts) is not None else "refused")


def _pick(rnd: random.Random, usual: str, others: Sequence[str], odds: float = 0.8) -> str:
    return usual if rnd.random() < odds else rnd.choice(others)


@st.composite
def _disposition(draw: Any) -> bytes:
    """A Content-Disposition value of any parameters, quoted, escaped or not: mostly plain ones,
    so that a good share is accepted and compared."""
    rnd = random.Random(draw(st.integers(0, 2**32)))
    text = _pick(rnd, "form-data", ["Form-Data", "attachment", "", "form-data "], 0.9)
    for _ in range(rnd.randint(1, 4)):
        value = "".join(
            _pick(rnd, rnd.choice("abc"), [";", "=", " ", '"', "\\", "\\\\", '\\"', "*", "'", "é"], 0.85)
            for _ in range(rnd.randint(1, 6))
        )
        if rnd.random() < 0.7:
            value = f'"{value}"'
        text += _pick(rnd, "; ", [";", " ;", ";\t", ";;"])
        text += _pick(
            rnd, rnd.choice(["name", "filename"]), ["NAME", "filename*", "name*", "x", "z", ""], 0.7
        )
        text += _pick(rnd, "=", [" = ", "= "], 0.9) + value
    return text.encode()


@settings(_FUZZ, max_examples=1000)
@given(_disposition(), st.booleans())
def test_a_disposition_is_read_alike_or_refused(disposition: bytes, upload: bool) -> None:
    head = b"Content-Disposition: " + disposition
    model = _raw_part(b'Content-Disposition: form-data; name="model"')
    body = _body(model, _raw_part(head, b"RIFF" if upload else b"16"))
    event("accepted" if _agree(_CT, body) is not None else "refused")


# -- the explicit cases ---------------------------------------------------------------------------

_FINDING = rb'form-data; x="a\\"; name="language"; z="; name="max_completion_tokens"'


def test_a_disposition_that_vllm_reads_as_another_field_is_refused() -> None:
    body = _body(
        _raw_part(b'Content-Disposition: form-data; name="model"', b"whisper"),
        _raw_part(b'Content-Disposition: form-data; name="max_completion_tokens"', b"16"),
        _raw_part(b"Content-Disposition: " + _FINDING, b"100000"),
        _part("file", b"RIFF", "a.wav"),
    )
    # vLLM's reader takes the hidden part for the output bound, and keeps the last one.
    seen = _starlette(_CT, body)
    assert seen is not None and seen["max_completion_tokens"] == ["16", "100000"]
    with pytest.raises(BadRequest) as err:
        parse_form(body, b"B")
    assert err.value.code == "invalid_multipart"
    assert "quotes, backslashes" in err.value.message


_ATTACK_HEADS = [
    _FINDING,
    rb'form-data; x="a\\"; name="use_beam_search"; z="; name="n"',
    rb'form-data; x="\""; name="stream"',
    b'form-data; name="model"; name="n"',  # a parameter twice
    b'form-data; name="language"; NAME="n"',
    b'form-data; name="f"; filename="a.wav"; filename*=utf-8\'\'b.wav',
    b"form-data; name*=utf-8''n; name=\"language\"",
    b"form-data; name=language n",  # an unquoted value with a space
    b'form-data; name="a";',
    b'form-data;; name="a"',
    b'form-data; name = "a"',
    b'form-data; name="a" ',
    b'form-data;\tname="a"',
    b'attachment; name="a"',
    b'name="a"',
    b'form-data; name="a"; size=3',
    b'form-data; name="a\x00b"',
    b'form-data; name="\xc3\xa9"',  # a name that is not ASCII
    b'form-data; name="f"; filename="\xff.wav"',  # a filename that is not UTF-8
    b'form-data; name="a\nb"',
    b'form-data; name="a\rb"',
    b'form-data; name="C:\\\\x"',
    b'form-data; name=""',
]


@pytest.mark.parametrize("disposition", _ATTACK_HEADS)
def test_an_ambiguous_disposition_is_refused(disposition: bytes) -> None:
    body = _body(_raw_part(b"Content-Disposition: " + disposition))
    with pytest.raises(BadRequest) as err:
        parse_form(body, b"B")
    assert err.value.code == "invalid_multipart"


_CD = b'Content-Disposition: form-data; name="a"'
_ATTACK_HEADERS = [
    b"\r\n".join([_CD] + [b"X-Pad: %d" % i for i in range(100)]),  # 100 header lines
    b" " + _CD,  # a leading space
    b'Content-Disposition : form-data; name="a"',  # a space before the colon
    b'Content-Disposition\t: form-data; name="a"',
    b'Content-Disposition: form-data;\r\n name="a"',  # a continuation line
    b'Content-Disposition: form-data;\r\n\tname="a"',
    b'Content-Disposition: form-data; name="a"\nX: y',  # a bare LF
    b'Content-Disposition: form-data; name="b"\n' + _CD,
    b'Content-Disposition:\tform-data; name="a"',
    _CD + b"\r\n" + _CD,
    _CD + b'\r\nContent-Disposition: form-data; name="b"',
    _CD + b"\r\nContent-Transfer-Encoding: base64",
    _CD + b"\r\nContent-Type: text/plain; charset=utf-16",
    _CD + b"\r\nContent-Type: application/json",
    _CD + b"\r\nContent-Type: text/plain\r\nContent-Type: text/plain",
    _CD + b"\r\nContent-Length: 1",
    _CD + b"\r\nX-\xc3\xa9: 1",
    b'Content-Disposition: form-data; name="a"; filename="' + b"x" * 3000 + b'"',
    b"",  # no head at all
    b"Content-Type: text/plain",  # no disposition
    b": form-data",
]


@pytest.mark.parametrize("head", _ATTACK_HEADERS)
def test_a_part_head_vllm_could_read_otherwise_is_refused(head: bytes) -> None:
    body = _body(_raw_part(head))
    with pytest.raises(BadRequest) as err:
        parse_form(body, b"B")
    assert err.value.code == "invalid_multipart"


def test_a_100_line_head_is_refused_by_both_readers() -> None:
    body = _body(_raw_part(_ATTACK_HEADERS[0]))
    assert _starlette(_CT, body) is None
    assert _router(_CT, body) is None


_GOOD = _body(_part("model", b"m"), _part("file", b"RIFF", "a.wav"))
_ATTACK_BODIES = [
    b"preamble\r\n" + _GOOD,
    b"\r\n" + _GOOD,  # a preamble of a line end only
    _GOOD.replace(b"\r\n", b"\n"),  # LF line ends
    _GOOD.replace(b"m\r\n--B\r\n", b"m\r\n--B  \r\n"),  # transport padding
    _GOOD.replace(b"--B\r\n", b"--B \r\n", 1),
    _GOOD.replace(b"RIFF", b"RI\r\n--B-FF"),  # a near-boundary in a part
    _GOOD.replace(b"RIFF", b"RI\r\n--BFF"),
    _GOOD.replace(b"RIFF", b"RI--BFF"),
    _GOOD.replace(b"RIFF", b"RI\n--B\nFF"),
    _GOOD[: -len(b"\r\n--B--\r\n")],  # no closing delimiter
    _GOOD[: -len(b"--\r\n")],
    _GOOD + b"epilogue",  # data after the closing delimiter
    _GOOD + b"\r\n",
    _GOOD + _part("n", b"8") + b"--B--\r\n",
    _GOOD.replace(b"--B--\r\n", b"--B--\r\n--B--"),
    _body(_part("model", b"m"), _part("model", b"n"), _part("file", b"RIFF", "a.wav")),
    _body(_part("model", b"m"), _part("file", b"RIFF", "a.wav"), _part("file", b"x", "b.wav")),
    _body(_part("file", b"m"), _part("file", b"RIFF", "a.wav")),
    _body(_part("t[]", b"1"), _part("t[]", b"RIFF", "a.wav")),
]


@pytest.mark.parametrize("body", _ATTACK_BODIES)
def test_a_body_framed_otherwise_than_canonically_is_refused(body: bytes) -> None:
    with pytest.raises(BadRequest) as err:
        parse_form(body, b"B")
    assert err.value.code == "invalid_multipart"


@pytest.mark.parametrize(
    "content_type",
    [
        b"multipart/form-data; boundary=B; boundary=C",  # a boundary twice
        b'multipart/form-data; boundary="B"; boundary=C',
        b'multipart/form-data; boundary="B\\"C"',  # an escape
        b'multipart/form-data; boundary="B\\\\"',
        b'multipart/form-data; boundary="B',
        b"multipart/form-data; boundary*=utf-8''B; boundary=B",
        b"multipart/form-data; boundary=B; charset=latin-1",  # text read in another charset
        b"multipart/form-data; boundary=B; charset=utf-16",
        b"multipart/form-data; boundary=B;",
        b"multipart/form-data; boundary = B",
        b"multipart/form-data; boundary=B ",
        b"multipart/form-data;\tboundary=B",
        b" multipart/form-data; boundary=B",
        b"multipart/form-data ; boundary=B",
        b"multipart/form-data; boundary=B; x=y",
        b"multipart/form-data; boundary=B/C",  # not a token, unquoted
    ],
)
def test_a_content_type_read_two_ways_is_refused(content_type: bytes) -> None:
    with pytest.raises(BadRequest) as err:
        boundary_of(content_type)
    assert err.value.code == "invalid_multipart"


def test_the_finding_is_refused_where_the_router_read_another_field_before() -> None:
    """The router used to take this part for `language` while vLLM's reader took it for
    `max_completion_tokens`; now the form never gets past the reader."""
    body = _body(
        _raw_part(b'Content-Disposition: form-data; name="model"', b"whisper"),
        _raw_part(b"Content-Disposition: " + _FINDING, b"100000"),
        _part("file", b"RIFF", "a.wav"),
    )
    assert _starlette(_CT, body) == {
        "model": ["whisper"],
        "max_completion_tokens": ["100000"],
        "file": [("a.wav", 4)],
    }
    assert _router(_CT, body) is None


async def test_through_the_router_the_finding_never_reaches_vllm() -> None:
    model = _raw_part(b'Content-Disposition: form-data; name="model"', b"fake-model")
    visible = _raw_part(b'Content-Disposition: form-data; name="max_completion_tokens"', b"16")
    hidden = _raw_part(b"Content-Disposition: " + _FINDING, b"100000")
    upload = _part("file", b"RIFF", "a.wav")
    path, headers = "/v1/audio/transcriptions", {"content-type": _CT.decode()}
    async with api_stack(max_body_bytes=64 * 1024) as stack, client(stack.url) as http:
        resp = await http.post(path, content=_body(model, visible, hidden, upload), headers=headers)
        assert resp.status_code == 400, resp.text
        assert resp.json()["error"]["code"] == "invalid_multipart"
        assert stack.forwarded() == 0
        resp = await http.post(path, content=_body(model, visible, upload), headers=headers)
        assert resp.status_code == 200, resp.text
    # The backend reads forms with vLLM's reader: what it acted on is what the router judged.
    (seen,) = [u for b in stack.backends for u in b.api.uploads]
    assert seen.fields == {"model": "fake-model", "max_completion_tokens": "16"}


# -- what the reader finds ------------------------------------------------------------------------


def test_fields_and_the_file_are_found() -> None:
    upload = b"x-B\r\n-B\r\n--\r\nbinary"
    body = _body(
        _part("model", b"whisper"),
        _part("file", upload, "a.wav"),
        _part("t[]", b"1"),
        _part("t[]", b"2"),
    )
    form = parse_form(body, b"B")
    assert form.fields == {"model": "whisper", "t[]": ["1", "2"]}
    (found,) = form.files
    assert (found.name, found.filename, found.size) == ("file", "a.wav", len(upload))
    assert _agree(_CT, body) is not None


def test_common_clients_forms_are_accepted() -> None:
    head = b'Content-Disposition: form-data; name="file"; filename="clip.wav"\r\nContent-Type: audio/wav'
    for content_type, text_head in [
        (b"multipart/form-data; boundary=B", b'Content-Disposition: form-data; name="model"'),
        (b'multipart/form-data; boundary="B"', b"content-disposition: form-data; name=model"),
        (b"multipart/form-data;boundary=B;charset=UTF-8", b"Content-Disposition: form-data; name=model"),
        (
            b"multipart/form-data; boundary=B",
            b"Content-Type: text/plain; charset=utf-8\r\n" + _CD[:-3] + b'"model"',
        ),
    ]:
        body = _body(_raw_part(text_head, b"whisper"), _raw_part(head, b"RIFF"))
        assert _agree(content_type, body) == {"model": ["whisper"], "file": [("clip.wav", 4)]}, content_type


@pytest.mark.parametrize(
    "content_type",
    [
        None,
        b"application/json",
        b"multipart/form-data",
        b"multipart/form-data; boundary=",
        b"multipart/form-data; boundary=" + b"a" * 71,
    ],
)
def test_a_content_type_without_a_valid_boundary_is_refused(content_type: bytes | None) -> None:
    with pytest.raises(BadRequest):
        boundary_of(content_type)


def test_a_quoted_boundary_is_read() -> None:
    assert boundary_of(b'Multipart/Form-Data; charset=utf-8; boundary="a b:c"') == b"a b:c"


@pytest.mark.parametrize(
    "body",
    [
        b"preamble\r\n" + _body(_part("model", b"m")),  # a preamble
        _part("model", b"m"),  # no closing boundary
        _body(_part("model", b"m"), _part("model", b"n")),  # a repeated field
        _body(b"--B\r\nContent-Type: text/plain\r\n\r\nx\r\n"),  # no disposition
        _body(b"--B\r\nContent-Disposition: form-data\r\n\r\nx\r\n"),  # no name
        _body(_part("model", b"\xff\xfe")),  # not UTF-8
        _body(_part("a", b"x\r\n--Bjunk")),  # a delimiter followed by other bytes
        _body(*(_part(f"f{i}", b"x") for i in range(MAX_PARTS + 1))),
        _body(_part("big", b"x" * 70_000)),
        _body(_part("model", b"m")) + b"trailing",
    ],
)
def test_malformed_bodies_are_refused(body: bytes) -> None:
    with pytest.raises(BadRequest) as err:
        parse_form(body, b"B")
    assert err.value.code == "invalid_multipart"


def test_an_added_field_leaves_every_other_byte_as_sent() -> None:
    body = _body(_part("file", b"\x00\x01audio", "a.wav"))
    added = with_field(body, b"B", "max_completion_tokens", "12")
    assert added.startswith(body[: -len(b"\r\n--B--\r\n")])
    assert parse_form(added, b"B").fields == {"max_completion_tokens": "12"}
    assert _agree(_CT, added) == {"file": [("a.wav", 7)], "max_completion_tokens": ["12"]}


@pytest.mark.parametrize("value", ["²", "١٢", "1.5", "-1", "0", " 16"])
def test_an_integer_field_is_ascii_digits(value: str) -> None:
    body = _body(_part("model", b"m"), _part("n", value.encode()), _part("file", b"RIFF", "a.wav"))
    with pytest.raises(BadRequest) as err:
        parse_audio_facts("transcriptions", body, _CT, PromptCounter(Utf8ByteCounter(), PromptCosts()))
    assert err.value.code == "invalid_n"
