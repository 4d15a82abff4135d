"""The bounded multipart/form-data reader of the audio routes."""

from __future__ import annotations

import pytest

from router.errors import BadRequest
from router.multipart import MAX_PARTS, boundary_of, parse_form, with_field


def _part(name: str, value: bytes, filename: str | None = None) -> bytes:
    extra = f'; filename="{filename}"' if filename else ""
    return f'--B\r\nContent-Disposition: form-data; name="{name}"{extra}\r\n\r\n'.encode() + value + b"\r\n"


def _body(*parts: bytes) -> bytes:
    return b"".join(parts) + b"--B--\r\n"


def test_fields_and_the_file_are_found() -> None:
    body = _body(
        _part("model", b"whisper"),
        _part("file", b"x--B\r\nbinary", "a.wav"),
        _part("t[]", b"1"),
        _part("t[]", b"2"),
    )
    form = parse_form(body, b"B")
    assert form.fields == {"model": "whisper", "t[]": ["1", "2"]}
    (upload,) = form.files
    assert (upload.name, upload.filename, upload.size) == ("file", "a.wav", 12)


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
