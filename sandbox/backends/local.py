"""What the bwrap and host backends share: per-call cgroups, rlimits and the tree kill.

A local call's processes are known two ways: as descendants of the call's first process (for
bwrap, the pid namespace's init, which adopts every orphan of the namespace) and as members
of the call's cgroups (which nothing inside can leave). The kill signals the union of both.

Limits are enforced by a cgroup where this host gives us one (:func:`enforcement` says which,
per limit); without one, memory falls back to ``RLIMIT_DATA`` (per process: it counts private
writable mappings, so runtimes that reserve large ``PROT_NONE`` regions still start) and, under
bwrap as an ordinary user, processes to ``RLIMIT_NPROC``: the kernel counts it per user per user
namespace, and every bwrap call has a user namespace of its own, so it caps the call as a whole.
For root the kernel does not enforce ``RLIMIT_NPROC`` at all, and the host backend has no
namespace of its own (the count would be every process of the user): there, only a cgroup will do.
"""

from __future__ import annotations

import contextlib
import os
from abc import abstractmethod
from typing import TYPE_CHECKING, Any

import anyio

from sandbox.backends import cgroups
from sandbox.backends.base import Jail, Process
from sandbox.backends.confine import KILL_WAIT_S, Kind, Tree, call_cgroup, confine, enforcement, removal_steps

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
    from pathlib import Path

    from sandbox.backends.base import Stdin
    from sandbox.backends.child import Child
    from sandbox.guarantees import Report
    from sandbox.mounts import CopyTree
    from sandbox.profile import Profile


class CgroupPool:
    """A jail's idle call cgroups, reused so a call pays for an attach, not a creation."""

    def __init__(self, profile: Profile) -> None:
        self.profile = profile
        self.idle: list[cgroups.CallCgroup] = []
        self.doomed: list[cgroups.CallCgroup] = []

    def take(self) -> cgroups.CallCgroup | None:
        """An idle cgroup rearmed, or a new one (safe from a thread: one ``pop`` is atomic)."""
        try:
            group = self.idle.pop()
        except IndexError:
            return call_cgroup(self.profile)
        group.rearm()
        return group

    def give_back(self, group: cgroups.CallCgroup) -> None:
        if group.pids():  # a broken promise above: kill, and never share this cgroup again
            group.kill()
            if not group.try_remove():
                self.doomed.append(group)
        else:
            self.idle.append(group)

    async def aclose(self) -> None:
        groups, self.idle, self.doomed = [*self.idle, *self.doomed], [], []
        for group in groups:
            await dispose(group)


async def dispose(group: cgroups.CallCgroup, wait: float = KILL_WAIT_S) -> bool:
    """:func:`~sandbox.backends.confine.removal_steps` on the event loop; ``False`` if the cgroups outlived ``wait``."""
    with anyio.CancelScope(shield=True):
        for pause in removal_steps(group, wait):
            await anyio.sleep(pause)
    return not group.paths


class LocalProcess(Tree, Process):
    """A call started by us on this host, under bwrap (``kernel_reaps``: pid namespace) or not."""

    def __init__(
        self,
        proc: Child,
        root_pid: int,
        cgroup: cgroups.CallCgroup | None,
        on_release: Callable[[LocalProcess], None],
        *,
        kernel_reaps: bool,
    ) -> None:
        """``root_pid`` must not have been reaped yet (it is held, or our unreaped child).

        ``on_release`` hands the cgroup back to the jail's pool and forgets the process.
        """
        Tree.__init__(self, root_pid, cgroup, kernel_reaps=kernel_reaps)
        self._proc = proc
        self.on_release = on_release
        self.stdout = proc.stdout
        self.stderr = proc.stderr
        self.returncode: int | None = None
        self.stdin_data: Stdin = None
        self.audited: Callable[[], Awaitable[dict[str, Any] | None]] | None = None  # the backend's account

    async def kernel_denials(self) -> dict[str, Any] | None:
        return None if self.audited is None else await self.audited()

    async def feed_stdin(self) -> None:
        await self._proc.feed(self.stdin_data or b"")

    async def wait(self) -> int:
        self.returncode = await self._proc.wait()
        return self.returncode

    async def kill_tree(self, grace: float) -> None:
        # Shielded: a caller cancelled during the grace would otherwise leave the kill half-done.
        with anyio.CancelScope(shield=True):
            for pause in self.kill_steps(grace):
                await anyio.sleep(pause)
            with anyio.move_on_after(KILL_WAIT_S):
                await self.wait()

    def oom_killed(self) -> bool:
        return self.cgroup.oom_killed() if self.cgroup else False

    def peak_memory(self) -> int | None:
        return self.cgroup.peak_memory() if self.cgroup else None

    def release(self) -> None:
        self._proc.close()
        self.forget_root()
        self.on_release(self)


