"""What the egress proxy and the filtering DNS server report: a :class:`Denial` for each refusal, a
:class:`Connected` for each connection made, and how those reach a callback.

A refusal travels inside the proxy as :class:`Refused` (an exception carrying its denial) from
wherever it is decided (the policy, the approver, the resolver, a request on the connection) to
the protocol that answers the client in kind (403, a SOCKS failure, a TLS alert) and records it.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from sandbox.network.policy import Verdict
    from sandbox.vocabulary import DenialReason, ProxyProtocol

log = logging.getLogger(__name__)

PATH_SHOWN = 200
"""How much of a refused request's path a denial keeps."""


@dataclass(frozen=True)
class Denial:
    """One refused connection, as the audit, the tool result and the JSON-RPC stream carry it."""

    host: str
    port: int
    reason: DenialReason
    rule: str | None
    message: str
    method: str | None = None  # a request refused on a terminated host (the broker): its method and path
    path: str | None = None

    def line(self) -> str:
        """The one line a model reads for this denial."""
        if self.method is not None:
            return (
                f"sandbox: request {self.method} {self.path} to {where(self.host, self.port)} refused"
                f" ({self.reason}): {self.message}"
            )
        return f"sandbox: connection to {where(self.host, self.port)} refused ({self.reason}): {self.message}"

    def for_request(self, method: str, target: str) -> Denial:
        """This denial as one request's (its path without the query, at most :data:`PATH_SHOWN` characters)."""
        path = target.split("?", 1)[0]
        path = path if len(path) <= PATH_SHOWN else path[: PATH_SHOWN - 3] + "..."
        return dataclasses.replace(self, method=method[:32], path=path)


@dataclass(frozen=True)
class Connected:
    """One allowed connection: ``address`` is what the proxy connected to (``via upstream h:p`` if chained)."""

    host: str
    port: int
    address: str
    rule: str | None
    protocol: ProxyProtocol


OnDenial = Callable[[Denial], Awaitable[None] | None]
OnConnect = Callable[[Connected], Awaitable[None] | None]
_E = TypeVar("_E", Denial, Connected)


class Refused(Exception):
    """A connection (or a request on one) refused: :attr:`denial` says where to and why."""

    def __init__(self, host: str, port: int, reason: DenialReason, rule: str | None, message: str) -> None:
        super().__init__(message)
        self.denial = Denial(host, port, reason, rule, message)

    @classmethod
    def of(cls, host: str, port: int, verdict: Verdict) -> Refused:
        return cls(host, port, denial_reason(verdict), verdict.rule, verdict.message)


def denial_reason(verdict: Verdict) -> DenialReason:
    """A refusing verdict's reason as a denial's (``not-allowed`` for an allowed one refused without a grant)."""
    return "not-allowed" if verdict.reason == "allowed" else verdict.reason


async def report(callback: Callable[[_E], Awaitable[None] | None] | None, event: _E) -> None:
    """Tell ``callback`` (plain or async) of ``event``; its failure is logged, never the connection's."""
    if callback is None:
        return
    try:
        result = callback(event)
        if inspect.isawaitable(result):
            await result
    except Exception:
        log.exception("egress proxy: the %s callback failed", type(event).__name__)


def where(host: str, port: int) -> str:
    """``host:port``, an IPv6 address in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
