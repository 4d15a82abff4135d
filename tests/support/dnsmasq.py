"""A real dnsmasq on a free loopback port, answering from a hosts directory the test rewrites.

The binary comes from Debian's `dnsmasq-base` package (scripts/install-ci-tools.sh). Without it
the tests skip, unless LANE_ROUTER_REQUIRE_TOOLS=1 (as in CI), where they fail.

`--hostsdir` is watched with inotify: a file renamed into it replaces its earlier entries, added
and removed names alike, without a restart. Names under `.test` are answered by dnsmasq alone
(`--local`), so a missing name is NXDOMAIN and a name without IPv6 addresses an empty AAAA
answer, as an authoritative server answers them."""

from __future__ import annotations

import asyncio
import contextlib
import grp
import os
import pwd
import shutil
import socket
from collections.abc import AsyncIterator, Iterable
from pathlib import Path

import dns.asyncresolver
import dns.exception
import dns.nameserver
import dns.resolver

from tests.deploy.tools import require_tool
from tests.support.processes import terminate

DOMAIN = "test"


def free_udp_and_tcp_port() -> int:
    """A loopback port free for both UDP and TCP right now."""
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
            udp.bind(("127.0.0.1", 0))
            port: int = udp.getsockname()[1]
            with socket.socket() as tcp:
                try:
                    tcp.bind(("127.0.0.1", port))
                except OSError:
                    continue
        return port


class Dnsmasq:
    """`stop` and `start` again on the same port play an outage and a recovery."""

    def __init__(self, binary: str, workdir: Path) -> None:
        self._binary = binary
        self._hosts = workdir / "hosts.d"
        self._staging = workdir / "hosts.staging"
        self._log = workdir / "dnsmasq.log"
        self._hosts.mkdir()
        self._staging.mkdir()
        self.port = free_udp_and_tcp_port()
        self._proc: asyncio.subprocess.Process | None = None

    @property
    def nameserver(self) -> str:
        return f"127.0.0.1:{self.port}"

    def set_hosts(self, entries: dict[str, Iterable[str]]) -> None:
        """Replace every entry: name → its addresses (written aside, renamed in)."""
        lines = [f"{address} {name}\n" for name, addresses in entries.items() for address in addresses]
        staged = self._staging / "hosts"
        staged.write_text("".join(lines))
        os.replace(staged, self._hosts / "hosts")

    async def start(self) -> None:
        argv = [
            self._binary,
            "--no-daemon",
            "--no-resolv",
            "--no-hosts",
            f"--hostsdir={self._hosts}",
            f"--local=/{DOMAIN}/",
            f"--port={self.port}",
            "--listen-address=127.0.0.1",
            "--bind-interfaces",
            "--local-ttl=0",
            "--pid-file=",
            f"--user={pwd.getpwuid(os.getuid()).pw_name}",
            f"--group={grp.getgrgid(os.getgid()).gr_name}",
        ]
        with self._log.open("ab") as log:
            self._proc = proc = await asyncio.create_subprocess_exec(
                *argv, stdout=asyncio.subprocess.DEVNULL, stderr=log
            )
        async with asyncio.timeout(10):
            while await self.query(f"probe.{DOMAIN}") is None:
                if proc.returncode is not None:
                    raise RuntimeError(f"dnsmasq exited: {self._log.read_text(errors='replace')}")
                await asyncio.sleep(0.02)

    async def query(self, name: str) -> list[str] | None:
        """The A addresses dnsmasq gives for `name` (empty for NXDOMAIN); None when it does not answer."""
        resolver = dns.asyncresolver.Resolver(configure=False)
        resolver.nameservers = [dns.nameserver.Do53Nameserver("127.0.0.1", self.port)]
        try:
            answer = await resolver.resolve(name, "A", lifetime=0.5, raise_on_no_answer=False)
        except dns.resolver.NXDOMAIN:
            return []
        except dns.exception.DNSException:
            return None
        return sorted(str(r.address) for r in answer.rrset) if answer.rrset else []

    async def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            await terminate(proc)


def _binary() -> str:
    # Debian installs it in /usr/sbin, which a non-root PATH may lack.
    found = shutil.which("dnsmasq") or shutil.which("dnsmasq", path="/usr/sbin:/sbin")
    return found if found is not None else require_tool("dnsmasq")


@contextlib.asynccontextmanager
async def dnsmasq(workdir: Path) -> AsyncIterator[Dnsmasq]:
    server = Dnsmasq(_binary(), workdir)
    try:
        await server.start()
        yield server
    finally:
        await server.stop()