class LocalJail(Jail):
    """What the bwrap and host jails share: live calls, their cgroup pool, the private tree.

    A call takes a cgroup from the pool before its first process starts and gives it back if
    the start fails; the backend's ``_launch`` only starts and confines that process.
    """

    def __init__(self, workspace: Path, profile: Profile, tree: CopyTree | None) -> None:
        self.workspace = workspace
        self.profile = profile
        self.tree = tree
        self._live: set[LocalProcess] = set()
        self._pool = CgroupPool(profile)

    def _released(self, proc: LocalProcess) -> None:
        self._live.discard(proc)
        if proc.cgroup is not None:
            self._pool.give_back(proc.cgroup)
            proc.cgroup = None

    async def _start(
        self, argv: Sequence[str], *, env: Mapping[str, str] | None, cwd: str | None, stdin: Stdin, runner: bool = False
    ) -> LocalProcess:
        del runner  # the runner starts as any command does
        group = self._pool.take()
        with contextlib.ExitStack() as cleanup_on_fail:
            if group is not None:
                cleanup_on_fail.callback(self._pool.give_back, group)
            proc = await self._launch(argv, env, cwd, group, stdin=stdin is not None)
            cleanup_on_fail.pop_all()
        proc.stdin_data = stdin
        self._live.add(proc)
        return proc

    @abstractmethod
    async def _launch(
        self,
        argv: Sequence[str],
        env: Mapping[str, str] | None,
        cwd: str | None,
        group: cgroups.CallCgroup | None,
        *,
        stdin: bool,
    ) -> LocalProcess:
        """Start the call's first process confined in ``group``: running the command, or dead.

        ``stdin``: whether the command gets a pipe for its stdin (else it is closed from the start).
        """

    @contextlib.contextmanager
    def _releasing(
        self,
        proc: Child,
        group: cgroups.CallCgroup | None,
        kind: Kind,
        *,
        stdin: bool,
        hold: bytes = b"go\n",
        placed: bool = False,
    ) -> Iterator[LocalProcess]:
        """A first process held before its command (our child: no pid namespace), confined and
        released (``hold``: the line it waits for; ``placed``: in ``group`` already); killed if the
        ``with`` block fails before it ends."""
        with contextlib.ExitStack() as cleanup_on_fail:
            cleanup_on_fail.callback(discard_held, proc)
            child = LocalProcess(proc, proc.pid, group, self._released, kernel_reaps=False)
            cleanup_on_fail.callback(child.forget_root)
            confine(proc.pid, self.profile, None if placed else group, kind)  # placed: in it already
            proc.release_hold(hold, keep_open=stdin)
            yield child
            cleanup_on_fail.pop_all()

    async def _shutdown(self) -> None:
        for proc in list(self._live):
            await proc.kill_tree(0)
            proc.release()
        await self._pool.aclose()


def discard_held(proc: Child) -> None:
    """Kill a call's first process still held before its command (it has started nothing, so it is all there is)."""
    proc.kill()
    proc.popen.wait()
    proc.close()


def report_limits(report: Report, kind: Kind, problem: str | None) -> None:
    """Fill a probe's limits: the mechanism of each, the per-call guarantees, advice where they lack."""
    how = enforcement(kind)
    report.limits = how
    where = cgroups.hierarchies()
    for name, ctrl, guarantee in (("memory", "memory", "memory-limit"), ("pids", "pids", "pids-limit")):
        if how[name].scope == "call":
            report.grant(guarantee, problem is None, problem or "")
        else:
            only = f"only {how[name].how}, per {how[name].scope}; " if how[name].how else ""
            report.grant(guarantee, False, f"{only}no {ctrl} cgroup: {where[ctrl]}")
    for ctrl, value in where.items():
        report.details[f"cgroup-{ctrl}"] = (
            f"{value.mechanism} {value.base}" if isinstance(value, cgroups.Hierarchy) else value
        )
    if os.geteuid() != 0 and not all(isinstance(v, cgroups.Hierarchy) for v in where.values()):
        report.advice.append(
            f"per-call cgroups for an ordinary user: run under a delegated systemd scope, "
            f"{cgroups.DELEGATE_HINT} (cgroup v2)"
        )
        if not any(isinstance(v, cgroups.Hierarchy) and v.version == 2 for v in where.values()):
            report.advice.append(
                "this host mounts its controllers as cgroup v1, which systemd delegates to no user: "
                "run as root, or boot with systemd.unified_cgroup_hierarchy=1 for cgroup v2"
            )
