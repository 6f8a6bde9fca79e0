"""The host-side egress proxy: HTTP CONNECT, plain HTTP and SOCKS5, filtered by an :class:`EgressPolicy`.

The jail reaches it only through a unix socket (a forwarder inside listens on the jail's loopback
and may hand its TCP connection over whole); tests may also use a loopback TCP address, and
transparent mode adds two TCP listeners (:mod:`~sandbox.network.transparent`). This module holds
the listeners, the caps and the proxy's life; the rest lies below it:

- :mod:`~sandbox.network.clients` -- the client protocols (the first byte tells SOCKS5 from HTTP),
  with :mod:`~sandbox.network.http`, :mod:`~sandbox.network.socks` and :mod:`~sandbox.network.tls`;
- :mod:`~sandbox.network.dial` -- every destination judged (policy, approver, addresses) and
  connected to, directly or through an upstream (:mod:`~sandbox.network.upstream`);
- :mod:`~sandbox.network.relay` -- the threads that move a tunnel's bytes;
- :mod:`~sandbox.network.denial` -- every refusal a :class:`~sandbox.network.denial.Denial`.

One proxy serves one session, in a process every session shares (``sandbox serve``): it holds at
most :data:`MAX_CONNECTIONS` connections and :data:`MAX_HANDSHAKES` whose request is overdue
(slowloris: silent for :data:`HANDSHAKE_STALL_S`; a burst of fresh connections is not one); past
either a connection gets a refusal in its protocol (503, a SOCKS failure, a TLS alert) and an
``over-limit`` denial, so one session's flood runs into its own cap, not the process's descriptors.
``accept`` failing (EMFILE) pauses that listener briefly, never the loop.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import socket
import time
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import anyio
import anyio.from_thread
import anyio.to_thread

from sandbox.errors import BackendUnavailable, InvalidArgument, map_errors
from sandbox.network.clients import Clients
from sandbox.network.conn import HANDSHAKE_TIMEOUT, Conn, nodelay
from sandbox.network.denial import Denial, report
from sandbox.network.dial import Dialer
from sandbox.network.http import http_response
from sandbox.network.relay import RELAY_JOIN_TIMEOUT, Relays, join
from sandbox.network.resolve import SystemResolver
from sandbox.network.service import Service, listen_tcp, listen_unix
from sandbox.network.tls import TLS_ACCESS_DENIED
from sandbox.network.transparent import serve_tls
from sandbox.network.upstream import Upstream

if TYPE_CHECKING:
    from contextlib import AbstractAsyncContextManager

    from anyio.abc import TaskGroup
    from anyio.from_thread import BlockingPortal

    from sandbox.network.broker import Broker
    from sandbox.network.denial import Connected, OnConnect, OnDenial
    from sandbox.network.dial import Approver
    from sandbox.network.policy import EgressPolicy
    from sandbox.network.resolve import Resolver

log = logging.getLogger(__name__)


MAX_CONNECTIONS = 128
"""Connections one proxy (one session's) holds at once, being set up or relayed: each costs descriptors
(two sockets, a pipe per relayed direction) of a process every session of ``sandbox serve`` shares."""
QUEUE_WAIT = 10.0
"""How long a connection past :data:`MAX_CONNECTIONS` waits in the listener's backlog (not accepted:
it costs this process no descriptor) for a place before it is refused. Package managers open far
more connections at once than they keep (npm 9 through a proxy: one per request, hundreds): a
burst waits its turn, a sustained flood is refused."""
QUEUE_POLL = 0.005
MAX_HANDSHAKES = 32
"""Connections at once whose request is overdue (none for :data:`HANDSHAKE_STALL_S`): a slowloris
flood stops here, not at EMFILE."""
HANDSHAKE_STALL_S = 1.0
"""How long a connection may stay silent before it counts against :data:`MAX_HANDSHAKES`. A burst of
fresh connections is how a package manager fetches (npm 9 opens 40 at once, each sending its request
within milliseconds): only :data:`MAX_CONNECTIONS` bounds those."""
REFUSAL_WAIT = 1.0
"""How long a connection over a cap may take to show its protocol (its refusal is written in it)."""
MAX_REFUSING = 16
"""Refusals being written at once; past it a connection over a cap is closed without a word."""
_OVER_LIMIT = "(connection limit)"
"""The host of an over-limit denial: the refused connection's request was never read."""
_Role = Literal["unix", "tcp", "transparent-http", "transparent-tls"]
_Handler = Callable[[socket.socket, "_Slot"], Coroutine[Any, Any, None]]
_S = TypeVar("_S")


