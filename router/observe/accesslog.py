"""The access log: one JSON line per proxied request, written by a thread of its own.

The event loop only puts the finished `RequestRecord` on a bounded queue; formatting, the usage
parse and the write happen on the writer thread, so a slow disk never stalls a request. When the
queue is full (the disk has fallen `queue_lines` lines behind) the record is dropped and
counted; the next line that gets through is preceded by an `access_log_dropped` line with the
count, and a warning goes to the router's log. Lines never hold a key or a prompt."""

from __future__ import annotations

import logging
import queue
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any

import orjson

from router.observe.record import RequestRecord, span_ms

log = logging.getLogger("lane_router.access")

STDERR = "-"
_STOP = object()


def _iso(wall: float) -> str:
    whole = int(wall)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(whole)) + f".{int((wall - whole) * 1000):03d}Z"


def access_line(rec: RequestRecord) -> dict[str, Any]:
    """The fields of one line, in the order docs/observability.md documents them."""
    prompt, completion = rec.usage()
    trace_id = rec.trace_id()
    return {
        "time": _iso(rec.wall),
        "request_id": rec.request_id.decode("ascii"),
        "key": rec.key_name,
        "route": rec.route,
        "class": rec.cls,
        "reason": rec.reason,
        "lane": rec.lane,
        "pool": rec.pool,
        "backend": rec.backend,
        "stream": rec.stream,
        "status": rec.status,
        "error": rec.error_code,
        "retries": rec.retries,
        "queue_ms": span_ms(rec.classified_at, rec.admitted_at),
        "upstream_ms": span_ms(rec.admitted_at, rec.connected_at),
        "ttft_ms": span_ms(rec.started, rec.first_byte_at),
        "duration_ms": span_ms(rec.started, rec.ended),
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "bytes_in": rec.bytes_in,
        "bytes_out": rec.bytes_out,
        "client_disconnect": rec.client_disconnect,
        "trace_id": trace_id.decode("ascii") if trace_id else None,
        "slo": "met" if rec.slo == "" else rec.slo,
    }


def dropped_line(count: int, wall: float) -> dict[str, Any]:
    return {"time": _iso(wall), "event": "access_log_dropped", "count": count}


def _open_append(path: Path) -> IO[bytes]:
    # Kept open for the writer thread's life, closed by AccessLog.close.
    return open(path, "ab", buffering=0)


class AccessLog:
    """Lines to `target` (a file path, appended to, or "-" for stderr)."""

    def __init__(self, target: str, queue_lines: int) -> None:
        self._target = target
        # Unbuffered: each batch is one write(2) in append mode, so workers sharing a file never
        # interleave inside a line.
        self._stream: IO[bytes] = sys.stderr.buffer if target == STDERR else _open_append(Path(target))
        self._queue: queue.Queue[object] = queue.Queue(maxsize=queue_lines)
        self._dropped = 0
        self._thread = threading.Thread(target=self._write_loop, name="lane-router-access-log", daemon=True)
        self._thread.start()

    def write(self, rec: RequestRecord) -> None:
        """Queue `rec`'s line, preceded by the count of lines dropped before it; never blocks."""
        # Only this thread adds to the queue and the writer only takes from it, so room seen here
        # is still there for both puts: a count is never queued without the line that follows it.
        needed = 2 if self._dropped else 1
        if self._queue.maxsize - self._queue.qsize() < needed:
            self._dropped += 1
            return
        if self._dropped:
            self._queue.put_nowait(self._dropped)
            self._dropped = 0
        self._queue.put_nowait(rec)

    def close(self) -> None:
        """Write what is queued and the count of lines still unreported as dropped, then stop the
        thread and close the file."""
        if self._dropped:
            self._queue.put(self._dropped)
            self._dropped = 0
        self._queue.put(_STOP)
        self._thread.join()
        if self._target != STDERR:
            self._stream.close()

    def _write_loop(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                self._stream.flush()
                return
            batch = [item]
            # Whatever queued up while the last write ran goes out in one write.
            while len(batch) < 256:
                try:
                    nxt = self._queue.get_nowait()
                except queue.Empty:
                    break
                if nxt is _STOP:
                    self._emit(batch)
                    self._stream.flush()
                    return
                batch.append(nxt)
            self._emit(batch)

    def _emit(self, batch: list[object]) -> None:
        lines = []
        for item in batch:
            if isinstance(item, int):
                log.warning("access log: %d lines dropped, the log's writer fell behind", item)
                lines.append(orjson.dumps(dropped_line(item, time.time())))
            elif isinstance(item, RequestRecord):
                lines.append(orjson.dumps(access_line(item)))
        try:
            self._stream.write(b"\n".join(lines) + b"\n")
            self._stream.flush()
        except OSError as err:
            log.error("access log: cannot write %d lines to %s: %s", len(lines), self._target, err)
