"""The warm bubblewrap jail as the host holds it: one ``bwrap --as-pid-1``, its agent, our link to it.

Apart from :mod:`sandbox.backends.bwrap_warm` because it is the jail's lifetime, not its calls:
whether the jail may take another call (:attr:`Agent.usable`), how it is killed (PID 1 first, so
that the kernel kills its whole pid namespace, then bwrap), and what it said when it died. The
jail, its calls and its spare (:mod:`sandbox.backends.bwrap_spare`) all hold one of these.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

import anyio

from sandbox.backends import confine

if TYPE_CHECKING:
    from sandbox.backends.agentlink import FdLink
    from sandbox.backends.child import Child

DIAGNOSTICS = 4096


class Agent:
    """One running ``bwrap --as-pid-1`` whose PID 1 is the agent, and our link to it."""

    def __init__(self, proc: Child, init_pid: int, link: FdLink) -> None:
        self.proc = proc
        self.tree = confine.Tree(init_pid, None, kernel_reaps=True)
        self.link = link
        self.doomed = False  # a call left it in a state we cannot trust (unanswered kill, abandoned call)

    @property
    def usable(self) -> bool:
        return not (self.doomed or self.link.dead or self.link.retired) and self.tree.root_alive()

    async def kill(self) -> None:
        """Kill PID 1: the kernel kills every process of its pid namespace; then bwrap ends."""
        with anyio.CancelScope(shield=True):
            self.link.close()
            self.tree.kill_root()
            with anyio.move_on_after(confine.KILL_WAIT_S):
                await self.proc.wait()
            if self.proc.returncode is None:
                self.proc.kill()
                await self.proc.wait()
            self.tree.forget_root()
            await self.proc.aclose()

    async def diagnostics(self) -> str:
        """The exit status of bwrap and the tail of the agent's stderr, once it is gone."""
        code: int | None = None
        with anyio.move_on_after(1):
            code = await self.proc.wait()
        err = b""
        with contextlib.suppress(anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
            with anyio.move_on_after(0.2):
                while len(err) < DIAGNOSTICS:
                    err += await self.proc.stderr.receive()
        text = err.decode(errors="replace").strip()
        why = f": {text.splitlines()[-1][:200]}" if text else ""
        return f"exit status {code}{why}" if code is not None else f"still running{why}"
