"""The kernel's send queue as router/httpserver/wire.py `send_queue` reads it, on real sockets."""

from __future__ import annotations

import os
import socket

from router.httpserver.wire import TELLS_SEND_QUEUE, send_queue


def _connected_pair() -> tuple[socket.socket, socket.socket]:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        sender = socket.create_connection(listener.getsockname())
        receiver, _ = listener.accept()
    return sender, receiver


def test_bytes_the_peer_has_not_taken_are_counted() -> None:
    assert TELLS_SEND_QUEUE  # Linux, where the router is deployed, tells it
    sender, receiver = _connected_pair()
    try:
        receiver.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sender.setblocking(False)
        written = 0
        try:
            while True:  # until the peer's window and the kernel's buffer are both full
                written += sender.send(b"x" * 65536)
        except BlockingIOError:
            pass
        queued = send_queue(sender.fileno())
        assert 0 < queued <= written
        assert send_queue(receiver.fileno()) == 0  # nothing written the other way
    finally:
        sender.close()
        receiver.close()


def test_a_closed_descriptor_or_one_that_is_no_socket_counts_nothing() -> None:
    sender, receiver = _connected_pair()
    fd = sender.fileno()
    sender.close()
    receiver.close()
    assert send_queue(fd) == 0
    assert send_queue(-1) == 0
    read_end, write_end = os.pipe()
    try:
        assert send_queue(read_end) == 0
    finally:
        os.close(read_end)
        os.close(write_end)
