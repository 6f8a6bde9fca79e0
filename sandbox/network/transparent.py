"""Transparent mode of the egress proxy: connections a jail's DNAT rules redirected, with no proxy protocol.

Two TCP listeners take them. On the HTTP one an ordinary request whose Host header names the
destination (its port, else 80) is forwarded as any plain HTTP request
(:meth:`~sandbox.network.clients.Clients.transparent_http`); on the TLS one (:func:`serve_tls`) a
ClientHello whose SNI names the destination, on port 443, is relayed unopened (no SNI, no
destination: refused, ``bad-request``). The listeners bind with ``IP_FREEBIND``
(:func:`~sandbox.network.service.bind_socket`), so their address (the host's end of a veth pair)
need not exist yet; the filtering DNS server beside them is :mod:`~sandbox.network.dnsfilter`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import anyio

from sandbox.network.conn import HANDSHAKE_TIMEOUT
from sandbox.network.denial import Refused
from sandbox.network.http import normal_host
from sandbox.network.tls import TLS_ACCESS_DENIED, NotClientHello, hello_sni

if TYPE_CHECKING:
    from sandbox.network.clients import Clients
    from sandbox.network.conn import Conn

_NO_SNI = "(no server name)"
"""The host of a transparent TLS connection's denial when its ClientHello names none (DNAT hid the address)."""


async def serve_tls(clients: Clients, client: Conn, port: int) -> None:
    """A redirected TLS connection: the ClientHello's SNI is the destination, on ``port`` (443; DNAT hides it)."""
    try:
        with anyio.fail_after(HANDSHAKE_TIMEOUT):
            host = await _read_sni(client, port)
        client.settle()
        upstream = await clients.open(host, port, "transparent-tls")
    except Refused as refused:
        await clients.deny(refused.denial)
        await client.send_all(TLS_ACCESS_DENIED)  # curl and openssl print "access denied", not a bare EOF
        return
    try:
        await clients.pass_on(client, upstream, host, port)  # the buffered ClientHello goes first
    finally:
        upstream.conn.close()


async def _read_sni(client: Conn, port: int) -> str:
    """The host a transparent TLS connection's ClientHello names; :class:`Refused` (``bad-request``) if none."""
    try:
        sni = await hello_sni(client)
    except NotClientHello:
        raise _no_sni(port, "the connection does not begin with a TLS ClientHello") from None
    except ValueError as exc:
        raise _no_sni(port, f"malformed TLS ClientHello: {exc}") from None
    if sni is None:
        raise _no_sni(port, "the TLS ClientHello names no server (SNI)")
    try:
        return normal_host(sni)
    except ValueError as exc:
        raise _no_sni(port, f"the TLS server name is unusable: {exc}") from None


def _no_sni(port: int, why: str) -> Refused:
    message = f"{why}; a redirected TLS connection is judged by its server name (SNI), so connect by name"
    return Refused(_NO_SNI, port, "bad-request", None, message)
