"""The pure decisions of elastic pools: who joins, stays and leaves; which addresses are used
above the cap; how nameservers are written; what a discovery pool's record says to log."""

from __future__ import annotations

import pytest

from router.fleet.membership import (
    DiscoveryStatus,
    backend_origin,
    choose_addresses,
    diff_members,
    parse_nameserver,
)


def test_the_diff_splits_added_kept_and_vanished() -> None:
    diff = diff_members(["a", "b", "c"], ["d", "c", "a", "d"])

    assert diff.added == ("d",)
    assert diff.kept == ("a", "c")
    assert diff.vanished == ("b",)


def test_no_change_is_an_empty_diff() -> None:
    diff = diff_members(["a", "b"], ["b", "a"])

    assert (diff.added, diff.vanished) == ((), ())
    assert diff.kept == ("a", "b")


def test_addresses_are_ordered_numerically_ipv4_first_and_capped() -> None:
    answer = ["10.0.0.10", "::1", "10.0.0.9", "10.0.0.10", "2001:db8::2", "10.0.0.100"]

    assert choose_addresses(answer, 10) == (
        ("10.0.0.9", "10.0.0.10", "10.0.0.100", "::1", "2001:db8::2"),
        False,
    )
    assert choose_addresses(answer, 2) == (("10.0.0.9", "10.0.0.10"), True)


def test_every_replica_picks_the_same_addresses_whatever_the_answer_order() -> None:
    answer = [f"10.1.{i // 256}.{i % 256}" for i in range(300)]

    assert choose_addresses(answer, 64) == choose_addresses(list(reversed(answer)), 64)


def test_ipv6_addresses_are_written_canonically_and_bracketed() -> None:
    chosen, _ = choose_addresses(["2001:0db8:0000::0001"], 4)

    assert chosen == ("2001:db8::1",)
    assert backend_origin(chosen[0], 8000) == "http://[2001:db8::1]:8000"
    assert backend_origin("10.0.0.1", 8000) == "http://10.0.0.1:8000"


@pytest.mark.parametrize(
    ("entry", "parsed"),
    [
        ("10.0.0.53", ("10.0.0.53", 53)),
        ("127.0.0.1:5353", ("127.0.0.1", 5353)),
        ("::1", ("::1", 53)),
        ("[::1]:5353", ("::1", 5353)),
        ("[fd00::53]", ("fd00::53", 53)),
    ],
)
def test_nameservers_are_addresses_with_an_optional_port(entry: str, parsed: tuple[str, int]) -> None:
    assert parse_nameserver(entry) == parsed


@pytest.mark.parametrize(
    "entry", ["dns.internal", "10.0.0.1:0", "10.0.0.1:x", "[::1", "[::1]5353", "1.2.3.4:99999"]
)
def test_other_nameserver_spellings_are_refused(entry: str) -> None:
    with pytest.raises(ValueError):
        parse_nameserver(entry)


def test_an_outage_is_reported_once_when_it_starts_and_once_when_it_ends() -> None:
    status = DiscoveryStatus()

    assert status.failed("timeout", now=100.0) is True
    assert status.failed("server_failure", now=101.0) is False
    assert status.failed("timeout", now=102.0) is False
    ended, began = status.succeeded(3, truncated=False, now=110.0)

    assert ended is not None and (ended.reason, ended.since, ended.failures) == ("timeout", 100.0, 3)
    assert began is False
    assert status.outage is None and status.resolved_at == 110.0 and status.addresses == 3
    assert status.succeeded(3, truncated=False, now=111.0) == (None, False)


def test_truncation_is_reported_when_it_begins() -> None:
    status = DiscoveryStatus()

    assert status.succeeded(80, truncated=True, now=1.0) == (None, True)
    assert status.succeeded(80, truncated=True, now=2.0) == (None, False)
    assert status.succeeded(10, truncated=False, now=3.0) == (None, False)
    assert status.succeeded(80, truncated=True, now=4.0) == (None, True)
