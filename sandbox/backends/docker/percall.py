"""The per-call Docker jail: a fresh container for every call (``lifecycle = "call"``), through its agent.

Each call gets a container no other call had, from the jail's :class:`~.pool.Pool` of containers
started ahead: the agent of :mod:`sandbox._jailside.agent` is its PID 1 (as in a warm jail,
:mod:`.warm`), linked over our socket, and the call is one ``run`` request to it with the call's
pipe ends passed along (:mod:`.links`): no ``docker exec``, no byte of output through dockerd.
The agent loads the executor's seccomp filter on top of Docker's default profile first, so a
per-call command has the same extra denials as a warm one.

What stays fresh per call: the processes, ``/tmp``, the home directory and the environment,
which die with the call's container. What a jail shares across its calls, as before: the
workspace, or its private copy (one per jail: ``copy`` mode's changeset is the jail's), and the
scratch directory.

Once the call is over (released), its link is closed: the agent, reading the end of its socket,
kills everything of the command uid and exits, and the daemon auto-removes the container; we
also force-remove it in a thread, off the call's path. A kill (timeout, abort) is the agent's
sweep as in a warm jail; an agent that does not answer, or dies, takes its container with it.
"""

from __future__ import annotations

import contextlib
import threading
from typing import TYPE_CHECKING, Any

import anyio

from sandbox.backends.docker.client import quietly, run_sync
from sandbox.backends.docker.pool import Box, Pool
from sandbox.backends.docker.warm import AgentCall, AgentJail
from sandbox.errors import BackendUnavailable

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from sandbox.backends.base import Stdin
    from sandbox.backends.docker.runtime import Runtime


class PerCallJail(AgentJail):
    """A fresh container per call, taken from a pool of started ones and removed after the call."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._pool: Pool | None = None
        self._calls: dict[AgentCall, Box] = {}
        self._sealing = anyio.Lock()
        self.stream: str | None = None  # how the last container's calls travel: ``socket`` or ``attach``

    @property
    def pool(self) -> Pool:
        if self._pool is None:
            raise RuntimeError("the per-call jail was not started")  # a programming error, not a user's
        return self._pool

    async def start(self) -> None:
        self._pool = Pool(self._fresh, self._drop)
        await self._pool.start()

    async def _fresh(self) -> Box:
        runtime, link = await self._launch()
        self.stream = link.stream
        return Box(runtime, link)

    async def _start(
        self, argv: Sequence[str], *, env: Mapping[str, str] | None, cwd: str | None, stdin: Stdin, runner: bool = False
    ) -> AgentCall:
        async with self._sealing:  # calls run side by side: none takes an old container once the seal moved
            if await self._resealed():  # a secret appeared since the pool's containers were started
                await self._renew_pool()
        for retry in (False, True):
            box = await self.pool.take()
            try:
                proc = await self._send_run(box.runtime, box.link, argv, env, cwd, stdin, runner)
            except BaseException as exc:
                # Its container died while it waited in the pool (killed from outside, say): not
                # the call's doing, and nothing of the call ran there; one more try, no more.
                with anyio.CancelScope(shield=True):  # the drop must happen, cancelled or not
                    again = isinstance(exc, BackendUnavailable) and not retry and await self._died_waiting(box)
                    await self._drop(box)
                if again:
                    continue
                raise
            self._calls[proc] = box
            return proc
        raise AssertionError("unreachable: the second try returns or raises")

    async def _renew_pool(self) -> None:
        """Drop the containers started with the old seal; the next ones have the new config."""
        old, self._pool = self._pool, Pool(self._fresh, self._drop)
        if old is not None:
            with anyio.CancelScope(shield=True):
                await old.close()
        await self._pool.start()

    async def _died_waiting(self, box: Box) -> bool:
        if box.link.dead:
            return True
        with contextlib.suppress(BackendUnavailable):
            return not await run_sync("cannot inspect the container", box.runtime.alive)
        return False

    async def _drop(self, box: Box) -> None:
        """Remove a container (shielded: a cancelled call leaves none behind)."""
        with anyio.CancelScope(shield=True):
            box.link.close()
            if not box.runtime.removed:
                await run_sync("cannot remove the call's container", box.runtime.remove)

    async def discard(self, runtime: Runtime) -> None:
        for box in self._calls.values():
            if box.runtime is runtime:
                box.link.close()
        if not runtime.removed:
            await run_sync("cannot remove the call's container", runtime.remove)

    def call_done(self, proc: AgentCall) -> None:
        box = self._calls.pop(proc, None)
        if not proc.finished:
            proc.lost()  # its container goes now: what carries its output (attach: our streams) ends too
        proc.forget()
        if box is None:
            return
        # Closing the link is the kill: the agent sees its socket end, kills what is left of the
        # uid and exits, and auto-remove takes the container. The forced removal makes sure,
        # in a thread: the caller has its result already.
        box.link.close()
        if not box.runtime.removed:
            threading.Thread(target=quietly, args=(box.runtime.remove,), daemon=True).start()

    def _release_calls(self) -> None:
        for proc in list(self._calls):
            proc.release()

    async def _shutdown(self) -> None:
        # The pool first: no container may start after the label sweep of DockerJail._shutdown.
        if self._pool is not None:
            await self._pool.close()
        await super()._shutdown()
