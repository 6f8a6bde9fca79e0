"""The filtering DNS server of transparent mode: a jail's lookups answered only for names the policy allows.

In transparent mode the jail's DNS is redirected here (UDP and TCP, one address). A question for
a name the egress policy allows on port 80 or 443 (or does not know, when it asks: the user is
asked when the connection comes) is answered with the addresses the proxy's own resolver gives,
less any the policy refuses (a public name resolving to loopback, a private network or the
metadata service: no DNS rebinding). A name the policy does not know, when it asks, is *not*
resolved: nothing about it may reach a resolver before the user allows it (and, unattended,
ever), so its ``A`` answer is :data:`UNRESOLVED`, an address of ours, and its ``AAAA`` answer
empty; the jail's rules send every TCP 80 and 443 to the proxy whatever the address, and there
the user is asked before the proxy resolves the name. A name the policy refuses gets ``REFUSED`` and a
:class:`~sandbox.network.denial.Denial` on port 53. Other record types for an admitted name get an
empty answer: the jail learns no mail servers, TXT records or anything else DNS could carry out.
Nothing is forwarded anywhere but to the resolver; a packet that is not a query is dropped.

The answers are a convenience, not the boundary: the proxy judges every connection again.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import socket
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio
import dns.exception
import dns.flags
import dns.message
import dns.opcode
import dns.rcode
import dns.rdataclass
import dns.rdatatype
import dns.rrset

from sandbox.errors import BackendUnavailable, InvalidArgument, map_errors
from sandbox.network import netns
from sandbox.network.denial import Denial, denial_reason
from sandbox.network.service import Service, bind_socket

if TYPE_CHECKING:
    from anyio.abc import TaskGroup

    from sandbox.network.denial import OnDenial
    from sandbox.network.policy import EgressPolicy, IPAddress
    from sandbox.network.proxy import EgressProxy
    from sandbox.network.resolve import Resolver

log = logging.getLogger(__name__)

PORT = 53
TTL = 30
MAX_PACKET = 4096
"""Larger queries are dropped (UDP) or end the connection (TCP): no real query comes near it."""
UDP_ANSWER = 512
"""The most an answer over UDP may carry unless the query's EDNS offers more; past it, TC is set."""
MAX_PENDING = 256
"""Queries being answered at once over UDP, and TCP connections open at once; more are dropped."""
TCP_IDLE = 10.0
PORTS = (443, 80)
"""What a name is judged for: the ports transparent mode redirects."""
UNRESOLVED = netns.HOST_IP
"""The ``A`` answer for a name not yet allowed: the host's end of the jail's veth (any address
would do, DNAT redirects by port); it tells no resolver, and the jail, nothing."""
_ADDRESS_TYPES = {dns.rdatatype.A: 4, dns.rdatatype.AAAA: 6}
_REVERSE = ("in-addr.arpa", "ip6.arpa")


@dataclass(frozen=True)
class _Admitted:
    """A name the policy lets the jail look up: the ports it was admitted on and the rule that did."""

    ports: tuple[int, ...]
    rule: str | None
    asked: bool = False
    """No rule admits it: the user is asked when the connection comes; until then it is not resolved."""