class EgressProxy(Service):
    """The filtering proxy; ``async with``, ``start``/``aclose``, ``serve`` or :meth:`serve_in_thread`.

    ``start`` and ``aclose`` must run in the same task (they hold a task group). ``upstream`` is an
    ``http://[user:pass@]host:port`` proxy to chain to (see
    :func:`~sandbox.network.upstream.upstream_from_env`).
    ``transparent_http`` and ``transparent_tls`` are the addresses of the transparent listeners
    (port 0 picks one; see the bound ones in :attr:`transparent_http_address` and
    :attr:`transparent_tls_address`); ``transparent_tls_port`` is the port the redirected TLS
    connections were made to, which DNAT hides (443, the only one redirected; tests name their server's).
    ``max_connections`` and ``max_handshakes`` cap what one proxy (a session's) holds at once; a
    connection past either is refused in its own protocol (HTTP 503, a SOCKS failure, a TLS alert)
    and recorded as an ``over-limit`` denial. ``broker``: the hosts whose TLS the proxy terminates,
    their secrets and request rules (:mod:`~sandbox.network.broker`); every other host's TLS passes unopened.
    """

    def __init__(
        self,
        policy: EgressPolicy,
        *,
        unix_path: str | os.PathLike[str] | None = None,
        tcp: tuple[str, int] | None = None,
        transparent_http: tuple[str, int] | None = None,
        transparent_tls: tuple[str, int] | None = None,
        transparent_tls_port: int = 443,
        resolver: Resolver | None = None,
        approver: Approver | None = None,
        ask_timeout: float = 60.0,
        upstream: str | None = None,
        on_denial: OnDenial | None = None,
        on_connect: OnConnect | None = None,
        connect_timeout: float = 10.0,
        resolve_timeout: float = 10.0,
        max_connections: int = MAX_CONNECTIONS,
        max_handshakes: int = MAX_HANDSHAKES,
        queue_wait: float = QUEUE_WAIT,
        broker: Broker | None = None,
    ) -> None:
        if unix_path is None and tcp is None and transparent_http is None and transparent_tls is None:
            raise InvalidArgument("the egress proxy needs a unix socket path or a TCP address to listen on")
        self.unix_path = None if unix_path is None else Path(unix_path)
        self._tcp: dict[_Role, tuple[str, int] | None] = {
            "tcp": tcp,
            "transparent-http": transparent_http,
            "transparent-tls": transparent_tls,
        }
        self.transparent_tls_port = transparent_tls_port
        self.dialer = Dialer(
            policy,
            resolver or SystemResolver(),
            approver=approver,
            ask_timeout=ask_timeout,
            upstream=None if upstream is None else Upstream.parse(upstream),
            connect_timeout=connect_timeout,
            resolve_timeout=resolve_timeout,
        )
        self.on_denial, self.on_connect = on_denial, on_connect
        self.max_connections, self.max_handshakes = max_connections, max_handshakes
        self.queue_wait = queue_wait
        self.handshakes = self.connections = self._refusing = 0  # on the proxy's event loop only
        self._pending: dict[_Slot, float] = {}  # handshakes by when they began, oldest first
        self._over_limit_at = float("-inf")
        self.denials: list[Denial] = []
        self._listeners: dict[_Role, socket.socket] = {}
        self._relays = Relays()
        self.broker = broker
        self._clients = Clients(self.dialer, self._relays, deny=self._deny, connected=self._connected, broker=broker)
        self._tg: TaskGroup | None = None

    @property
    def policy(self) -> EgressPolicy:
        return self.dialer.policy

    @property
    def resolver(self) -> Resolver:
        return self.dialer.resolver

    def rebroker(self, broker: Broker | None) -> None:
        """Terminate (and broker) the hosts ``broker`` names from the next connection on; those open keep theirs."""
        self.broker = self._clients.broker = broker

    @property
    def approver(self) -> Approver | None:
        """Asked about destinations the policy does not know; may be set while the proxy serves."""
        return self.dialer.approver

    @approver.setter
    def approver(self, approver: Approver | None) -> None:
        self.dialer.approver = approver

    # -- lifecycle -----------------------------------------------------------------------------
    @property
    def tcp_address(self) -> tuple[str, int] | None:
        """The TCP address actually bound (the port chosen when asked for 0), once started."""
        return self._bound("tcp")

    @property
    def transparent_http_address(self) -> tuple[str, int] | None:
        return self._bound("transparent-http")

    @property
    def transparent_tls_address(self) -> tuple[str, int] | None:
        return self._bound("transparent-tls")

    def _bound(self, role: _Role) -> tuple[str, int] | None:
        listener = self._listeners.get(role)
        return None if listener is None else listener.getsockname()[:2]

    async def start(self) -> None:
        if self._tg is not None:
            raise InvalidArgument("the egress proxy is already running")
        self._listeners = self._bind()
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        handlers = {
            "unix": self._handle_unix,
            "tcp": self._handle_tcp,
            "transparent-http": self._handle_transparent_http,
            "transparent-tls": self._handle_transparent_tls,
        }
        for role, listener in self._listeners.items():
            self._tg.start_soon(self._accept_loop, self._tg, listener, handlers[role])

    async def aclose(self) -> None:
        """Stop accepting, end every handshake and every relay; clients see their connections close."""
        tg, self._tg = self._tg, None
        try:
            if tg is not None:
                tg.cancel_scope.cancel()
                await tg.__aexit__(None, None, None)
        finally:
            self._close_listeners()
            relays = self._relays.close()
            with anyio.CancelScope(shield=True):  # the sockets are shut already; this waits for their close
                await anyio.to_thread.run_sync(join, relays, RELAY_JOIN_TIMEOUT)

    def serve_in_thread(self) -> ProxyThread:
        """Start the proxy on an event loop of its own thread, for a synchronous caller."""
        with contextlib.ExitStack() as cleanup_on_fail:
            portal = cleanup_on_fail.enter_context(anyio.from_thread.start_blocking_portal())
            cleanup_on_fail.enter_context(portal.wrap_async_context_manager(self))
            return ProxyThread(self, portal, cleanup_on_fail.pop_all())

    def _bind(self) -> dict[_Role, socket.socket]:
        listeners: dict[_Role, socket.socket] = {}
        with contextlib.ExitStack() as cleanup_on_fail, map_errors("egress proxy: cannot listen", BackendUnavailable):
            if self.unix_path is not None:
                listeners["unix"] = cleanup_on_fail.enter_context(listen_unix(self.unix_path))
            for role, address in self._tcp.items():
                if address is not None:
                    freebind = role != "tcp"  # a transparent address is the veth's, which may come later
                    listeners[role] = cleanup_on_fail.enter_context(listen_tcp(*address, freebind=freebind))
            cleanup_on_fail.pop_all()
        return listeners

    def _close_listeners(self) -> None:
        listeners, self._listeners = list(self._listeners.values()), {}
        for listener in listeners:
            listener.close()
        if listeners and self.unix_path is not None:
            with contextlib.suppress(FileNotFoundError):
                self.unix_path.unlink()

    async def _accept_loop(self, tg: TaskGroup, listener: socket.socket, handle: _Handler) -> None:
        while True:
            await anyio.wait_readable(listener)
            await self._place()
            try:
                sock, _ = listener.accept()
            except (BlockingIOError, InterruptedError):
                continue
            except OSError as exc:  # EMFILE and kin: keep serving the connections we have
                log.warning("egress proxy: accept failed: %s", exc)
                await anyio.sleep(0.05)
                continue
            sock.setblocking(False)
            nodelay(sock)
            tg.start_soon(self._admit, handle, sock)

    async def _admit(self, handle: _Handler, sock: socket.socket) -> None:
        why = self._over_limit()
        if why is not None:
            await self._refuse_over_limit(sock, handle, why)
            return
        slot = _Slot(self)
        try:
            await handle(sock, slot)
        finally:
            slot.release()

    # -- caps ----------------------------------------------------------------------------------
    def _held(self) -> int:
        return self.connections + len(self._relays)

    async def _place(self) -> None:
        """Leave the next connection in the backlog while every place is taken, up to ``queue_wait``."""
        waited = 0.0
        while self._held() >= self.max_connections and waited < self.queue_wait:
            await anyio.sleep(QUEUE_POLL)
            waited += QUEUE_POLL

    def _stalled(self) -> int:
        """Handshakes older than :data:`HANDSHAKE_STALL_S` (the oldest come first: stop at a young one)."""
        since = time.monotonic() - HANDSHAKE_STALL_S
        count = 0
        for began in self._pending.values():
            if began > since:
                break
            count += 1
        return count

    def _over_limit(self) -> str | None:
        stalled = self._stalled()
        if stalled >= self.max_handshakes:
            return (
                f"{stalled} connections have sent no request for {HANDSHAKE_STALL_S:g} s or more"
                f" (at most {self.max_handshakes})"
            )
        held = self._held()
        if held >= self.max_connections:
            return f"{held} connections are open (at most {self.max_connections} per session)"
        return None

    async def _refuse_over_limit(self, sock: socket.socket, handle: _Handler, why: str) -> None:
        """Refuse a connection past a cap in its own protocol, briefly (it holds descriptors too), then close it.

        A flood is recorded once a second, not once a connection: the record must not become the flood."""
        now = time.monotonic()
        if now - self._over_limit_at >= 1.0:
            self._over_limit_at = now
            await self._deny(Denial(_OVER_LIMIT, 0, "over-limit", None, f"the proxy refused a connection: {why}"))
        if self._refusing >= MAX_REFUSING:
            sock.close()
            return
        self._refusing += 1
        try:
            with anyio.move_on_after(REFUSAL_WAIT):
                sock = await _refusal_peer(sock) if handle == self._handle_unix else sock
                await _refuse_in_kind(sock, transparent_tls=handle == self._handle_transparent_tls)
        except OSError:
            pass
        finally:
            sock.close()
            self._refusing -= 1

    # -- one connection ------------------------------------------------------------------------
    async def _handle_tcp(self, sock: socket.socket, slot: _Slot) -> None:
        await self._guarded(Conn(sock, slot.settle), self._clients.serve)

    async def _handle_unix(self, sock: socket.socket, slot: _Slot) -> None:
        """A connection on the unix socket: a byte stream, or a jail's forwarder handing over the
        jail's TCP connection itself (one zero byte with the descriptor), relayed with no extra hop."""
        try:
            with anyio.fail_after(HANDSHAKE_TIMEOUT):
                await anyio.wait_readable(sock)
            data, fds, _flags, _address = socket.recv_fds(sock, 1, 1)
        except (OSError, TimeoutError):
            sock.close()
            return
        except BaseException:  # cancelled (the proxy closing): the socket is ours to close still
            sock.close()
            raise
        if not fds:
            conn = Conn(sock, slot.settle)
            conn.buffer += data
            await self._guarded(conn, self._clients.serve) if data else conn.close()
            return
        sock.close()
        client = _adopt(fds[0]) if data == b"\0" else None
        if client is None:
            for fd in fds:
                with contextlib.suppress(OSError):
                    os.close(fd)
            return
        await self._guarded(Conn(client, slot.settle), self._clients.serve)

    async def _handle_transparent_http(self, sock: socket.socket, slot: _Slot) -> None:
        await self._guarded(Conn(sock, slot.settle), self._clients.transparent_http)

    async def _handle_transparent_tls(self, sock: socket.socket, slot: _Slot) -> None:
        await self._guarded(Conn(sock, slot.settle), self._transparent_tls)

    async def _transparent_tls(self, client: Conn) -> None:
        await serve_tls(self._clients, client, self.transparent_tls_port)

    async def _guarded(self, client: Conn, serve: Callable[[Conn], Awaitable[None]]) -> None:
        try:
            await serve(client)
        except (OSError, EOFError, TimeoutError):
            pass  # the client went away or stalled: nothing was opened for it
        except Exception:
            log.exception("egress proxy: connection failed")
        finally:
            client.close()

    # -- the record ----------------------------------------------------------------------------
    async def _deny(self, denial: Denial) -> None:
        self.denials.append(denial)
        await report(self.on_denial, denial)

    async def _connected(self, connected: Connected) -> None:
        await report(self.on_connect, connected)


