"""SOCKS5 as the egress proxy speaks it: no authentication, CONNECT only, names resolved by the proxy.

The unix socket the jail reaches is the credential, so "no authentication" is the one method; a
client that offers no other is turned away before its request. A name comes as sent (``socks5h``)
and is judged and resolved on the host, never in the jail.
"""

from __future__ import annotations

import socket
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sandbox.network.conn import Conn
    from sandbox.network.denial import Denial

_REPLY = {"resolve-failed": 0x04, "connect-failed": 0x05, "upstream-failed": 0x01, "bad-request": 0x07}
"""The reply code of a refusal by its reason; every other reason is the policy's: 0x02, not allowed."""


async def socks_greeting(client: Conn) -> bool:
    """Read the client's methods and answer them: ``True`` if the client may go on to its request."""
    _version, count = await client.read_exact(2)
    methods = await client.read_exact(count)
    if 0x00 not in methods:
        await client.send_all(b"\x05\xff")  # only "no authentication": the unix socket is the credential
        return False
    await client.send_all(b"\x05\x00")
    return True


async def socks_request(client: Conn) -> tuple[int, str, int]:
    """The client's command, host and port (``EOFError`` for a request that is not SOCKS5)."""
    version, command, _reserved, kind = await client.read_exact(4)
    if version != 0x05:
        raise EOFError
    if kind == 0x01:
        host = socket.inet_ntop(socket.AF_INET, await client.read_exact(4))
    elif kind == 0x04:
        host = socket.inet_ntop(socket.AF_INET6, await client.read_exact(16))
    elif kind == 0x03:
        (size,) = await client.read_exact(1)
        host = (await client.read_exact(size)).decode("ascii", errors="replace")
    else:
        await client.send_all(socks_reply(0x08))
        raise EOFError
    port = int.from_bytes(await client.read_exact(2), "big")
    return command, host, port


def socks_refusal(denial: Denial) -> bytes:
    """The reply that refuses a request, its code chosen by the denial's reason."""
    return socks_reply(_REPLY.get(denial.reason, 0x02))


def socks_reply(code: int) -> bytes:
    return bytes([0x05, code, 0x00, 0x01, 0, 0, 0, 0, 0, 0])
