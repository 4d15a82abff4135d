"""The ASGI `http` scope of one request, from what the parser reported."""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote_to_bytes

from httptools import parse_url


def split_target(target: bytes) -> tuple[str, bytes, bytes]:
    """(path, raw_path, query_string) of a request target. `path` is percent-decoded and read as
    UTF-8; `raw_path` is the path exactly as sent."""
    # `find`, not `in`: on bytes, `in` first tries its operand as an integer and raises and
    # clears a TypeError inside, which costs more than the search itself.
    if target[:1] == b"/":
        raw_path, _, query = target.partition(b"?")
        if target.find(b"#") >= 0:
            if query.find(b"#") >= 0:
                query = query.partition(b"#")[0]
            else:
                raw_path = raw_path.partition(b"#")[0]
    elif target.find(b"://") >= 0:  # absolute form: scheme://authority/path?query
        # Any: httptools' stub types the parts `bytes`, but a target without them gives None,
        # and compiled (docs/compiled.md) a value typed `bytes` is checked as it is read.
        url: Any = parse_url(target)
        raw_path, query = url.path or b"/", url.query or b""
    else:  # asterisk form (OPTIONS *) or authority form (CONNECT host:port)
        raw_path, query = target, b""
    if raw_path.find(b"%") < 0 and raw_path.isascii():
        return raw_path.decode("ascii"), raw_path, query
    return unquote_to_bytes(raw_path).decode("utf-8", "replace"), raw_path, query


def scope_base(
    scheme: str, endpoints: tuple[tuple[str, int] | None, tuple[str, int] | None]
) -> dict[str, Any]:
    """What every request's scope on one connection shares, every key in the scope's order.
    Copying it and setting the rest costs less than building each scope from its entries."""
    server, client = endpoints
    return {
        "type": "http",
        "asgi": None,
        "http_version": "",
        "method": "",
        "scheme": scheme,
        "path": "",
        "raw_path": b"",
        "query_string": b"",
        "root_path": "",
        "headers": None,
        "client": client,
        "server": server,
    }


def http_scope(
    base: dict[str, Any],
    method: str,
    split: tuple[str, bytes, bytes],
    http_version: str,
    headers: list[tuple[bytes, bytes]],
) -> dict[str, Any]:
    """One request's scope: `base` (from `scope_base`) with the request's own entries."""
    scope = base.copy()
    scope["asgi"] = {"version": "3.0", "spec_version": "2.3"}
    scope["http_version"] = http_version
    scope["method"] = method
    scope["path"], scope["raw_path"], scope["query_string"] = split
    scope["headers"] = headers
    return scope
