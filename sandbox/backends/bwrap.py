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
import json
import os
import shutil
import stat
import subprocess
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

import anyio

from sandbox import datadir
from sandbox.backends import cgroups, local
from sandbox.backends.base import Backend, off_loop
from sandbox.backends.child import Child
from sandbox.backends.environment import SANDBOX_GID, SANDBOX_HOME, SANDBOX_UID, base_env, bwrap_args, host_files
from sandbox.errors import BackendUnavailable
from sandbox.guarantees import Report
from sandbox.mounts import CopyTree, OverlayTree, check_workspace, overlay_support

if TYPE_CHECKING:

    from collections.abc import Mapping, Sequence

    from sandbox.backends.base import Stdin
    from sandbox.profile import Profile

START_TIMEOUT_S = 30.0
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32")
MASKED_TREES = ("/etc",)


def bwrap_path() -> str | None:
    return shutil.which("bwrap")


@cache
def _empty_dir() -> str:
    path = datadir.subdir("empty")
    path.chmod(0o555)
    return str(path)


@cache
def _masks() -> tuple[str, ...]:
    """Entries under /etc that only their owner can read (shadow, ssl/private, host keys ...).

    The jail's uid maps to the caller's; when that caller is root it would own these files,
    so they are hidden behind an empty file or directory rather than trusted to permissions.
    Computed afresh by every process (a chmod changes no cheap key), with ``scandir``: a
    quarter of what ``os.walk`` plus an ``lstat`` per entry costs.
    """
    args: list[str] = []
    pending = list(MASKED_TREES)
    while pending:
        with contextlib.suppress(OSError), os.scandir(pending.pop()) as entries:
            for entry in entries:
                with contextlib.suppress(OSError):
                    st = entry.stat(follow_symlinks=False)
                    if stat.S_ISLNK(st.st_mode):
                        continue
                    is_dir = stat.S_ISDIR(st.st_mode)
                    if st.st_mode & stat.S_IROTH:
                        if is_dir:
                            pending.append(entry.path)
                        continue  # nothing below a mask matters, so only readable dirs are entered
                    args += ["--ro-bind", _empty_dir() if is_dir else "/dev/null", entry.path]
    return tuple(args)


def _system_mounts() -> list[str]:
    args: list[str] = []
    for path in SYSTEM_DIRS:
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    args += ["--ro-bind", "/etc", "/etc", *_masks()]
    return args


def jail_args(profile: Profile, workspace: Path, source: Path, scratch: Path | None = None) -> list[str]:
    """The bwrap arguments shared by every call of a jail (everything but fds, env and argv)."""
    ws = str(workspace)
    args = [
        "--unshare-all",
        *(["--share-net"] if profile.network.mode == "host" else []),
        "--unshare-user", "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_GID),
        "--disable-userns",
        "--die-with-parent",
        "--new-session",
        "--cap-drop", "ALL",
        "--hostname", "sandbox",
        *_system_mounts(),
        "--proc", "/proc",
        "--dev", "/dev",
        *(["--size", str(profile.limits.tmp_size)] if profile.limits.tmp_size else []),
        "--tmpfs", "/tmp",
        "--dir", SANDBOX_HOME,
        *bwrap_args(profile),  # env.files: host files, read-only, in the jail's home
        "--ro-bind" if profile.mount.strategy == "ro" else "--bind", str(source), ws,
        *(["--bind", str(scratch), str(scratch)] if scratch is not None else []),
        "--remount-ro", "/",
    ]
    return args


