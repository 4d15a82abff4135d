"""What the supervising parent and one worker say over the worker's channel (router/supervisor/workers.py,
router/supervisor/workerlink.py): one line per message, a kind, a number and a JSON payload.

- worker → parent `ask <id> "<trigger>"`: reload every worker, then answer me;
- parent → worker `reload <n> "<trigger>"`: re-read your files as on SIGHUP, and report;
- worker → parent `reloaded <n> {report}`: what this worker did (router/state/live.py `ReloadReport`);
- parent → worker `answer <id> [reports]`: what every worker did, for the worker that asked.

The parent's end of the file tells the worker that the parent is gone."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import orjson

ASK = b"ask"
RELOAD = b"reload"
RELOADED = b"reloaded"
ANSWER = b"answer"

# A message longer than this is not one either side writes: the channel is broken.
MAX_LINE = 1 << 20
# How long the parent waits for a worker's report, and a worker for the parent's answer (longer:
# the parent's wait is part of it).
REPORT_WAIT_S = 30.0
ANSWER_WAIT_S = REPORT_WAIT_S + 5.0


class ChannelError(Exception):
    """A line that is not a message of this channel."""


def message(kind: bytes, number: int, payload: Any) -> bytes:
    """One message; orjson writes no newline inside the payload."""
    return b"%b %d %b\n" % (kind, number, orjson.dumps(payload))


class Lines:
    """Bytes received on a channel, cut into the messages they complete."""

    __slots__ = ("_pending",)

    def __init__(self) -> None:
        self._pending = b""

    def feed(self, data: bytes) -> Iterator[tuple[bytes, int, Any]]:
        """The messages `data` completes, as (kind, number, payload); raises `ChannelError`."""
        pending = self._pending + data
        *lines, self._pending = pending.split(b"\n")
        if len(self._pending) > MAX_LINE:
            raise ChannelError(f"a message longer than {MAX_LINE} bytes")
        for line in lines:
            yield parse(line)


def parse(line: bytes) -> tuple[bytes, int, Any]:
    kind, number, payload = [*line.split(b" ", 2), b"", b""][:3]
    if kind not in (ASK, RELOAD, RELOADED, ANSWER) or not number.isdigit():
        raise ChannelError(f"not a message: {line[:80]!r}")
    try:
        return kind, int(number), orjson.loads(payload)
    except orjson.JSONDecodeError as err:
        raise ChannelError(f"a {kind.decode()} message without its payload: {err}") from None
