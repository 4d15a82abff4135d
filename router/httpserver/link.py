"""A connection as the requests on it see it: what an exchange (router/httpserver/exchange.py)
writes through and asks of the connection it came on. The connection itself
(router/httpserver/connection.py) is the one there is, by way of its reading half
(router/httpserver/reader.py). A base class, not a protocol: compiled, an exchange's calls are
then direct ones, not calls by name."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from router.httpserver.deadlines import Watched

if TYPE_CHECKING:
    from router.httpserver.exchange import Exchange
    from router.httpserver.wire import DateHeader


class ClientLink(Watched):
    __slots__ = ("closing", "date", "transport", "write_paused")

    closing: bool  # end the connection after the response in progress
    date: DateHeader
    transport: Any
    write_paused: bool  # the transport is full: writes wait for `when_writable`

    def write(self, data: bytes) -> None:
        raise NotImplementedError

    def write_parts(self, parts: list[bytes]) -> None:
        raise NotImplementedError

    async def drain(self) -> None:
        raise NotImplementedError

    def when_writable(self, callback: Callable[[], None]) -> None:
        raise NotImplementedError

    def unsent(self) -> int:
        raise NotImplementedError

    def unsent_at_most(self) -> int:
        raise NotImplementedError

    def resume_body(self) -> None:
        raise NotImplementedError

    def response_complete(self, ex: Exchange) -> None:
        raise NotImplementedError

    def abort(self) -> None:
        raise NotImplementedError
