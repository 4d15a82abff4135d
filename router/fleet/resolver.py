"""Resolving a discovery pool's name to its A and AAAA addresses: from the pool's own
`nameservers` with dnspython's asyncio resolver, else from the system resolver
(`loop.getaddrinfo`, which follows /etc/resolv.conf and its search domains). I/O only: what a
failure means for the pool is router/fleet/discovery.py's decision.

A failure is `ResolveFailed` with one of a few reasons, the label of
`lane_router_discovery_errors_total`: `timeout` (no answer in time), `server_failure` (SERVFAIL,
REFUSED, or every server failing), `nxdomain` (the name does not exist), `no_addresses` (it
exists with neither A nor AAAA records), `error` (anything else). A name answered for one family
and failed for the other is a failure: half an answer would look like half the pool gone."""

from __future__ import annotations

import asyncio
import socket

import dns.asyncresolver
import dns.exception
import dns.nameserver
import dns.resolver

from router.config.models import DiscoveryConfig
from router.fleet.membership import parse_nameserver

TIMEOUT = "timeout"
SERVER_FAILURE = "server_failure"
NXDOMAIN = "nxdomain"
NO_ADDRESSES = "no_addresses"
ERROR = "error"

# A resolution is given at most its pool's interval, within these bounds.
_MIN_WAIT_S = 1.0
_MAX_WAIT_S = 5.0

_GAI_REASONS = {
    socket.EAI_NONAME: NXDOMAIN,
    socket.EAI_AGAIN: SERVER_FAILURE,
    socket.EAI_FAIL: SERVER_FAILURE,
}
_EAI_NODATA = getattr(socket, "EAI_NODATA", None)  # glibc's "name has no addresses"


class ResolveFailed(Exception):
    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason


def wait_bound(cfg: DiscoveryConfig) -> float:
    return min(max(cfg.interval_s, _MIN_WAIT_S), _MAX_WAIT_S)


async def resolve(cfg: DiscoveryConfig) -> tuple[str, ...]:
    """Every A and AAAA address of `cfg.dns`; ResolveFailed when there is none to be had."""
    timeout = wait_bound(cfg)
    if cfg.nameservers:
        addresses = await _from_nameservers(cfg.dns, cfg.nameservers, timeout)
    else:
        addresses = await _from_system(cfg.dns, cfg.port, timeout)
    if not addresses:
        raise ResolveFailed(NO_ADDRESSES, f"{cfg.dns} has no A or AAAA records")
    return addresses


async def _from_nameservers(name: str, servers: tuple[str, ...], timeout: float) -> tuple[str, ...]:
    resolver = dns.asyncresolver.Resolver(configure=False)
    resolver.nameservers = [dns.nameserver.Do53Nameserver(*parse_nameserver(s)) for s in servers]
    answers = await asyncio.gather(
        _query(resolver, name, "A", timeout), _query(resolver, name, "AAAA", timeout), return_exceptions=True
    )
    addresses: list[str] = []
    for answer in answers:
        if isinstance(answer, BaseException):
            raise answer
        addresses += answer
    return tuple(addresses)


async def _query(
    resolver: dns.asyncresolver.Resolver, name: str, rdtype: str, timeout: float
) -> tuple[str, ...]:
    try:
        answer = await resolver.resolve(
            name, rdtype, lifetime=timeout, search=False, raise_on_no_answer=False
        )
    except dns.resolver.NXDOMAIN:
        raise ResolveFailed(NXDOMAIN, f"{name} does not exist") from None
    except dns.exception.Timeout:
        raise ResolveFailed(TIMEOUT, f"no answer for {name} {rdtype} within {timeout:g}s") from None
    except dns.resolver.NoNameservers as err:
        raise ResolveFailed(SERVER_FAILURE, str(err)) from None
    except dns.exception.DNSException as err:
        raise ResolveFailed(ERROR, f"{name} {rdtype}: {err}") from None
    if answer.rrset is None:
        return ()
    return tuple(str(record.address) for record in answer.rrset)


async def _from_system(name: str, port: int, timeout: float) -> tuple[str, ...]:
    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout(timeout):
            infos = await loop.getaddrinfo(name, port, type=socket.SOCK_STREAM)
    except TimeoutError:
        raise ResolveFailed(TIMEOUT, f"no answer for {name} within {timeout:g}s") from None
    except socket.gaierror as err:
        if err.errno == _EAI_NODATA:
            return ()
        reason = _GAI_REASONS.get(err.errno, ERROR) if err.errno is not None else ERROR
        raise ResolveFailed(reason, f"{name}: {err.strerror}") from None
    except OSError as err:
        raise ResolveFailed(ERROR, f"{name}: {err}") from None
    return tuple(
        str(sockaddr[0]) for family, _, _, _, sockaddr in infos if family in (socket.AF_INET, socket.AF_INET6)
    )
