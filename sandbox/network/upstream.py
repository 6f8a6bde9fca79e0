"""An upstream proxy the egress proxy chains to, when the host itself reaches the network only through one.

With an ``upstream`` the policy judges the name as always, but the upstream resolves it and
connects (by ``CONNECT``): the address check is then the upstream's (its own, usually private,
address is not checked). Only ``http://[user:pass@]host:port`` proxies can be chained.
"""

from __future__ import annotations

import base64
import errno
import os
import urllib.parse
from dataclasses import dataclass
from typing import TYPE_CHECKING

import anyio

from sandbox.errors import InvalidArgument
from sandbox.network.conn import connect
from sandbox.network.denial import Refused, where
from sandbox.network.http import HEAD_LIMIT
from sandbox.network.policy import literal_address
from sandbox.network.resolve import SystemResolver

if TYPE_CHECKING:
    from collections.abc import Mapping

    from sandbox.network.conn import Conn


@dataclass(frozen=True)
class Upstream:
    host: str
    port: int
    authorization: str | None

    @classmethod
    def parse(cls, url: str) -> Upstream:
        """``http://[user:pass@]host:port`` (the scheme may be left out); any other an :class:`InvalidArgument`."""
        parts = urllib.parse.urlsplit(url if "://" in url else f"http://{url}")
        try:
            port = parts.port or 80
        except ValueError:
            port = 0
        if parts.scheme.lower() != "http" or not parts.hostname or not port:
            raise InvalidArgument(f"upstream proxy {url!r}: only http://host:port proxies can be chained", url=url)
        auth = None
        if parts.username is not None:
            user = urllib.parse.unquote(parts.username)
            secret = urllib.parse.unquote(parts.password or "")
            auth = "Basic " + base64.b64encode(f"{user}:{secret}".encode()).decode()
        return cls(parts.hostname, port, auth)

    def __str__(self) -> str:
        return where(self.host, self.port)

    async def tunnel(self, host: str, port: int, timeout: float) -> Conn:
        """A connection through the upstream to ``host`` and ``port``; :class:`Refused` (``upstream-failed``) if not."""
        target = where(host, port)
        try:
            with anyio.fail_after(timeout):
                conn = await _connect_name(self.host, self.port)
        except (OSError, TimeoutError) as exc:
            raise Refused(host, port, "upstream-failed", None, f"upstream proxy {self}: {exc}") from None
        try:
            with anyio.fail_after(timeout):
                status = await self.connect(conn, target)
        except (OSError, EOFError, TimeoutError, ValueError) as exc:
            conn.close()
            raise Refused(host, port, "upstream-failed", None, f"upstream proxy {self}: {exc!r}") from None
        except BaseException:
            conn.close()
            raise
        if status != 200:
            conn.close()
            raise Refused(host, port, "upstream-failed", None, f"upstream proxy {self} answered {status} to {target}")
        return conn

    async def connect(self, conn: Conn, target: str) -> int:
        """Send ``CONNECT target``; the upstream's status code (bytes after its head stay buffered)."""
        lines = [f"CONNECT {target} HTTP/1.1", f"Host: {target}"]
        if self.authorization:
            lines.append(f"Proxy-Authorization: {self.authorization}")
        await conn.send_all(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        head = await conn.read_until(b"\r\n\r\n", HEAD_LIMIT)
        parts = head.split(b" ", 2)
        return int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0


def upstream_from_env(env: Mapping[str, str] | None = None) -> str | None:
    """The proxy the executor itself must use: ``HTTPS_PROXY``, ``HTTP_PROXY``, then ``ALL_PROXY``.

    Only ``http://`` proxies can be chained (by CONNECT); any other scheme is an
    :class:`InvalidArgument`. ``NO_PROXY`` is not honoured: every connection goes through it.
    """
    env = os.environ if env is None else env
    for name in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        value = env.get(name, "").strip()
        if value:
            Upstream.parse(value)
            return value
    return None


async def _connect_name(host: str, port: int) -> Conn:
    """Connect to the upstream proxy, whose name the host's own resolver knows."""
    if literal_address(host) is not None:
        return await connect(host, port)
    addresses = await SystemResolver().resolve(host)
    if not addresses:
        raise OSError(errno.EHOSTUNREACH, f"{host} has no address")
    return await connect(str(addresses[0]), port)
