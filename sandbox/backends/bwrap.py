"""The bubblewrap jail: the embedded default, no daemon.

Each call runs in fresh user, pid, net, ipc, uts and cgroup namespaces. bwrap is asked to
report the host pid of the namespace's init (``--info-fd``) and to hold the command
(``--block-fd``) until that init has been placed in the call's cgroups and given its rlimits,
so no process of the call ever runs unconfined. Killing that init makes the kernel kill every
process of the namespace, which is what catches setsid'd, double-forked and TERM-ignoring
children; a process-group kill would not.
"""

from __future__ import annotations

import contextlib
import functools
import os
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

import anyio

from sandbox.backends import bwrap_argv, cgroups, confine, jailpython, local, seal, seccomp
from sandbox.backends.base import Backend, off_loop, soon
from sandbox.backends.bwrap_argv import bwrap_path, jail_args
from sandbox.backends.child import Child
from sandbox.backends.environment import base_env, host_files
from sandbox.downloads import JAIL_DIR as downloads_jail_dir
from sandbox.errors import BackendUnavailable
from sandbox.guarantees import Report
from sandbox.mounts import CopyTree, OverlayTree, overlay_support

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from sandbox.backends.seal import Seal
    from sandbox.network.egress import Egress
    from sandbox.profile import Profile

START_TIMEOUT_S = 30.0


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
        with contextlib.ExitStack() as ours, contextlib.ExitStack() as theirs:
            with confine.starting("cannot start bwrap"):
                info_r, info_w = _pipe(ours, theirs)
                block_r, block_w = _pipe(theirs, ours)
            fds = [info_w, block_r]
            if self._seccomp:
                with confine.starting("cannot read the seccomp filter"):
                    fds.append(seccomp.open_filter())
                theirs.callback(os.close, fds[-1])
            cmd = self._command(argv, env, cwd, *fds)
            with confine.starting("cannot start bwrap"):
                proc = Child(cmd, pass_fds=tuple(fds), stdin=stdin)
            theirs.close()  # bwrap holds them now: end of file on info_r means it is gone
            return await self._release_held(proc, info_r, block_w, group)

    def _command(
        self,
        argv: Sequence[str],
        env: Mapping[str, str] | None,
        cwd: str | None,
        info_w: int,
        block_r: int,
        seccomp_fd: int | None = None,
    ) -> list[str]:
        env_args = [
            a for k, v in base_env(self.profile, env, workspace=self.workspace).items() for a in ("--setenv", k, v)
        ]
        return [
            *self._prefix,
            "--chdir",
            cwd or str(self.workspace),
            "--clearenv",
            *env_args,
            "--info-fd",
            str(info_w),
            "--block-fd",
            str(block_r),
            *(["--seccomp", str(seccomp_fd)] if seccomp_fd is not None else []),
            "--",
            *argv,
        ]

    async def _release_held(
        self, proc: Child, info_r: int, block_w: int, group: cgroups.CallCgroup | None
    ) -> local.LocalProcess:
        """Confine bwrap's init while it waits on the block fd, then let it run the command.

        Closing the block fd unconfined would let the command run too, outside the call's
        cgroups and beyond our reach once bwrap itself is killed: so a start is never cancelled
        half-way (it takes milliseconds), and on any failure the held init is killed first.
        """
        async with contextlib.AsyncExitStack() as cleanup_on_fail:
            cleanup_on_fail.push_async_callback(_kill_bwrap, proc)
            try:
                with anyio.CancelScope(shield=True), anyio.fail_after(START_TIMEOUT_S):
                    init_pid = await _read_init_pid(info_r, proc)
            except TimeoutError as exc:
                raise BackendUnavailable(
                    f"bwrap did not start the jail within {START_TIMEOUT_S:g} s", backend="bwrap"
                ) from exc
            # While bwrap waits on the block fd its init cannot exit: its pid is still its own.
            child = local.LocalProcess(proc, init_pid, group, self._released, kernel_reaps=True)
            cleanup_on_fail.callback(child.forget_root)
            cleanup_on_fail.callback(child.kill_root)
            confine.confine(init_pid, self.profile, group, "bwrap")
            if self.egress is not None and self.egress.transparent:
                # Its one way out, before its command runs: the veth pair, routes and rules.
                with anyio.CancelScope(shield=True):
                    await off_loop(self.egress.attach, init_pid)
            os.write(block_w, b"1")
            cleanup_on_fail.pop_all()
        return child


def _pipe(read_end: contextlib.ExitStack, write_end: contextlib.ExitStack) -> tuple[int, int]:
    """A pipe whose ends are closed with the given stacks."""
    r, w = os.pipe()
    read_end.callback(os.close, r)
    write_end.callback(os.close, w)
    return r, w


async def _kill_bwrap(proc: Child) -> None:
    """Kill a bwrap that failed to start a call (its held init, if any, is killed already)."""
    with anyio.CancelScope(shield=True):
        proc.kill()
        await proc.wait()
        await proc.aclose()


async def _read_init_pid(fd: int, proc: Child) -> int:
    info = bwrap_argv.InfoReader(fd)
    while not info.done:
        await anyio.wait_readable(fd)
        info.read()
    pid = info.init_pid()
    if pid is not None:
        return pid
    await proc.wait()
    err = b""
    with contextlib.suppress(anyio.EndOfStream, anyio.ClosedResourceError):
        while len(err) < 4096:
            err += await proc.stderr.receive()
    raise BackendUnavailable(
        f"bwrap failed to start the jail: {err.decode(errors='replace').strip() or 'no reason given'}",
        backend="bwrap",
        exit_code=proc.returncode,
    )


