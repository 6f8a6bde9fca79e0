"""What the egress proxy and the filtering DNS server share: a :class:`Service`'s life and the sockets it listens on.

A service starts and stops in one task (it holds a task group), as ``async with`` or
``await task_group.start(service.serve)``. Its sockets are non-blocking; a transparent listener's
address may be bound before any interface has it (``IP_FREEBIND``).
"""

from __future__ import annotations

import errno
import socket
from typing import TYPE_CHECKING, Self

import anyio

from sandbox.network.policy import literal_address

if TYPE_CHECKING:
    from pathlib import Path
    from types import TracebackType

    from anyio.abc import TaskStatus

_IP_FREEBIND = getattr(socket, "IP_FREEBIND", 15)  # Linux's value; the constant is in Python 3.12+


class Service:
    """A server with ``start`` and ``aclose`` (run in one task: they hold a task group), as
    ``async with`` or ``await task_group.start(service.serve)``."""

    async def start(self) -> None:
        raise NotImplementedError

    async def aclose(self) -> None:
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def serve(self, *, task_status: TaskStatus[Self] = anyio.TASK_STATUS_IGNORED) -> None:
        """Run until cancelled."""
        async with self:
            task_status.started(self)
            await anyio.sleep_forever()


def listen_unix(path: Path) -> socket.socket:
    """A listening unix socket at ``path`` (a socket left there by a proxy that died is replaced)."""
    if path.is_socket():  # left by a proxy that died; a regular file there is an error below
        path.unlink()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    return _listen(sock, str(path))


def listen_tcp(host: str, port: int, *, freebind: bool = False) -> socket.socket:
    """A listening TCP socket (see :func:`bind_socket`)."""
    sock = bind_socket(host, port, socket.SOCK_STREAM, freebind=freebind)
    return _listen(sock, None)


def bind_socket(host: str, port: int, kind: socket.SocketKind, *, freebind: bool) -> socket.socket:
    """A non-blocking TCP or UDP socket bound to ``host`` (an IP address) and ``port``.

    ``freebind`` (``IP_FREEBIND``) lets it bind an address no interface has yet: a transparent
    listener's address is the host's end of a veth pair that may be created after it.
    """
    ip = literal_address(host)
    if ip is None:
        raise OSError(errno.EINVAL, f"{host!r} is not an IP address")
    sock = socket.socket(socket.AF_INET6 if ip.version == 6 else socket.AF_INET, kind)
    try:
        if kind == socket.SOCK_STREAM:  # not for UDP, where it would let a second server share the port
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if freebind:
            sock.setsockopt(socket.SOL_IP, _IP_FREEBIND, 1)
        sock.bind((str(ip), port))
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


def _listen(sock: socket.socket, address: str | None) -> socket.socket:
    """Bind (unless bound already: ``address`` is ``None``) and listen, non-blocking."""
    try:
        if address is not None:
            sock.bind(address)
        sock.listen(socket.SOMAXCONN)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock
