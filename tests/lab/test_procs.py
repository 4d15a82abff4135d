"""Ports for the servers a lab run starts: distinct, free, and never one a caller asked to avoid."""

from __future__ import annotations

import socket

from router.lab.procs import free_ports


def test_ports_of_one_asking_are_distinct_and_free() -> None:
    ports = free_ports(300)
    assert len(set(ports)) == 300
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", ports[-1]))


def test_a_later_asking_avoids_the_ports_given_before() -> None:
    # The kernel hands a released port out again at once: with 600 of its ~28,000 ephemeral ports
    # given before, 400 more askings would meet about 8 of them unless they are avoided.
    earlier = set(free_ports(600))
    later = free_ports(400, avoid=earlier)
    assert len(set(later)) == 400
    assert earlier.isdisjoint(later)
