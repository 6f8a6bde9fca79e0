"""How the egress proxy decides on a destination and connects to it: every connection the same way.

The policy judges the name and port; a name the policy does not know is put to the approver when
the policy asks (no approver, an error or the timeout deny; an ``allow-session`` answer is kept for
the proxy's life). The proxy resolves the name itself and checks *every* address (a name that
resolves to loopback, a private network or the metadata service is refused unless that address is
allowed: no DNS rebinding), then connects to an address it checked, never re-resolving. With an
upstream proxy the name is judged the same but the upstream resolves it and connects
(:mod:`~sandbox.network.upstream`). Whatever refuses raises :class:`~sandbox.network.denial.Refused`.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import anyio

from sandbox.network.conn import connect
from sandbox.network.denial import Refused, denial_reason, where
from sandbox.network.policy import Verdict, literal_address
from sandbox.vocabulary import Answer

if TYPE_CHECKING:
    from sandbox.network.conn import Conn
    from sandbox.network.policy import EgressPolicy, IPAddress
    from sandbox.network.resolve import Resolver
    from sandbox.network.upstream import Upstream

log = logging.getLogger(__name__)

Approver = Callable[[str, int], Awaitable[Answer]]
"""Asked about a destination the policy does not know (``ask = true``): host and port in, an answer out."""


@dataclass(frozen=True)
class Opened:
    """A connection to an allowed destination: what it went to and the rule that allowed it."""

    conn: Conn
    address: str
    rule: str | None


class Dialer:
    """Judges destinations for one proxy and connects to the allowed ones (:meth:`open`).

    ``approver`` may be set while the proxy serves; ``ask_timeout`` bounds each question to it.
    """

    def __init__(
        self,
        policy: EgressPolicy,
        resolver: Resolver,
        *,
        approver: Approver | None,
        ask_timeout: float,
        upstream: Upstream | None,
        connect_timeout: float,
        resolve_timeout: float,
    ) -> None:
        self.policy, self.resolver = policy, resolver
        self.approver, self.ask_timeout = approver, ask_timeout
        self.upstream = upstream
        self.connect_timeout, self.resolve_timeout = connect_timeout, resolve_timeout
        self._grants: set[tuple[str, int]] = set()
        self._ask_locks: defaultdict[tuple[str, int], anyio.Lock] = defaultdict(anyio.Lock)
        self.narrowed: list[EgressPolicy] = []  # the calls running with a narrower allowlist: each must allow
        self.on_grant: Callable[[str, int], None] | None = None  # told of each allow-session answer

    async def open(self, host: str, port: int) -> Opened:
        """A connection to ``host`` and ``port`` if they are allowed; :class:`Refused` says why not."""
        verdict = self.policy.decide(host, port)
        if verdict.allowed is False:
            raise Refused.of(host, port, verdict)
        for narrower in list(self.narrowed):
            if narrower.decide(host, port).allowed is not True:
                why = f"{where(host, port)} is outside the allowlist this call narrowed the session's to"
                raise Refused(host, port, "not-allowed", None, why)
        asked = verdict.allowed is None
        if asked:
            verdict = await self._ask(host, port, verdict)
        if self.upstream is not None:
            conn = await self.upstream.tunnel(host, port, self.connect_timeout)
            return Opened(conn, f"via upstream {self.upstream}", verdict.rule)
        addresses = await self._checked_addresses(host, port, verdict, asked=asked)
        conn, address = await self._connect_any(host, port, addresses)
        return Opened(conn, where(str(address), port), verdict.rule)

    async def _ask(self, host: str, port: int, verdict: Verdict) -> Verdict:
        if not self.policy.ask:
            raise Refused.of(host, port, verdict)
        key = (host.lower().rstrip("."), port)
        async with self._ask_locks[key]:  # one question per destination at a time; a session grant answers the rest
            if key in self._grants:
                return Verdict(True, "ask:allow-session", "allowed", f"{where(host, port)} was allowed for the session")
            answer = await self._approval(host, port)
            if answer == "allow-session":
                self._grants.add(key)
                if self.on_grant is not None:
                    self.on_grant(host, port)
            return Verdict(True, f"ask:{answer}", "allowed", f"{where(host, port)} was allowed by the user ({answer})")

    async def _approval(self, host: str, port: int) -> Answer:
        target = where(host, port)
        if self.approver is None:
            raise Refused(
                host, port, "ask-unavailable", None, f"{target} is not on the allowlist and no one can be asked"
            )
        try:
            with anyio.fail_after(self.ask_timeout):
                answer = await self.approver(host, port)
        except TimeoutError:
            raise Refused(
                host, port, "ask-timeout", None, f"no answer about {target} in {self.ask_timeout:g} s"
            ) from None
        except Exception as exc:
            log.warning("egress proxy: approver failed for %s: %r", target, exc)
            raise Refused(host, port, "ask-unavailable", None, f"asking about {target} failed: {exc}") from None
        if answer == "allow-once" or answer == "allow-session":  # anything else, even a malformed answer, denies
            return answer
        raise Refused(host, port, "ask-denied", None, f"the user denied {target}")

    async def _checked_addresses(self, host: str, port: int, verdict: Verdict, *, asked: bool) -> list[IPAddress]:
        literal = literal_address(host)
        if literal is not None and asked:
            return [literal]  # the user approved this very address
        addresses = [literal] if literal is not None else await self._resolve(host, port)
        for ip in addresses:
            check = self.policy.check_address(ip, port, name_rule=verdict.rule)
            if not check.allowed:
                raise Refused(host, port, denial_reason(check), check.rule, f"{host}: {check.message}")
        return addresses

    async def _resolve(self, host: str, port: int) -> list[IPAddress]:
        try:
            with anyio.fail_after(self.resolve_timeout):
                addresses = await self.resolver.resolve(host)
        except Exception as exc:
            raise Refused(
                host, port, "resolve-failed", None, f"resolving {host} failed: {exc or type(exc).__name__}"
            ) from None
        if not addresses:
            raise Refused(host, port, "resolve-failed", None, f"{host} has no address")
        return addresses

    async def _connect_any(self, host: str, port: int, addresses: list[IPAddress]) -> tuple[Conn, IPAddress]:
        failures: list[str] = []
        for ip in addresses:
            try:
                with anyio.fail_after(self.connect_timeout):
                    return await connect(str(ip), port), ip
            except (OSError, TimeoutError) as exc:
                failures.append(f"{where(str(ip), port)}: {exc.strerror if isinstance(exc, OSError) else 'timed out'}")
        raise Refused(host, port, "connect-failed", None, "connecting failed: " + "; ".join(failures))
