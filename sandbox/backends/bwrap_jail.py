"""The bubblewrap jail of one call at a time (``[bwrap] lifecycle = "call"``), and the base of the warm one.

Each call runs in fresh user, pid, net, ipc, uts and cgroup namespaces, started by
:mod:`~sandbox.backends.bwrap_start` with its command held until the namespace's init has been
placed in the call's cgroups and given its rlimits, so no process of the call ever runs
unconfined. Killing that init makes the kernel kill every process of the namespace, which is
what catches setsid'd, double-forked and TERM-ignoring children; a process-group kill would not.
"""

from __future__ import annotations

import contextlib
import functools
from typing import TYPE_CHECKING

import anyio

from sandbox.backends import bwrap_argv, bwrap_start, cgroups, confine, jailpython, local, seal, seccomp
from sandbox.backends.bwrap_argv import jail_args
from sandbox.backends.child import Child
from sandbox.backends.environment import base_env
from sandbox.downloads import JAIL_DIR as downloads_jail_dir
from sandbox.threads import off_loop, soon

_STDERR_SHOWN = 4096  # of a bwrap that failed to start, what its message may take

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from pathlib import Path

    from sandbox.backends.seal import Seal
    from sandbox.mounts import CopyTree
    from sandbox.profile import Profile


class BwrapJail(local.LocalJail):
    backend = "bwrap"

    @property
    def host_paths_shown(self) -> tuple[str, ...]:
        return bwrap_argv.host_paths_shown(self.workspace)

    def __init__(
        self,
        workspace: Path,
        profile: Profile,
        source: Path,
        tree: CopyTree | None,
        scratch: Path | None = None,
        egress_dir: Path | None = None,
        sealed: Seal | None = None,
        shared: Sequence[tuple[str, str]] = (),
        downloads: Path | None = None,
    ) -> None:
        super().__init__(workspace, profile, tree)
        untracked = tree.untracked if tree is not None else ()
        sealed = sealed if sealed is not None else bwrap_argv.find_sealed(profile, workspace)
        # The seal is searched again before each call (seal.Watch): the arguments are rebuilt when it moved.
        self._watch = seal.watch(profile, workspace, source, tree, sealed, shared)
        self._jail_args = functools.partial(
            jail_args, profile, workspace, source, scratch, untracked, egress_dir, downloads=downloads
        )
        self._shared = tuple(shared)
        self._sealing = anyio.Lock()  # per-call jails run calls side by side: one search and rebuild at a time
        self._prefix = [*bwrap_argv.command_prefix(profile), *self._jail_args(sealed, self._shared)]
        # Our programs' interpreter: the host's, verified, with no mount of this jail at or above it.
        writable = [str(workspace), "/tmp", *([str(scratch)] if scratch is not None else [])]
        writable += [downloads_jail_dir] if downloads is not None else []
        self.python = jailpython.bwrap_python([*writable, *(target for _, target in shared)])
        self._seccomp = seccomp.availability() is None  # absent: `check` says so, a requiring profile is refused

    async def _resealed(self) -> bool:
        """Search the seal again before a call (cached: a ``stat`` per directory when nothing moved);
        when a mask moved, rebuild the jail's arguments and say so (a warm jail is then replaced)."""
        async with self._sealing:  # a call that waited here then reads the arguments rebuilt
            sealed = await soon(self._watch.changed, inline=self._watch.quick)
            if sealed is None:
                return False
            self._prefix = [*bwrap_argv.command_prefix(self.profile), *self._jail_args(sealed, self._shared)]
            return True

    async def _launch(
        self,
        argv: Sequence[str],
        env: Mapping[str, str] | None,
        cwd: str | None,
        group: cgroups.CallCgroup | None,
        *,
        stdin: bool,
    ) -> local.LocalProcess:
        await self._resealed()  # a secret that appeared since the last call is masked for this one
        with self._start_fds(block=True) as fds:
            environment = base_env(self.profile, env, workspace=self.workspace)
            cmd = bwrap_start.command(self._prefix, fds, argv, chdir=cwd or str(self.workspace), env=environment)
            with confine.starting("cannot start bwrap"):
                proc = Child(cmd, pass_fds=fds.theirs, stdin=stdin)
            fds.handed_over()  # end of file on the info pipe now means bwrap is gone
            return await self._release_held(proc, fds, group)

    def _start_fds(self, *, block: bool) -> bwrap_start.StartFds:
        """A start's descriptors, the seccomp filter's among them where this host has one."""
        seccomp_fd = None
        if self._seccomp:
            with confine.starting("cannot read the seccomp filter"):
                seccomp_fd = seccomp.open_filter()
        with confine.starting("cannot start bwrap"):
            return bwrap_start.StartFds(block=block, seccomp_fd=seccomp_fd)

    async def _release_held(
        self, proc: Child, fds: bwrap_start.StartFds, group: cgroups.CallCgroup | None
    ) -> local.LocalProcess:
        """Confine bwrap's init while it waits on the block fd, then let it run the command.

        Releasing the block fd unconfined would let the command run too, outside the call's
        cgroups and beyond our reach once bwrap itself is killed: so a start is never cancelled
        half-way (it takes milliseconds), and on any failure the held init is killed first.
        """
        async with contextlib.AsyncExitStack() as cleanup_on_fail:
            cleanup_on_fail.push_async_callback(kill_bwrap, proc)
            init_pid = await read_init_pid(fds.info_r, proc)
            # While bwrap waits on the block fd its init cannot exit: its pid is still its own.
            child = local.LocalProcess(proc, init_pid, group, self._released, kernel_reaps=True)
            cleanup_on_fail.callback(child.forget_root)
            cleanup_on_fail.callback(child.kill_root)
            confine.confine(init_pid, self.profile, group, "bwrap")
            if self.egress is not None and self.egress.transparent:
                # Its one way out, before its command runs: the veth pair, routes and rules.
                with anyio.CancelScope(shield=True):
                    await off_loop(self.egress.attach, init_pid)
            fds.release()
            cleanup_on_fail.pop_all()
        return child


async def read_init_pid(fd: int, proc: Child) -> int:
    """The host pid of the jail's init, as bwrap reports it; a bwrap that did not start raises,
    with its own message. Never cancelled half-way (it takes milliseconds), bounded in time."""
    info = bwrap_argv.InfoReader(fd)
    try:
        with anyio.CancelScope(shield=True), anyio.fail_after(bwrap_start.START_TIMEOUT_S):
            while not info.done:
                await anyio.wait_readable(fd)
                info.read()
    except TimeoutError as exc:
        raise bwrap_start.not_started() from exc
    pid = info.init_pid()
    if pid is not None:
        return pid
    await proc.wait()
    err = b""
    with contextlib.suppress(anyio.EndOfStream, anyio.ClosedResourceError):
        while len(err) < _STDERR_SHOWN:
            err += await proc.stderr.receive()
    raise bwrap_start.failed(err.decode(errors="replace").strip() or "no reason given", proc.returncode)


async def kill_bwrap(proc: Child) -> None:
    """Kill a bwrap that failed to start (its held init, if any, is killed already)."""
    with anyio.CancelScope(shield=True):
        proc.kill()
        await proc.wait()
        await proc.aclose()