class BwrapBackend(Backend):
    name = "bwrap"
    binds_downloads = True

    def _probe(self) -> Report:
        return _report()

    async def _open(
        self,
        workspace: Path,
        profile: Profile,
        *,
        scratch: Path | None,
        egress: Egress | None,
        shared: Sequence[tuple[str, str]] = (),
        downloads: Path | None = None,
    ) -> BwrapJail:
        host_files(profile)  # a file that became a secret is refused before a copy exists
        tree: CopyTree | None = None
        source = workspace
        sealed = await off_loop(bwrap_argv.find_sealed, profile, workspace)
        if profile.mount.strategy in ("copy", "overlay"):
            kind = OverlayTree if profile.mount.strategy == "overlay" else CopyTree
            # A copy leaves the masked secrets out: the jail masks their (empty) mount points.
            exclude = (*profile.mount.exclude, *sealed.masked_paths)
            cache = profile.mount.environment_cache == "project"
            tree = await kind.prepare(
                workspace, exclude=exclude, environment_cache=cache, environment=profile.mount.environment
            )
            source = tree.root
            if profile.mount.strategy == "copy" and os.geteuid() == 0:
                # The jail writes with our uid and no capabilities: the copy must be ours to write.
                await off_loop(tree.hand_to, os.geteuid(), os.getegid())
        args = (workspace, profile, source, tree, scratch, egress.socket_dir if egress else None, sealed, shared)
        if profile.bwrap.lifecycle == "call":
            return BwrapJail(*args, downloads=downloads)
        from sandbox.backends.bwrap_warm import WarmBwrapJail

        jail = WarmBwrapJail(*args, downloads=downloads)
        jail.egress = egress  # the transparent mode's veth goes to the jail at its start
        try:
            await jail.start()
        except BaseException:
            jail.egress = None  # open_jail closes it
            await jail.aclose()
            raise
        return jail


_ALWAYS = (
    "fs-readonly-root",
    "fs-write-confined",
    "fs-hidden-home",
    "net-none",
    "net-confined",
    "net-allowlist",
    "tree-kill",
    "no-new-privs",
    "non-root",
    "no-caps",
    "env-scrubbed",
    "new-session",
    "cpu-limit",
    "fsize-limit",
    "tmp-size-limit",
)


def _smoke() -> str | None:
    """Run one real jail; ``None`` when it confined as promised, else why not."""
    from sandbox.profile import Profile

    empty = Path(bwrap_argv.empty_dir())
    cmd = [
        *bwrap_argv.command_prefix(Profile()),
        *jail_args(Profile(), empty, empty),
        "--clearenv",
        "--",
        "/bin/sh",
        "-c",
        "grep -E '^(NoNewPrivs|CapEff|Uid)' /proc/self/status",
    ]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"bwrap did not run: {exc}"
    if out.returncode != 0:
        return f"bwrap cannot create a jail here: {out.stderr.strip() or out.returncode}"
    fields = dict(line.split(":", 1) for line in out.stdout.splitlines())
    if fields.get("NoNewPrivs", "").strip() != "1" or int(fields.get("CapEff", "1"), 16) != 0:
        return f"the jail kept privileges: {fields}"
    return None


def _report() -> Report:
    """What bwrap enforces here; a failure to fork is marked ``transient``, so it is asked again."""
    path = bwrap_path()
    if path is None:
        return Report("bwrap", False, "bubblewrap is not installed (apt-get install bubblewrap)")
    problem, version = _smoke_verdict(path)
    report = Report("bwrap", problem is None, problem or "")
    if problem and "Errno 11]" in problem:
        report.details["transient"] = True
    report.details["version"] = version
    for name in _ALWAYS:
        report.grant(name, problem is None, problem or "")
    local.report_limits(report, "bwrap", problem)
    report.details["session-tree-kill"] = _warm_tree_kill()
    no_filter = problem or seccomp.availability()
    report.grant("seccomp", no_filter is None, no_filter or "")
    from sandbox.network import netns

    transparent = problem or netns.available()
    report.grant("net-transparent", transparent is None, transparent or "")
    overlay = overlay_support()
    report.grant("overlay", overlay is None and problem is None, overlay or problem or "")
    return report


def _warm_tree_kill() -> str:
    """How a warm jail (``[bwrap] lifecycle = "session"``) kills a call's tree on this host."""
    pids = cgroups.hierarchies()["pids"]
    if isinstance(pids, cgroups.Hierarchy):
        return (
            f"the agent's sweep, backed by each call's own cgroup ({pids.mechanism}, joined before the command "
            "runs) and by the jail's pid namespace when the agent does not answer"
        )
    return (
        "the agent's sweep (kill -1 in the jail's pid namespace); when the agent does not answer, the whole "
        f"pid namespace: no per-call cgroup here ({pids})"
    )


def _smoke_verdict(path: str) -> tuple[str | None, str]:
    """The smoke test's verdict and bwrap's version, from the data directory's cache when it is current.

    Every process used to run a real jail (and ``bwrap --version``) before its first call: a
    third of a short ``sandbox run``. A passed smoke test is kept, keyed by what decides it:
    this package's version, the bwrap binary (inode, size, mtime), the kernel and boot, our
    euid and the user-namespace sysctls. A stale "available" can only make bwrap itself fail at
    the next call, which is BACKEND_UNAVAILABLE: it never runs anything unconfined. Failures are
    never cached, so a host that is fixed is seen at once.
    """
    kept = bwrap_argv.passed_smoke(path)
    if kept is not None:
        return None, kept
    problem = _smoke()
    try:
        version = subprocess.run([path, "--version"], capture_output=True, text=True, check=False).stdout.strip()
    except OSError as exc:
        version = f"unknown ({exc.strerror})"
    if problem is None:
        bwrap_argv.remember_smoke(path, version)
    return problem, version


backend_class = BwrapBackend