class FilteringDns(Service):
    """The DNS server; ``async with``, ``start``/``aclose`` or ``serve``, like the proxy.

    To run it on the proxy's thread and event loop: ``proxy_thread.run_beside(FilteringDns.beside(proxy, bind=...))``.
    """

    def __init__(
        self,
        policy: EgressPolicy,
        resolver: Resolver,
        *,
        bind: tuple[str, int],
        on_denial: OnDenial | None = None,
        resolve_timeout: float = 5.0,
    ) -> None:
        self.policy, self.resolver = policy, resolver
        self.bind, self.on_denial, self.resolve_timeout = bind, on_denial, resolve_timeout
        self.denials: list[Denial] = []
        self._udp: socket.socket | None = None
        self._tcp: socket.socket | None = None
        self._pending = {socket.SOCK_DGRAM: 0, socket.SOCK_STREAM: 0}  # an idle TCP client holds up no UDP query
        self._tg: TaskGroup | None = None

    @classmethod
    def beside(cls, proxy: EgressProxy, *, bind: tuple[str, int]) -> FilteringDns:
        """A server with the proxy's policy, resolver and denial callback, recording into its ``denials``."""
        server = cls(proxy.policy, proxy.resolver, bind=bind, on_denial=proxy.on_denial)
        server.denials = proxy.denials  # one ordered record, so a call's mark covers lookups too
        return server

    @property
    def address(self) -> tuple[str, int] | None:
        """The address bound (UDP and TCP; the port chosen when asked for 0), once started."""
        return None if self._udp is None else self._udp.getsockname()[:2]

    # -- lifecycle -----------------------------------------------------------------------------
    async def start(self) -> None:
        if self._tg is not None:
            raise InvalidArgument("the filtering DNS server is already running")
        udp, tcp = _bind_pair(*self.bind)
        self._udp, self._tcp = udp, tcp
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        self._tg.start_soon(self._serve_udp, self._tg, udp)
        self._tg.start_soon(self._serve_tcp, self._tg, tcp)

    async def aclose(self) -> None:
        tg, self._tg = self._tg, None
        try:
            if tg is not None:
                tg.cancel_scope.cancel()
                await tg.__aexit__(None, None, None)
        finally:
            for sock in (self._udp, self._tcp):
                if sock is not None:
                    sock.close()
            self._udp = self._tcp = None

    # -- transports ----------------------------------------------------------------------------
    async def _serve_udp(self, tg: TaskGroup, sock: socket.socket) -> None:
        while True:
            await anyio.wait_readable(sock)
            try:
                packet, sender = sock.recvfrom(MAX_PACKET + 1)
            except (BlockingIOError, InterruptedError):
                continue
            except OSError as exc:  # an ICMP error for an earlier answer, and kin: the socket is fine
                log.debug("filtering DNS: receive failed: %s", exc)
                continue
            if len(packet) <= MAX_PACKET and self._pending[socket.SOCK_DGRAM] < MAX_PENDING:
                self._pending[socket.SOCK_DGRAM] += 1
                tg.start_soon(self._answer_udp, sock, packet, sender)

    async def _answer_udp(self, sock: socket.socket, packet: bytes, sender: tuple[Any, ...]) -> None:
        try:
            reply = await self.reply(packet, udp=True)
            if reply is not None:
                with contextlib.suppress(OSError):  # a full buffer or a vanished sender: UDP may lose it
                    sock.sendto(reply, sender)
        finally:
            self._pending[socket.SOCK_DGRAM] -= 1

    async def _serve_tcp(self, tg: TaskGroup, listener: socket.socket) -> None:
        while True:
            await anyio.wait_readable(listener)
            try:
                sock, _ = listener.accept()
            except OSError:  # EAGAIN after a race, or EMFILE: this connection is lost, not the server
                continue
            if self._pending[socket.SOCK_STREAM] >= MAX_PENDING:
                sock.close()
                continue
            self._pending[socket.SOCK_STREAM] += 1
            sock.setblocking(False)
            tg.start_soon(self._answer_tcp, sock)

    async def _answer_tcp(self, sock: socket.socket) -> None:
        """Length-prefixed queries, answered in turn until the client closes or idles (RFC 7766)."""
        try:
            with sock:
                while True:
                    with anyio.fail_after(TCP_IDLE):
                        size = int.from_bytes(await _read_exact(sock, 2), "big")
                        if size > MAX_PACKET:
                            return
                        query = await _read_exact(sock, size)
                    reply = await self.reply(query, udp=False)
                    if reply is None:
                        return
                    await _send_all(sock, len(reply).to_bytes(2, "big") + reply)
        except (OSError, EOFError, TimeoutError):
            pass
        finally:
            self._pending[socket.SOCK_STREAM] -= 1

    # -- one query -----------------------------------------------------------------------------
    async def reply(self, packet: bytes, *, udp: bool) -> bytes | None:
        """The wire answer to one DNS query, ``None`` to drop it (not a query, or unreadable)."""
        try:
            query = dns.message.from_wire(packet)
        except Exception:  # dnspython has a dozen kinds of complaint about a malformed packet: drop any
            return None
        if query.flags & dns.flags.QR:
            return None  # an answer sent to us: replying could start a loop
        response = await self._respond(query)
        try:  # past the limit TC is set and the client asks again over TCP
            return response.to_wire(max_size=_answer_limit(query, udp=udp), prefer_truncation=True)
        except dns.exception.DNSException as exc:
            log.warning("filtering DNS: cannot encode the answer: %s", exc)
            return None

    async def _respond(self, query: dns.message.Message) -> dns.message.Message:
        response = dns.message.make_response(query, recursion_available=True, our_payload=MAX_PACKET)
        if query.opcode() != dns.opcode.QUERY:
            response.set_rcode(dns.rcode.NOTIMP)
        elif len(query.question) != 1:
            response.set_rcode(dns.rcode.FORMERR)
        elif query.question[0].rdclass != dns.rdataclass.IN:
            response.set_rcode(dns.rcode.REFUSED)
        else:
            await self._answer(query.question[0], response)
        return response

    async def _answer(self, question: dns.rrset.RRset, response: dns.message.Message) -> None:
        name = question.name.to_text(omit_final_dot=True)
        if name.lower().endswith(_REVERSE):
            response.set_rcode(dns.rcode.NXDOMAIN)  # reverse lookups reach no host: nothing to record
            return
        admitted = await self._admit(name)
        if admitted is None:
            response.set_rcode(dns.rcode.REFUSED)
            return
        version = _ADDRESS_TYPES.get(question.rdtype)
        if version is None:
            return  # MX, TXT, SRV...: an empty answer; only addresses are given out
        if admitted.asked:  # not resolved before the user allows it: our address, which leads to the proxy
            if version == 4:
                response.answer.append(dns.rrset.from_text_list(question.name, 1, "IN", question.rdtype, [UNRESOLVED]))
            return
        addresses = await self._resolve(name)
        if addresses is None:
            response.set_rcode(dns.rcode.SERVFAIL)
        elif not addresses:
            response.set_rcode(dns.rcode.NXDOMAIN)
        else:
            family = [ip for ip in addresses if ip.version == version]
            kept = [str(ip) for ip in await self._reachable(name, family, admitted)]
            if kept:  # none left: an empty answer, as for a name with no address of this family
                response.answer.append(dns.rrset.from_text_list(question.name, TTL, "IN", question.rdtype, kept))

    async def _admit(self, name: str) -> _Admitted | None:
        """How the policy admits ``name``, or ``None`` when it refuses it (the denial recorded)."""
        verdicts = [(port, self.policy.decide(name, port)) for port in PORTS]
        allowed = [(port, verdict) for port, verdict in verdicts if verdict.allowed]
        if allowed:
            return _Admitted(tuple(port for port, _ in allowed), allowed[0][1].rule)
        unknown = tuple(port for port, verdict in verdicts if verdict.allowed is None)
        if unknown and self.policy.ask:
            return _Admitted(unknown, None, asked=True)  # the connection that follows is where the user is asked
        refusal = next((v for _, v in verdicts if v.reason == "denied"), verdicts[0][1])
        message = f"the lookup of {name} was refused: {refusal.message}"
        await self._deny(Denial(name, PORT, denial_reason(refusal), refusal.rule, message))
        return None

    async def _resolve(self, name: str) -> list[IPAddress] | None:
        """The name's addresses (``[]``: it has none), ``None`` if the lookup failed."""
        try:
            with anyio.fail_after(self.resolve_timeout):
                return await self.resolver.resolve(name)
        except Exception as exc:  # a resolver's failure is the jail's SERVFAIL, whatever its kind
            log.info("filtering DNS: resolving %s failed: %r", name, exc)
            return None

    async def _reachable(self, name: str, addresses: list[IPAddress], admitted: _Admitted) -> list[IPAddress]:
        """The addresses the policy lets the jail reach on a port the name was admitted on; a denial for each other."""
        kept = []
        for ip in addresses:
            checks = [self.policy.check_address(ip, port, name_rule=admitted.rule) for port in admitted.ports]
            if any(check.allowed for check in checks):
                kept.append(ip)
                continue
            message = f"{name}: {checks[0].message}; left out of the DNS answer"
            await self._deny(Denial(name, PORT, denial_reason(checks[0]), checks[0].rule, message))
        return kept

    async def _deny(self, denial: Denial) -> None:
        self.denials.append(denial)
        if self.on_denial is None:
            return
        try:
            result = self.on_denial(denial)
            if inspect.isawaitable(result):
                await result
        except Exception:
            log.exception("filtering DNS: the denial callback failed")