class BwrapJail(local.LocalJail):
    backend = "bwrap"

    @property
    def host_paths_shown(self) -> tuple[str, ...]:
        return (str(self.workspace), *(os.path.realpath(d) for d in SYSTEM_DIRS), "/etc")

    def __init__(self, workspace: Path, profile: Profile, source: Path, tree: CopyTree | None,
                 scratch: Path | None = None) -> None:
        super().__init__(workspace, profile, tree)
        self._prefix = [_require_bwrap(), *jail_args(profile, workspace, source, scratch)]

    async def spawn(
        self, argv: Sequence[str], *, env: Mapping[str, str] | None = None, cwd: str | None = None,
        stdin: Stdin = None,
    ) -> local.LocalProcess:
        self._check_spawn(argv)
        group = self._pool.take()
        try:
            proc = await self._start(argv, env, cwd, group, stdin is not None)
        except BaseException:
            if group:
                self._pool.give_back(group)
            raise
        proc.stdin_data = stdin
        self._live.add(proc)
        return proc

    async def _start(
        self, argv: Sequence[str], env: Mapping[str, str] | None, cwd: str | None,
        group: cgroups.CallCgroup | None, stdin: bool,
    ) -> local.LocalProcess:
        with local.starting("cannot start bwrap"):
            info_r, info_w = os.pipe()
            block_r, block_w = os.pipe()
        env_args = [a for k, v in base_env(self.profile, env, workspace=self.workspace).items()
                    for a in ("--setenv", k, v)]
        cmd = [*self._prefix, "--chdir", cwd or str(self.workspace), "--clearenv", *env_args,
               "--info-fd", str(info_w), "--block-fd", str(block_r), "--", *argv]
        try:
            with local.starting("cannot start bwrap"):
                proc = Child(cmd, pass_fds=(info_w, block_r), stdin=stdin)
        except BaseException:
            os.close(info_r)
            os.close(block_w)
            raise
        finally:
            os.close(info_w)
            os.close(block_r)
        try:
            return await self._release_held(proc, info_r, block_w, group)
        finally:
            os.close(info_r)
            os.close(block_w)

    async def _release_held(self, proc: Child, info_r: int, block_w: int,
                            group: cgroups.CallCgroup | None) -> local.LocalProcess:
        """Confine bwrap's init while it waits on the block fd, then let it run the command.

        Closing the block fd unconfined would let the command run too, outside the call's
        cgroups and beyond our reach once bwrap itself is killed: so a start is never cancelled
        half-way (it takes milliseconds), and on any failure the held init is killed first.
        """
        child = None
        try:
            with anyio.CancelScope(shield=True), anyio.fail_after(START_TIMEOUT_S):
                init_pid = await _read_init_pid(info_r, proc)
            # While bwrap waits on the block fd its init cannot exit: its pid is still its own.
            child = local.LocalProcess(proc, init_pid, group, self._released, kernel_reaps=True)
            local.confine(init_pid, self.profile, group, "bwrap")
            os.write(block_w, b"1")
        except BaseException as exc:
            with anyio.CancelScope(shield=True):
                if child is not None:
                    child.kill_root()
                    child.forget_root()
                proc.kill()
                await proc.wait()
                await proc.aclose()
            if isinstance(exc, TimeoutError):
                raise BackendUnavailable(f"bwrap did not start the jail within {START_TIMEOUT_S:g} s",
                                         backend="bwrap") from exc
            raise
        return child


async def _read_init_pid(fd: int, proc: Child) -> int:
    data = b""
    while not data.rstrip().endswith(b"}"):
        await anyio.wait_readable(fd)
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        data += chunk
    try:
        return int(json.loads(data)["child-pid"])
    except (ValueError, KeyError):
        await proc.wait()
        err = b""
        with contextlib.suppress(anyio.EndOfStream, anyio.ClosedResourceError):
            while len(err) < 4096:
                err += await proc.stderr.receive()
        raise BackendUnavailable(
            f"bwrap failed to start the jail: {err.decode(errors='replace').strip() or 'no reason given'}",
            backend="bwrap", exit_code=proc.returncode,
        ) from None


def _require_bwrap() -> str:
    path = bwrap_path()
    if path is None:
        raise BackendUnavailable(
            "bubblewrap is not installed: apt-get install bubblewrap (or use --backend docker)",
            backend="bwrap",
        )
    return path


