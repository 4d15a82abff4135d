"""A bounded reader of `multipart/form-data` request bodies (RFC 7578), for the audio routes.
Pure: the body is already in memory, within the profile's `max_body_bytes`.

Only what the router judges is decoded: each part's name, and the values of the text fields
(bounded, UTF-8). File parts are located, never copied or altered: the body goes upstream as
the client sent it. Anything a strict reader could take differently from vLLM's is refused —
a missing or malformed boundary, a preamble, a part without a name, a repeated field (except
array fields named `…[]`), more than MAX_PARTS parts, oversized part heads or field values."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from router.errors import BadRequest

MAX_PARTS = 64
MAX_PART_HEAD_BYTES = 8192
MAX_FIELD_BYTES = 65536

# RFC 2046 §5.1.1: 1–70 characters from this set, not ending in a space.
_BOUNDARY = re.compile(r"[0-9A-Za-z'()+_,\-./:=? ]{0,69}[0-9A-Za-z'()+_,\-./:=?]")
_PARAM = re.compile(r';\s*([A-Za-z0-9_\-*]+)\s*=\s*("(?:[^"\\\r\n]|\\.)*"|[^;\s]*)')
_CRLF = b"\r\n"


def _malformed(why: str) -> BadRequest:
    return BadRequest(f"malformed multipart/form-data body: {why}", code="invalid_multipart")


@dataclass(frozen=True, slots=True)
class FilePart:
    name: str
    filename: str
    size: int


@dataclass(frozen=True, slots=True)
class Form:
    fields: dict[str, str | list[str]] = field(default_factory=dict)
    files: tuple[FilePart, ...] = ()
    boundary: bytes = b""


def boundary_of(content_type: bytes | None) -> bytes:
    """The boundary of a `multipart/form-data` content type; 400 for anything else."""
    if content_type is None:
        raise BadRequest("this route takes multipart/form-data", code="invalid_content_type")
    text = content_type.decode("latin-1")
    kind, _, rest = text.partition(";")
    if kind.strip().lower() != "multipart/form-data":
        raise BadRequest("this route takes multipart/form-data", code="invalid_content_type")
    params = _params(";" + rest)
    value = params.get("boundary")
    if value is None or not _BOUNDARY.fullmatch(value):
        raise _malformed("the content type has no valid boundary")
    return value.encode("ascii")


def _params(text: str) -> dict[str, str]:
    found: dict[str, str] = {}
    for name, raw in _PARAM.findall(text):
        value = raw[1:-1].replace('\\"', '"').replace("\\\\", "\\") if raw.startswith('"') else raw
        found[name.lower()] = value
    return found


def parse_form(body: bytes, boundary: bytes) -> Form:
    delimiter = b"--" + boundary
    if not body.startswith(delimiter + _CRLF):
        raise _malformed("the body does not begin with its boundary")
    end = body.find(_CRLF + delimiter + b"--")
    if end < 0 or body[end + len(delimiter) + 4 :].strip(b"\r\n"):
        raise _malformed("the body does not end with its closing boundary")
    chunks = body[len(delimiter) + 2 : end].split(_CRLF + delimiter + _CRLF)
    if len(chunks) > MAX_PARTS:
        raise _malformed(f"more than {MAX_PARTS} parts")
    if any(_CRLF + delimiter in chunk for chunk in chunks):
        # A delimiter line followed by anything but CRLF: readers disagree on what it is.
        raise _malformed("a boundary line is followed by something other than a line end")
    fields: dict[str, str | list[str]] = {}
    files: list[FilePart] = []
    for chunk in chunks:
        name, filename, data = _part(chunk)
        if filename is not None:
            files.append(FilePart(name, filename, len(data)))
            continue
        _add_field(fields, name, data)
    return Form(fields, tuple(files), boundary)


def _part(chunk: bytes) -> tuple[str, str | None, bytes]:
    head_end = chunk.find(_CRLF + _CRLF)
    if head_end < 0 or head_end > MAX_PART_HEAD_BYTES:
        raise _malformed("a part has no head or one above 8 KiB")
    disposition = None
    for line in chunk[:head_end].split(_CRLF):
        name, sep, value = line.partition(b":")
        if not sep:
            raise _malformed("a part head line has no ':'")
        if name.strip().lower() == b"content-disposition":
            if disposition is not None:
                raise _malformed("a part has two Content-Disposition headers")
            disposition = value.decode("utf-8", "replace")
    if disposition is None:
        raise _malformed("a part has no Content-Disposition")
    kind, _, rest = disposition.partition(";")
    params = _params(";" + rest)
    if kind.strip().lower() != "form-data" or not params.get("name"):
        raise _malformed("a part is not form-data with a name")
    return params["name"], params.get("filename"), chunk[head_end + 4 :]


def _add_field(fields: dict[str, str | list[str]], name: str, data: bytes) -> None:
    if len(data) > MAX_FIELD_BYTES:
        raise _malformed(f"field {name!r} is larger than {MAX_FIELD_BYTES} bytes")
    try:
        value = data.decode("utf-8")
    except UnicodeDecodeError:
        raise _malformed(f"field {name!r} is not UTF-8 text") from None
    if name.endswith("[]"):
        listed = fields.setdefault(name, [])
        assert isinstance(listed, list)
        listed.append(value)
        return
    if name in fields:
        raise _malformed(f"field {name!r} appears twice")
    fields[name] = value


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
