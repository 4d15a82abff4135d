"""Which servers a pool has: the pure decisions of elastic membership.

A pool's backends are known by their origins (`http://ADDR:PORT`). `diff_members` splits the
origins a pool should have against those it has (added, kept, vanished); `choose_addresses`
applies `discovery.max_backends`, keeping the lowest addresses so every router replica picks the
same ones; `DiscoveryStatus` is a discovery pool's record of its name's answers, whose
transitions say what is worth a log line: an outage when it starts and when it ends, a
truncation when it begins. The I/O around them is router/fleet/discovery.py and router/fleet/fleet.py."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

DEFAULT_DNS_PORT = 53


@dataclass(frozen=True, slots=True)
class MembershipDiff:
    added: tuple[str, ...]
    kept: tuple[str, ...]
    vanished: tuple[str, ...]


def diff_members(current: Sequence[str], wanted: Iterable[str]) -> MembershipDiff:
    """`added` in the order wanted, `kept` and `vanished` in the current order."""
    wanted_order = tuple(dict.fromkeys(wanted))
    wanted_set = set(wanted_order)
    current_set = set(current)
    return MembershipDiff(
        added=tuple(o for o in wanted_order if o not in current_set),
        kept=tuple(o for o in current if o in wanted_set),
        vanished=tuple(o for o in current if o not in wanted_set),
    )


def _address_order(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> tuple[int, int]:
    return (address.version, int(address))


def choose_addresses(addresses: Iterable[str], limit: int) -> tuple[tuple[str, ...], bool]:
    """The lowest `limit` distinct addresses (IPv4 before IPv6, numerically), canonically written,
    and whether any were left out. Every replica that sees the same answer picks the same ones."""
    unique = sorted({ipaddress.ip_address(a) for a in addresses}, key=_address_order)
    return tuple(str(a) for a in unique[:limit]), len(unique) > limit


def backend_origin(address: str, port: int, scheme: str = "http") -> str:
    host = f"[{address}]" if ":" in address else address
    return f"{scheme}://{host}:{port}"


def parse_nameserver(entry: str) -> tuple[str, int]:
    """`ADDR`, `ADDR:PORT` or `[IPV6]:PORT` → (address, port); ValueError when it is none of these.
    Only addresses: the name of a nameserver would itself need resolving."""
    host, port = entry, DEFAULT_DNS_PORT
    if entry.startswith("["):
        host, sep, rest = entry[1:].partition("]")
        if not sep or (rest and not rest.startswith(":")):
            raise ValueError(f"{entry!r}: write an IPv6 nameserver as [ADDR]:PORT")
        port = _port(entry, rest[1:]) if rest else DEFAULT_DNS_PORT
    elif entry.count(":") == 1:
        host, _, text = entry.partition(":")
        port = _port(entry, text)
    try:
        ipaddress.ip_address(host)
    except ValueError:
        raise ValueError(f"{entry!r}: a nameserver is an IP address, optionally with :PORT") from None
    return host, port


def _port(entry: str, text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise ValueError(f"{entry!r}: the port must be a number from 1 to 65535")
    return int(text)


@dataclass(frozen=True, slots=True)
class Outage:
    reason: str  # of the failure that started it
    since: float  # wall-clock time of that failure
    failures: int  # failed resolutions during it


@dataclass(slots=True)
class DiscoveryStatus:
    """A discovery pool's record of its name's answers; kept with the pool across reloads."""

    resolved_at: float | None = None  # wall-clock time of the last good answer
    addresses: int = 0  # distinct addresses in it, before `max_backends`
    truncated: bool = False
    outage: Outage | None = None

    def failed(self, reason: str, now: float) -> bool:
        """Record a failed resolution; True when it starts an outage."""
        if self.outage is not None:
            self.outage = Outage(self.outage.reason, self.outage.since, self.outage.failures + 1)
            return False
        self.outage = Outage(reason, now, 1)
        return True

    def succeeded(self, addresses: int, truncated: bool, now: float) -> tuple[Outage | None, bool]:
        """Record a good answer; the outage it ends, if any, and whether truncation begins now."""
        ended, self.outage = self.outage, None
        began = truncated and not self.truncated
        self.resolved_at, self.addresses, self.truncated = now, addresses, truncated
        return ended, began