class ProxyThread:
    """A proxy serving on its own thread's event loop; :meth:`close` stops it and ends every relay."""

    def __init__(self, proxy: EgressProxy, portal: BlockingPortal, stack: contextlib.ExitStack) -> None:
        self.proxy = proxy
        self._portal = portal
        self._stack = stack

    @property
    def tcp_address(self) -> tuple[str, int] | None:
        return self.proxy.tcp_address

    @property
    def denials(self) -> list[Denial]:
        return self.proxy.denials

    def run_beside(self, service: AbstractAsyncContextManager[_S]) -> _S:
        """Enter ``service`` (e.g. a :class:`~sandbox.network.dnsfilter.FilteringDns`) on the proxy's
        event loop and thread; :meth:`close` exits it before it stops the proxy."""
        return self._stack.enter_context(self._portal.wrap_async_context_manager(service))

    def close(self) -> None:
        self._stack.close()

    def __enter__(self) -> ProxyThread:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Slot:
    """One accepted connection's place under the proxy's caps: a handshake until :meth:`settle`,
    a connection until :meth:`release` (a relay it hands over to counts on in the proxy's relays)."""

    def __init__(self, proxy: EgressProxy) -> None:
        self._proxy = proxy
        self._settled = self._released = False
        proxy.handshakes += 1
        proxy.connections += 1
        proxy._pending[self] = time.monotonic()

    def settle(self) -> None:
        if not self._settled:
            self._settled = True
            self._proxy.handshakes -= 1
            del self._proxy._pending[self]

    def release(self) -> None:
        self.settle()
        if not self._released:
            self._released = True
            self._proxy.connections -= 1


