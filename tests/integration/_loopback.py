"""The egress proxy's test lab on loopback, as test_proxy.py (its CONNECT, HTTP and SOCKS5 side) and
test_transparent.py (its transparent listeners) both use it: servers on 127.0.0.1, a proxy that
records what it refused and what it relayed, a bounded wait, and an approver answering from a script."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

import anyio
import anyio.abc

from sandbox.network.policy import EgressPolicy
from sandbox.network.proxy import EgressProxy
from sandbox.network.resolve import StaticResolver

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable

    from sandbox.network.denial import Connected, Denial
    from sandbox.vocabulary import Answer

WAIT = 10.0
"""How long a client waits for an answer: generous, it only bounds a failing test."""
T = TypeVar("T")


async def within(awaitable: Awaitable[T]) -> T:
    with anyio.fail_after(WAIT):
        return await awaitable


async def serve(tg: anyio.abc.TaskGroup, handler: Callable[[anyio.abc.SocketStream], Awaitable[None]]) -> int:
    """Serve ``handler`` on a loopback port in ``tg``; the port."""
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")

    async def run() -> None:
        async with listener:
            await listener.serve(handler)

    tg.start_soon(run)
    port: int = listener.extra(anyio.abc.SocketAttribute.local_port)
    return port


def on(port: int, *names: str) -> list[str]:
    """Allow ``names`` on ``port``, and the loopback address they resolve to on that port."""
    return [f"{name}:{port}" for name in names] + [f"127.0.0.1:{port}"]


@dataclass
class Approver:
    answer: Answer
    asked: list[tuple[str, int]] = field(default_factory=list)

    async def __call__(self, host: str, port: int) -> Answer:
        self.asked.append((host, port))
        return self.answer


@dataclass
class ProxyLab:
    """A lab whose proxies resolve ``NAMES`` and record their denials and connections here; a
    subclass says which listeners its proxies open (:meth:`listeners`)."""

    NAMES: ClassVar[dict[str, list[str]]]
    denials: list[Denial] = field(default_factory=list, kw_only=True)
    connects: list[Connected] = field(default_factory=list, kw_only=True)

    def listeners(self) -> dict[str, Any]:
        raise NotImplementedError

    @contextlib.asynccontextmanager
    async def proxy(
        self, allow: list[str], deny: list[str] | None = None, **options: Any
    ) -> AsyncIterator[EgressProxy]:
        policy = EgressPolicy.from_patterns(allow, deny or [], ask=options.pop("ask", False))

        async def on_denial(denial: Denial) -> None:  # async on purpose: the proxy awaits it
            self.denials.append(denial)

        options.setdefault("resolver", StaticResolver(self.NAMES))
        proxy = EgressProxy(policy, on_denial=on_denial, on_connect=self.connects.append, **self.listeners(), **options)
        async with proxy:
            yield proxy
