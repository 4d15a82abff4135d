"""HTTP/1.1 wire details of the upstream client: origins, request heads, response framing."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final
from urllib.parse import urlsplit

# Methods whose requests carry a Content-Length even when the body is empty.
_BODY_METHODS: Final = frozenset((b"POST", b"PUT", b"PATCH"))
# The lengths of the names `build_head` looks at (host, content-length, transfer-encoding): a name
# of another length is passed on without being lowered first.
_FRAMING_SIZES: Final = frozenset((4, 14, 17))


@dataclass(frozen=True, slots=True)
class Origin:
    host: str
    port: int
    host_header: bytes
    tls: bool = False

    def __str__(self) -> str:
        return ("https://" if self.tls else "http://") + self.host_header.decode("ascii")


def parse_origin(origin: str) -> Origin:
    """`http://host[:port]` or `https://host[:port]` → Origin; anything else is a ValueError."""
    parts = urlsplit(origin)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"origin must look like http://host:port or https://host:port, got {origin!r}")
    if parts.path not in ("", "/") or parts.query or parts.fragment or parts.username:
        raise ValueError(f"origin must not carry a path, query or credentials: {origin!r}")
    tls = parts.scheme == "https"
    host = parts.hostname
    default_port = 443 if tls else 80
    port = parts.port or default_port
    host_header = f"[{host}]" if ":" in host else host
    if port != default_port:
        host_header += f":{port}"
    return Origin(host=host, port=port, host_header=host_header.encode("ascii"), tls=tls)


def build_head(
    method: bytes,
    target: bytes,
    headers: Sequence[tuple[bytes, bytes]],
    body_length: int,
    host: bytes,
) -> bytes:
    """The request line and headers, ready to write.

    Adds Host and Content-Length when absent and nothing else. Raises ValueError for anything
    that would let the request's framing differ from what the caller meant: CR/LF inside a
    field, a Content-Length that disagrees with the body, or a Transfer-Encoding header.
    """
    parts = [method, b" ", target, b" HTTP/1.1\r\n"]
    need_host = True
    need_length = body_length > 0 or method in _BODY_METHODS
    for name, value in headers:
        if len(name) in _FRAMING_SIZES:
            lname = name.lower()
            if lname == b"host":
                need_host = False
            elif lname == b"content-length":
                if not value.strip().isdigit() or int(value) != body_length:
                    raise ValueError(f"content-length {value!r} != body length {body_length}")
                need_length = False
            elif lname == b"transfer-encoding":
                raise ValueError("request bodies are sent with content-length, not transfer-encoding")
        parts += (name, b": ", value, b"\r\n")
    if need_host:
        parts += (b"Host: ", host, b"\r\n")
    if need_length:
        parts += (b"Content-Length: ", b"%d" % body_length, b"\r\n")
    parts.append(b"\r\n")
    return _checked(b"".join(parts), len(headers) + need_host + need_length + 2, len(method) + len(target))


def head_with_fields(
    method: bytes, target: bytes, fields: bytes, lines: int, body_length: int, host: bytes
) -> bytes:
    """`build_head` for header lines already written: `fields` is `lines` lines, each
    `name: value` and CRLF, none of them Host, Content-Length or Transfer-Encoding. Checked as
    `build_head` checks its fields, in the same one scan, so the head is the same bytes."""
    sized = body_length > 0 or method in _BODY_METHODS
    length = b"Content-Length: %d\r\n" % body_length if sized else b""
    head = b"%s %s HTTP/1.1\r\n%sHost: %s\r\n%s\r\n" % (method, target, fields, host, length)
    return _checked(head, lines + 3 + sized, len(method) + len(target))


def _checked(head: bytes, lines: int, line_start: int) -> bytes:
    """`head` if its only CR/LF are the ends of its `lines` lines (request line and blank line
    included) and its request line's first `line_start` + 2 bytes hold exactly its two spaces."""
    # One pass counts CR and LF together: two per line end, and more only with a stray one.
    breaks = len(head) - len(head.translate(None, b"\r\n"))
    if breaks != 2 * lines or head.count(b" ", 0, line_start + 2) != 2:
        raise ValueError("CR, LF or space inside the request line or a header field")
    return head


def body_is_delimited(headers: list[tuple[bytes, bytes]]) -> bool:
    """Whether a response's body length is known from its headers (else it ends at EOF)."""
    for name, value in headers:
        lname = name.lower()
        if lname == b"content-length":
            return True
        if lname == b"transfer-encoding" and value.lower().rstrip().endswith(b"chunked"):
            return True
    return False
