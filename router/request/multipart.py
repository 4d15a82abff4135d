"""A bounded reader of `multipart/form-data` request bodies (RFC 7578), for the audio routes.
Pure: the body is already in memory, within the profile's `max_body_bytes`.

Only what the router judges is decoded: each part's name, and the values of the text fields
(bounded, UTF-8). File parts are located, never copied or altered: the body goes upstream as
the client sent it. So that vLLM reads the very form the router judged, only a canonical form
is accepted and everything else is refused, however a lenient reader would take it:

- the request's content type is `multipart/form-data` with a `boundary` and at most a
  `charset=utf-8`, each once;
- the body begins with its first boundary line and ends with the closing one (a CRLF may follow);
  the boundary appears nowhere else, and every boundary line ends in CRLF;
- a part's head holds only `Content-Disposition: form-data` with a `name` and at most a
  `filename`, each once, and at most a `Content-Type` (a text field's is `text/plain`, UTF-8);
- header names are tokens followed directly by the colon, lines end in CRLF, values hold no
  control characters; a parameter's value is a token or a quoted string without quotes or
  backslashes inside, so no escape is ever read; a name is ASCII, a filename UTF-8;
- a name appears once (text fields named `…[]` excepted), there are at most MAX_PARTS parts,
  head lines and field values are bounded."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from router.errors import BadRequest

MAX_PARTS = 64
MAX_HEAD_LINE_BYTES = 2048
MAX_FIELD_BYTES = 65536

_CRLF = b"\r\n"
_TOKEN = rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+"
# A quoted string with neither a quote nor a backslash inside, nor a control character: readers
# that unescape and readers that do not read it alike.
_QUOTED = rb'"[\x20\x21\x23-\x5b\x5d-\x7e\x80-\xff]*"'
_PARAM = re.compile(rb";[ ]*(" + _TOKEN + rb")=(" + _TOKEN + rb"|" + _QUOTED + rb")")
_HEADER = re.compile(rb"(" + _TOKEN + rb"):[ ]*([^\x00-\x1f\x7f]*)")
_MEDIA = re.compile(_TOKEN + rb"/" + _TOKEN)
# RFC 2046 §5.1.1: 1–70 characters from this set, not ending in a space.
_BOUNDARY = re.compile(rb"[0-9A-Za-z'()+_,\-./:=? ]{0,69}[0-9A-Za-z'()+_,\-./:=?]")
_FORM_DATA = b"form-data"
_MULTIPART = b"multipart/form-data"
_UTF8 = b"utf-8"


def _malformed(why: str) -> BadRequest:
    return BadRequest(f"malformed multipart/form-data body: {why}", code="invalid_multipart")


@dataclass(frozen=True, slots=True)
class FilePart:
    name: str
    filename: str
    size: int
    # Where the file's bytes begin in the body: read in place, never copied.
    start: int


@dataclass(frozen=True, slots=True)
class Form:
    fields: dict[str, str | list[str]] = field(default_factory=dict)
    files: tuple[FilePart, ...] = ()
    boundary: bytes = b""


def boundary_of(content_type: bytes | None) -> bytes:
    """The boundary of a `multipart/form-data` content type; 400 for anything else."""
    if content_type is None:
        raise BadRequest("this route takes multipart/form-data", code="invalid_content_type")
    kind, sep, rest = content_type.partition(b";")
    if kind.lower() != _MULTIPART:
        if kind.strip(b" \t").lower() == _MULTIPART:
            raise _malformed("the content type has spaces around multipart/form-data")
        raise BadRequest("this route takes multipart/form-data", code="invalid_content_type")
    params = _parameters(sep + rest, _TYPE_PARAMS, "the content type")
    charset = params.get(b"charset")
    if charset is not None and charset.lower() != _UTF8:
        raise _malformed("form fields are read as UTF-8: the content type's charset must be utf-8")
    value = params.get(b"boundary")
    if value is None or not _BOUNDARY.fullmatch(value):
        raise _malformed("the content type has no valid boundary")
    return value


_TYPE_PARAMS = frozenset({b"boundary", b"charset"})
_DISPOSITION_PARAMS = frozenset({b"name", b"filename"})


def _parameters(text: bytes, allowed: frozenset[bytes] | None, where: str) -> dict[bytes, bytes]:
    """`; key=value` pairs making up all of `text`, keys lowercased; each key at most once."""
    found: dict[bytes, bytes] = {}
    at = 0
    while at < len(text):
        match = _PARAM.match(text, at)
        if match is None:
            raise _malformed(
                f'{where} has a parameter that is not key=token or key="text" '
                "(no quotes, backslashes or control characters inside)"
            )
        key, value = match[1].lower(), match[2]
        if allowed is not None and key not in allowed:
            raise _malformed(f"{where} has a parameter {key.decode()!r}, which is not read here")
        if key in found:
            raise _malformed(f"{where} has the parameter {key.decode()!r} twice")
        found[key] = value[1:-1] if value.startswith(b'"') else value
        at = match.end()
    return found


def parse_form(body: bytes, boundary: bytes) -> Form:
    fields: dict[str, str | list[str]] = {}
    files: list[FilePart] = []
    for start, end in _spans(body, boundary):
        name, filename, content = _part(body, start, end)
        if filename is not None:
            _claim(fields, files, name)
            files.append(FilePart(name, filename, end - content, content))
            continue
        _add_field(fields, files, name, body[content:end])
    return Form(fields, tuple(files), boundary)


def _spans(body: bytes, boundary: bytes) -> list[tuple[int, int]]:
    """Where each part (head and content) lies, between delimiter lines that all end in CRLF.
    Spans, not copies: an upload is never copied."""
    marker = b"--" + boundary
    if not body.startswith(marker + _CRLF):
        raise _malformed("the body does not begin with its boundary line")
    delimiter = _CRLF + marker
    spans: list[tuple[int, int]] = []
    at = len(marker) + 2
    while True:
        end = body.find(delimiter, at)
        if end < 0:
            raise _malformed("the body does not end with its closing boundary line")
        # Anywhere but on its own line, the boundary is where lenient readers part ways.
        if body.find(marker, at, end) >= 0:
            raise _malformed("the boundary appears inside a part")
        spans.append((at, end))
        if len(spans) > MAX_PARTS:
            raise _malformed(f"more than {MAX_PARTS} parts")
        after = end + len(delimiter)
        follows = body[after : after + 2]
        if follows == _CRLF:
            at = after + 2
        elif follows == b"--":
            if body[after + 2 :] not in (b"", _CRLF):
                raise _malformed("bytes follow the closing boundary line")
            return spans
        else:
            raise _malformed("a boundary line is followed by something other than CRLF")


def _part(body: bytes, start: int, end: int) -> tuple[str, str | None, int]:
    """A part's name, its filename if it is an upload, and where its content starts."""
    head_end = body.find(_CRLF + _CRLF, start, end)
    if head_end < 0:
        raise _malformed("a part's head does not end with an empty line")
    disposition: bytes | None = None
    media: bytes | None = None
    for line in body[start:head_end].split(_CRLF):
        header, value = _header_line(line)
        if header == b"content-disposition" and disposition is None:
            disposition = value
        elif header == b"content-type" and media is None:
            media = value
        elif header in (b"content-disposition", b"content-type"):
            raise _malformed(f"a part has two {header.decode()} headers")
        else:
            raise _malformed(
                f"a part has a {header.decode()} header: only Content-Disposition and Content-Type are read"
            )
    if disposition is None:
        raise _malformed("a part has no Content-Disposition")
    name, filename = _disposition(disposition)
    if media is not None:
        _check_media(media, text=filename is None)
    return name, filename, head_end + 4


