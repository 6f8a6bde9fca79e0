"""Name resolution for the egress proxy: the proxy resolves every name itself, then checks the addresses.

A :class:`Resolver` returns the addresses of a name, an empty list when the name has none, and
raises ``OSError`` when the lookup itself fails. :class:`SystemResolver` asks the host's resolver
(getaddrinfo, in a worker thread); :class:`DnsResolver` asks one DNS server directly, which is how
the tests' local "internet" and ``SANDBOX_NET_RESOLVER=host:port`` point the proxy at a test
server; :class:`StaticResolver` is the in-memory fake, typed like the real ones.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import time
from typing import TYPE_CHECKING, Protocol

import anyio
import anyio.to_thread

from sandbox.errors import BackendUnavailable, InvalidArgument
from sandbox.network.policy import IPAddress, literal_address

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

RESOLVER_ENV = "SANDBOX_NET_RESOLVER"


class Resolver(Protocol):
    async def resolve(self, host: str) -> list[IPAddress]:
        """The addresses of ``host`` (IPv4 first), ``[]`` if it has none; ``OSError`` if the lookup failed."""
        ...


class SystemResolver:
    """getaddrinfo in a worker thread: whatever ``/etc/hosts``, nsswitch and resolv.conf say."""

    async def resolve(self, host: str) -> list[IPAddress]:
        try:
            return _ordered(await anyio.to_thread.run_sync(_getaddrinfo, host, abandon_on_cancel=True))
        except socket.gaierror as exc:
            if exc.errno in (socket.EAI_NONAME, getattr(socket, "EAI_NODATA", socket.EAI_NONAME)):
                return []
            raise


class DnsResolver:
    """Queries one DNS server (A and AAAA, over UDP with TCP fallback) through dnspython."""

    def __init__(self, server: str, port: int = 53, *, timeout: float = 5.0) -> None:
        try:  # imported here: dnspython is needed only when a server is named
            import dns.asyncresolver
        except ImportError as exc:
            raise BackendUnavailable(
                f"resolving through {server}:{port} needs dnspython (pip install dnspython)"
            ) from exc

        self.server, self.port = server, port
        self._resolver = dns.asyncresolver.Resolver(configure=False)
        self._resolver.nameservers = [server]
        self._resolver.port = port
        self._resolver.lifetime = timeout

    async def resolve(self, host: str) -> list[IPAddress]:
        found: list[IPAddress] = []
        async with anyio.create_task_group() as tg:
            for rdtype in ("A", "AAAA"):
                tg.start_soon(self._query, host, rdtype, found)
        return _ordered(found)

    async def _query(self, host: str, rdtype: str, found: list[IPAddress]) -> None:
        import dns.exception
        import dns.resolver

        try:
            answer = await self._resolver.resolve(host, rdtype, search=False)
        except (dns.resolver.NXDOMAIN, dns.resolver.NoAnswer):
            return
        except dns.exception.DNSException as exc:
            raise OSError(f"DNS lookup of {host} ({rdtype}) at {self.server}:{self.port} failed: {exc}") from exc
        found.extend(ipaddress.ip_address(record.address) for record in answer)


class CachedResolver:
    """Another resolver's answers kept for ``ttl`` seconds (at most ``size`` names; no failure kept).

    A build opens many connections to one registry; each would otherwise wait for a lookup. The
    addresses are checked again on every connection, so a kept answer weakens no defence.
    """

    def __init__(self, inner: Resolver, ttl: float = 10.0, size: int = 1024) -> None:
        self.inner, self.ttl, self.size = inner, ttl, size
        self._kept: dict[str, tuple[float, list[IPAddress]]] = {}

    async def resolve(self, host: str) -> list[IPAddress]:
        key = host.lower().rstrip(".")
        now = time.monotonic()
        kept = self._kept.get(key)
        if kept is not None and now - kept[0] < self.ttl:
            return list(kept[1])
        found = await self.inner.resolve(host)
        if found:
            if len(self._kept) >= self.size:
                self._kept.clear()
            self._kept[key] = (now, list(found))
        return found


class StaticResolver:
    """A fixed table of names to addresses (the fake for tests); unknown names have no address."""

    def __init__(self, table: Mapping[str, list[str]]) -> None:
        self._table = {
            name.lower().rstrip("."): [ipaddress.ip_address(a) for a in addresses] for name, addresses in table.items()
        }

    async def resolve(self, host: str) -> list[IPAddress]:
        return list(self._table.get(host.lower().rstrip("."), []))


def resolver_from_env(env: Mapping[str, str] | None = None) -> Resolver:
    """A :class:`DnsResolver` for ``SANDBOX_NET_RESOLVER=host:port`` (``[v6]:port``), else the system's."""
    value = (os.environ if env is None else env).get(RESOLVER_ENV, "").strip()
    if not value:
        return SystemResolver()
    host, port = _server(value)
    return DnsResolver(host, port)


def _server(value: str) -> tuple[str, int]:
    ip = literal_address(value)
    if ip is not None:
        return str(ip), 53
    host, _, port = value.rpartition(":")
    ip = literal_address(host)
    if ip is None or not port.isdigit() or not 0 < int(port) < 65536:
        raise InvalidArgument(f"{RESOLVER_ENV}={value!r}: expected an IP address and port, e.g. 127.0.0.1:5353")
    return str(ip), int(port)


def _getaddrinfo(host: str) -> list[IPAddress]:
    infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    return [ipaddress.ip_address(str(info[4][0]).split("%")[0]) for info in infos]


def _ordered(addresses: Iterable[IPAddress]) -> list[IPAddress]:
    return sorted(dict.fromkeys(addresses), key=lambda ip: ip.version)