class BwrapBackend(Backend):
    name = "bwrap"

    def probe(self) -> Report:
        return probe()

    async def open_jail(self, workspace: Path, profile: Profile, *, scratch: Path | None = None) -> BwrapJail:
        self.check(profile)
        host_files(profile)  # a file that became a secret is refused before a copy exists
        ws = check_workspace(workspace)
        tree: CopyTree | None = None
        source = ws
        if profile.mount.strategy in ("copy", "overlay"):
            tree = await (OverlayTree if profile.mount.strategy == "overlay" else CopyTree).prepare(ws)
            source = tree.root
            if profile.mount.strategy == "copy" and os.geteuid() == 0:
                # The jail writes with our uid and no capabilities: the copy must be ours to write.
                await off_loop(tree.hand_to, os.geteuid(), os.getegid())
        return BwrapJail(ws, profile, source, tree, scratch)


_ALWAYS = ("fs-readonly-root", "fs-write-confined", "fs-hidden-home", "net-none", "tree-kill",
           "no-new-privs", "non-root", "no-caps", "env-scrubbed", "new-session", "cpu-limit",
           "fsize-limit", "tmp-size-limit")


def _smoke() -> str | None:
    """Run one real jail; ``None`` when it confined as promised, else why not."""
    from sandbox.profile import Profile

    empty = Path(_empty_dir())
    cmd = [_require_bwrap(), *jail_args(Profile(), empty, empty), "--clearenv", "--",
           "/bin/sh", "-c", "grep -E '^(NoNewPrivs|CapEff|Uid)' /proc/self/status"]
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


_probed: list[Report] = []


def probe() -> Report:
    """The bwrap report, cached once a smoke test has run (a host out of processes is asked again)."""
    if _probed:
        return _probed[0]
    report = _probe()
    if report.details.get("transient") is None:
        _probed.append(report)
    return report


def _probe() -> Report:
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
    report.grant("seccomp", False, "the bwrap backend installs no seccomp filter (Docker's default one applies there)")
    overlay = overlay_support()
    report.grant("overlay", overlay is None and problem is None, overlay or problem or "")
    return report


def _smoke_verdict(path: str) -> tuple[str | None, str]:
    """The smoke test's verdict and bwrap's version, from the data directory's cache when it is current.

    Every process used to run a real jail (and ``bwrap --version``) before its first call: a
    third of a short ``sandbox run``. A passed smoke test is kept, keyed by what decides it:
    this package's version, the bwrap binary (inode, size, mtime), the kernel and boot, our
    euid and the user-namespace sysctls. A stale "available" can only make bwrap itself fail at
    the next call, which is BACKEND_UNAVAILABLE: it never runs anything unconfined. Failures are
    never cached, so a host that is fixed is seen at once.
    """
    key = _smoke_key(path)
    cache = datadir.data_dir() / "cache" / "bwrap-probe.json"
    with contextlib.suppress(OSError, ValueError):
        kept = json.loads(cache.read_text())
        if kept.get("key") == key:
            return None, str(kept["version"])
    problem = _smoke()
    try:
        version = subprocess.run([path, "--version"], capture_output=True, text=True, check=False).stdout.strip()
    except OSError as exc:
        version = f"unknown ({exc.strerror})"
    if problem is None:
        with contextlib.suppress(OSError):
            cache.parent.mkdir(mode=0o700, exist_ok=True)
            temp = cache.with_name(f".{cache.name}.{os.getpid()}")
            temp.write_text(json.dumps({"key": key, "version": version}))
            temp.replace(cache)
    return problem, version


_SMOKE_SYSCTLS = ("/proc/sys/kernel/random/boot_id", "/proc/sys/user/max_user_namespaces",
                  "/proc/sys/kernel/unprivileged_userns_clone",
                  "/proc/sys/kernel/apparmor_restrict_unprivileged_userns")


def _smoke_key(path: str) -> str:
    from sandbox import __version__

    st = os.stat(path)
    parts = [__version__, os.path.realpath(path), st.st_ino, st.st_size, st.st_mtime_ns, os.uname().release,
             os.geteuid()]
    for name in _SMOKE_SYSCTLS:
        try:
            with open(name, encoding="utf-8") as fh:
                parts.append(fh.read().strip())
        except OSError:
            parts.append("-")
    return json.dumps(parts)


backend_class = BwrapBackend
