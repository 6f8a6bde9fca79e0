"""A per-call jail's pool of fresh agent containers: each taken by one call, never given back.

Starting a container (create, attach, start, the agent's word, its connection checked) costs
about what ``docker run`` does; the call itself, through the agent, a few milliseconds. So a
per-call jail keeps :data:`POOL_SIZE` containers started ahead, each with the agent as its PID 1
and linked exactly as a warm jail's (:mod:`.links`), and a call takes one: the pool never hands a
container out twice, and the call's container is removed once the call is over
(:class:`~sandbox.backends.docker.percall.PerCallJail`).

Refilling happens off the call's path: a thread of the pool's asks the event loop, one start at
a time, to start the next container (:func:`anyio.from_thread.run`: the links need the loop), so
the jail needs no task group that would tie its closing to the task that opened it. A call that
finds the pool empty waits for the start in flight, or starts its own when none is. A failed
start stops the refilling and is kept in :attr:`Pool.error`; the next call then starts its own
container and gets the real error (fail closed), and a success resumes the refilling.

Closing cancels the start in flight (its own clean-up removes what it created), waits for the
thread to let go, and drops the containers left. What a killed executor leaves behind ends by
itself: each idle agent reads its socket and its attach stream, whose end (our process gone)
makes it kill everything and exit, and the daemon auto-removes its container; the owner labels
let ``sandbox gc`` remove any that a dead daemon kept.
"""

from __future__ import annotations

import collections
import contextlib
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

import anyio
import anyio.from_thread
import anyio.lowlevel

from sandbox.backends.docker.links import HELLO_WAIT_S

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from sandbox.backends.agentlink import Link
    from sandbox.backends.docker.runtime import Runtime

POOL_SIZE = 2  # a constant: one for the next call, one for a burst; each is an idle python3 (~10 MB)
CLOSE_WAIT_S = HELLO_WAIT_S + 30  # closing: the longest a cancelled start may take to clean up


@dataclass(eq=False)
class Box:
    """One started container and the link to its idle agent."""

    runtime: Runtime
    link: Link

    @property
    def usable(self) -> bool:
        """Still fit for a call: not removed, its agent alive and untampered with."""
        return not (self.runtime.removed or self.link.dead or self.link.retired)


class Pool:
    """Fresh containers for one jail's calls; create it (and use it) on the jail's event loop."""

    def __init__(
        self,
        launch: Callable[[], Awaitable[Box]],
        drop: Callable[[Box], Awaitable[None]],
        size: int = POOL_SIZE,
    ) -> None:
        self._launch = launch
        self._drop = drop
        self.size = size
        self._ready: collections.deque[Box] = collections.deque()
        self._filling = False  # the filler thread runs (state changes only on the loop)
        self._closed = False
        self._scope: anyio.CancelScope | None = None  # the start in flight, cancelled by close()
        self._changed = anyio.Event()
        self._token = anyio.lowlevel.current_token()
        self.error: Exception | None = None  # why the last background start failed
        self.started = 0  # containers started, by the filler or by calls

    @property
    def ready(self) -> int:
        return len(self._ready)

    @property
    def filling(self) -> bool:
        return self._filling

    async def start(self) -> None:
        """The first container in the foreground (a jail that cannot start one fails to open); the rest behind."""
        self._ready.append(await self._new())
        self._kick()

    async def take(self) -> Box:
        """A container no call has had: a ready one, the one being started, or one started here."""
        while True:
            while self._ready:
                box = self._ready.popleft()
                if box.usable:
                    self._kick()
                    return box
                await self._drop(box)  # its agent died while it waited: it goes, unused
            if not self._filling:
                box = await self._new()
                self._kick()
                return box
            await self._changed.wait()

    async def full(self) -> None:
        """Wait until the refilling stopped: the pool is full, closed, or its last start failed."""
        while self._filling:
            await self._changed.wait()

    async def close(self) -> None:
        """Stop refilling, cancel the start in flight, drop the containers left (shield this)."""
        self._closed = True
        if self._scope is not None:
            self._scope.cancel()
        with anyio.move_on_after(CLOSE_WAIT_S):
            await self.full()
        while self._ready:
            await self._drop(self._ready.popleft())

    async def _new(self) -> Box:
        box = await self._launch()
        self.started += 1
        return box

    def _kick(self) -> None:
        """Refill in the background, unless that is already under way or nothing is missing."""
        if self._filling or self._closed or len(self._ready) >= self.size:
            return
        self._filling = True
        try:
            threading.Thread(target=self._fill, name="docker-pool-fill", daemon=True).start()
        except RuntimeError:  # no thread to spare (a fork bomb in another jail): calls start their own
            self._filling = False

    def _fill(self) -> None:
        """The filler thread: one start at a time on the loop, until it says stop."""
        # Anything raised here, the loop's cancellation included, means the loop is gone (a jail
        # never closed): its containers end with our links, and this thread with nothing to say.
        with contextlib.suppress(BaseException):
            while anyio.from_thread.run(self._fill_one, token=self._token):
                pass

    async def _fill_one(self) -> bool:
        """Start one container for the pool; whether to go on (on the loop, from the filler thread)."""
        if self._closed or len(self._ready) >= self.size:
            return self._stop()
        with anyio.CancelScope() as scope:
            self._scope = scope
            try:
                box = await self._new()
            except Exception as exc:  # kept for the next call to meet again, in its own start
                self.error = exc
                return self._stop()
            finally:
                self._scope = None
        if scope.cancelled_caught:
            return self._stop()
        if self._closed:
            with anyio.CancelScope(shield=True):
                await self._drop(box)
            return self._stop()
        self.error = None
        self._ready.append(box)
        self._notify()
        return True

    def _stop(self) -> bool:
        self._filling = False
        self._notify()
        return False

    def _notify(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()