def _answer_limit(query: dns.message.Message, *, udp: bool) -> int:
    if not udp:
        return 65535
    if query.edns < 0:
        return UDP_ANSWER
    return max(UDP_ANSWER, min(query.payload, MAX_PACKET))


def _bind_pair(host: str, port: int) -> tuple[socket.socket, socket.socket]:
    """UDP and TCP sockets on one address; with port 0, the port UDP got (retried if TCP has it)."""
    with map_errors("filtering DNS: cannot listen", BackendUnavailable):
        for _attempt in range(8):
            udp = bind_socket(host, port, socket.SOCK_DGRAM, freebind=True)
            try:
                tcp = bind_socket(host, udp.getsockname()[1], socket.SOCK_STREAM, freebind=True)
                tcp.listen(socket.SOMAXCONN)
            except OSError:
                udp.close()
                if port:
                    raise
                continue
            return udp, tcp
        raise OSError("no port free for both UDP and TCP")


async def _read_exact(sock: socket.socket, size: int) -> bytes:
    data = bytearray()
    while len(data) < size:
        try:
            chunk = sock.recv(size - len(data))
        except (BlockingIOError, InterruptedError):
            await anyio.wait_readable(sock)
            continue
        if not chunk:
            raise EOFError
        data += chunk
    return bytes(data)


async def _send_all(sock: socket.socket, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            view = view[sock.send(view) :]
        except (BlockingIOError, InterruptedError):
            await anyio.wait_writable(sock)
