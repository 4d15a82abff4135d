"""A proxy's CPU time: utime + stime of every process of its tree, from /proc.

A process's /proc/PID/stat line counts all its threads, so a multi-threaded proxy (vLLM Router's
tokio workers, uvloop's resolver threads) is covered by its process; nginx's workers are
children of its master, hence the tree."""

from __future__ import annotations

import os
from pathlib import Path

_PROC = Path("/proc")


def _stat_fields(pid: int) -> list[str] | None:
    try:
        text = (_PROC / str(pid) / "stat").read_text()
    except OSError:  # gone in between
        return None
    # The command name in parentheses may hold spaces: the fields start after its closing one.
    return text.rsplit(")", 1)[1].split()


def process_tree(root: int) -> list[int]:
    """`root` and all its descendants alive now."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir(_PROC):
        if entry.isdigit():
            fields = _stat_fields(int(entry))
            if fields is not None:
                children.setdefault(int(fields[1]), []).append(int(entry))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, []))
    return found


def cpu_seconds(pids: list[int]) -> tuple[float, float]:
    """utime and stime (fields 14 and 15 of proc(5)) of these processes, all threads included:
    the time in the proxy's own code and in the kernel's on its behalf (its reads and writes)."""
    user = system = 0
    for pid in pids:
        fields = _stat_fields(pid)
        if fields is not None:
            user += int(fields[11])
            system += int(fields[12])
    tick = os.sysconf("SC_CLK_TCK")
    return user / tick, system / tick


def load_average() -> str:
    """The machine's 1, 5 and 15 minute load averages, as /proc/loadavg states them."""
    return " ".join((_PROC / "loadavg").read_text().split()[:3])