async def _refusal_peer(sock: socket.socket) -> socket.socket:
    """The client behind a unix connection: the TCP connection a forwarder hands over, else itself."""
    await anyio.wait_readable(sock)
    data, fds, _flags, _address = socket.recv_fds(sock, 1, 1, socket.MSG_PEEK)
    if not fds:
        return sock
    for extra in fds[1:]:
        os.close(extra)
    if data != b"\0":
        os.close(fds[0])
        raise OSError(errno.EPROTO, "not a connection handed over")
    client = _adopt(fds[0])  # closes the descriptor itself when it is not a connection
    if client is None:
        raise OSError(errno.EPROTO, "not a connection handed over")
    sock.close()
    return client


async def _refuse_in_kind(sock: socket.socket, *, transparent_tls: bool) -> None:
    """A 503 (HTTP), a general SOCKS failure or a TLS alert, as the client's first byte shows."""
    first = b""
    if not transparent_tls:
        with anyio.move_on_after(REFUSAL_WAIT / 2):
            await anyio.wait_readable(sock)
            first = sock.recv(1, socket.MSG_PEEK)
    if transparent_tls:
        reply = TLS_ACCESS_DENIED
    elif first == b"\x05":
        reply = b"\x05\xff"  # "no acceptable method": the SOCKS client gives up before its request
    else:
        body = "sandbox: the proxy refused the connection (over-limit): too many connections at once\n"
        reply = http_response("503 Service Unavailable", {"X-Sandbox-Denial": "over-limit"}, body)
    sock.setblocking(False)
    with contextlib.suppress(BlockingIOError):
        sock.send(reply)


def _adopt(fd: int) -> socket.socket | None:
    """A connected stream socket handed over by a jail's forwarder, or ``None`` for anything else
    (a file, a pipe, a listening or datagram socket: a jail chooses what it sends)."""
    try:
        sock = socket.socket(fileno=fd)
    except OSError:
        return None
    try:
        if sock.type != socket.SOCK_STREAM or sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
            sock.close()
            return None
        sock.setblocking(False)
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            nodelay(sock)
    except OSError:
        sock.close()
        return None
    return sock