def _header_line(line: bytes) -> tuple[bytes, bytes]:
    if len(line) > MAX_HEAD_LINE_BYTES:
        raise _malformed(f"a part head line is longer than {MAX_HEAD_LINE_BYTES} bytes")
    match = _HEADER.fullmatch(line)
    if match is None:
        raise _malformed(
            "a part head line is not 'Name: value' (a token name directly before the colon, "
            "no control characters, CRLF line ends)"
        )
    return match[1].lower(), match[2]


def _disposition(value: bytes) -> tuple[str, str | None]:
    if value[: len(_FORM_DATA)].lower() != _FORM_DATA:
        raise _malformed("a part's Content-Disposition is not form-data")
    params = _parameters(value[len(_FORM_DATA) :], _DISPOSITION_PARAMS, "a part's Content-Disposition")
    name = params.get(b"name")
    if not name:
        raise _malformed("a part has no name")
    if not name.isascii():
        raise _malformed("a part's name is not ASCII")
    filename = params.get(b"filename")
    if filename is None:
        return name.decode("ascii"), None
    try:
        return name.decode("ascii"), filename.decode("utf-8")
    except UnicodeDecodeError:
        raise _malformed("a filename is not UTF-8") from None


def _check_media(value: bytes, *, text: bool) -> None:
    match = _MEDIA.match(value)
    if match is None:
        raise _malformed("a part's Content-Type is not type/subtype")
    params = _parameters(value[match.end() :], None, "a part's Content-Type")
    if not text:
        return
    # A text field is decoded as UTF-8, as vLLM's reader does: it may not claim otherwise.
    charset = params.pop(b"charset", _UTF8)
    if match[0].lower() != b"text/plain" or params or charset.lower() != _UTF8:
        raise _malformed("a text field's Content-Type may only be text/plain; charset=utf-8")


def _claim(fields: dict[str, str | list[str]], files: list[FilePart], name: str) -> None:
    if name in fields or any(f.name == name for f in files):
        raise _malformed(f"the name {name!r} appears twice")


def _add_field(fields: dict[str, str | list[str]], files: list[FilePart], name: str, data: bytes) -> None:
    if len(data) > MAX_FIELD_BYTES:
        raise _malformed(f"field {name!r} is larger than {MAX_FIELD_BYTES} bytes")
    try:
        value = data.decode("utf-8")
    except UnicodeDecodeError:
        raise _malformed(f"field {name!r} is not UTF-8 text") from None
    listed = fields.get(name)
    if name.endswith("[]") and isinstance(listed, list):
        listed.append(value)
        return
    _claim(fields, files, name)
    fields[name] = [value] if name.endswith("[]") else value


def with_field(body: bytes, boundary: bytes, name: str, value: str) -> bytes:
    """`body` with one more text field before its closing boundary; every other byte as sent."""
    closing = _CRLF + b"--" + boundary + b"--"
    at = body.rfind(closing)
    part = (
        _CRLF + b"--" + boundary + _CRLF
        + f'Content-Disposition: form-data; name="{name}"'.encode() + _CRLF + _CRLF
        + value.encode()
    )  # fmt: skip
    return body[:at] + part + body[at:]
