"""Child processes of the bench, lab and example commands (engines, routers, fake backends):
started with their output where the caller wants it, and always stopped when the block ends —
SIGTERM first, SIGKILL after a grace period."""

from __future__ import annotations

import contextlib
import socket
import subprocess
from collections.abc import Collection, Iterator, Mapping, Sequence
from pathlib import Path


@contextlib.contextmanager
def child_process(
    args: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    log: Path | None = None,
    stdout_to_log: bool = False,
    grace_s: float = 10.0,
    pass_fds: Sequence[int] = (),
) -> Iterator[subprocess.Popen[bytes]]:
    """Run `args` for the duration of the block. Its stderr (and its stdout with
    `stdout_to_log`) goes to the file `log`, never to a pipe: nobody drains a pipe during a run,
    and a full one would stall the child. Without `log`, stdout is discarded and stderr shared.
    `pass_fds`: descriptors the child inherits."""
    if log is None:
        proc = subprocess.Popen(list(args), env=env, stdout=subprocess.DEVNULL, pass_fds=pass_fds)
    else:
        with log.open("wb") as out:  # the child keeps its own copy of the descriptor
            stdout = out if stdout_to_log else subprocess.DEVNULL
            err = subprocess.STDOUT if stdout_to_log else out
            proc = subprocess.Popen(list(args), env=env, stdout=stdout, stderr=err, pass_fds=pass_fds)
    try:
        yield proc
    finally:
        stop(proc, grace_s)


def stop(proc: subprocess.Popen[bytes], grace_s: float = 10.0) -> None:
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def free_ports(n: int, avoid: Collection[int] = ()) -> list[int]:
    """`n` distinct loopback ports, free at the time of asking and none of `avoid`: the ports of
    servers chosen earlier that may not have bound theirs yet (the kernel hands a port out again
    as soon as it is released, so two separate askings can return the same one). Every socket
    stays bound until the choice is made, so the kernel cannot return one port twice."""
    held: list[socket.socket] = []
    chosen: list[int] = []
    try:
        while len(chosen) < n:
            sock = socket.socket()
            held.append(sock)
            sock.bind(("127.0.0.1", 0))
            port: int = sock.getsockname()[1]
            if port not in avoid:
                chosen.append(port)
        return chosen
    finally:
        for sock in held:
            sock.close()
