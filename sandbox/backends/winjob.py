"""Windows job objects: one job per call, the command started suspended, assigned, then resumed.

Pure Python over ``ctypes`` and ``_winapi`` (no pywin32), so the official embeddable CPython runs
it. Each call gets a job object with ``KILL_ON_JOB_CLOSE`` (our process dying kills the tree),
no breakaway, UI restrictions, and the profile's limits (active processes, job memory, job CPU
time, CPU rate). The first process is created ``CREATE_SUSPENDED`` with exactly three inherited
handles (a ``PROC_THREAD_ATTRIBUTE_HANDLE_LIST``), assigned to the job, and only then resumed, so
nothing it starts can be outside the job. stdout and stderr are two anonymous pipes, each read by a
worker thread (a blocking ``ReadFile``: honest on every anyio backend, no proactor needed).

Tree kill: ``TerminateJobObject`` on timeout, abort and close, then the job's accounting is polled
until ``ActiveProcesses`` is zero before the call returns. Windows has no TERM: the kill grace is
not used. A root process the kill ended reports ``-9`` (as SIGKILL would on POSIX); any other exit
code is the process's own 32-bit code, so a crash reads as its NTSTATUS (``0xC0000005`` is
3221225477, :func:`~sandbox.backends.winjob_process.ntstatus_name` names it).

On real Windows the commands run under a restricted token at low integrity, with write access
granted (an ACE for the jail's own SID and a low label) only to the workspace's view and a
private home and temp directory (:mod:`sandbox.backends.winjob_token`). Mounts: ``rw``, ``ro``
(the workspace granted read only: the low integrity refuses writes) and ``copy`` (a private copy,
the changeset and a guarded apply, :mod:`sandbox.mounts.winapply`); no ``overlay``. Bash
runs in the profile's ``winjob.shell``; the file tools' runner runs in the job like any command.

What this backend does not do (and :meth:`WinJobBackend.probe` says so, never claims): network
denial (that needs an AppContainer) and hidden home directories. Under Wine (detected by
``ntdll.wine_get_version``) the job limits, tokens, labels and ACLs are accepted but not
enforced, so Wine jails run with the caller's token and all of those are reported unavailable.

On any other platform the module still imports (for the loader and ``sandbox check``) and the
backend reports itself unavailable with the reason.

This module holds the backend, its jail (which opens, launches a call and shuts down) and what it
claims; the parts live beside it: the job object and the Win32 vocabulary
(:mod:`~sandbox.backends.winjob_job`), a started call's process, pipes and tree kill
(:mod:`~sandbox.backends.winjob_process`), its environment, command line and shell
(:mod:`~sandbox.backends.winjob_command`), the copy's view of the workspace
(:mod:`~sandbox.backends.winjob_view`) and the restricted token (:mod:`~sandbox.backends.winjob_token`).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio

from sandbox import shells
from sandbox.backends import winjob_token
from sandbox.backends.base import Backend, Jail
from sandbox.backends.winjob_command import command_line, resolve, shell_argv, windows_env
from sandbox.backends.winjob_job import (
    CREATE_NO_WINDOW,
    CREATE_SUSPENDED,
    CREATE_UNICODE_ENVIRONMENT,
    INFINITE,
    KILLED_EXIT,
    NAME,
    STARTF_USESTDHANDLES,
    Job,
    kernel32,
    wine_version,
)
from sandbox.backends.winjob_process import (
    PipeStream,
    WinJobProcess,
    anonymous_pipe,
    close_handles,
    inheritable,
)
from sandbox.backends.winjob_view import View, ViewReply
from sandbox.errors import BackendUnavailable, GuaranteeUnavailable, InvalidArgument
from sandbox.guarantees import Enforcement, Report
from sandbox.threads import off_loop

if sys.platform == "win32":
    import _winapi
else:  # the module imports everywhere (the loader, ``sandbox check``); nothing here calls it
    _winapi: Any = None
_subprocess: Any = subprocess  # STARTUPINFO exists only on Windows

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from sandbox.backends.base import Stdin
    from sandbox.mounts import CopyTree
    from sandbox.network.egress import Egress
    from sandbox.profile import Profile
    from sandbox.snapshots import Snapshot


# -- jail --------------------------------------------------------------------------------------------


class WinJobJail(Jail):
    """One workspace in job objects. ``view`` is where its commands work: the workspace itself
    (``rw``, ``ro``), or under ``copy`` the private copy, which Windows cannot show at the
    workspace's own path (no mount namespace): a working directory in the workspace is moved to
    the same place in the copy, and the file tools' requests and replies are translated (:class:`View`)."""

    backend = NAME

    def __init__(
        self, workspace: Path, profile: Profile, private: Path, *, enforce_limits: bool, view: Path | None = None
    ) -> None:
        self.workspace = workspace
        self.profile = profile
        self.private = private  # the jail's home and temp directory, removed on close
        self.enforce_limits = enforce_limits
        self.view = View(workspace, view or workspace)
        # The shell the Bash tool runs in unless a call names one: the profile's, else the user's default.
        self.shell = shells.effective(NAME, profile.winjob.shell).id
        self.confinement: Confinement | None = None  # the token and grants (real Windows)
        self._live: set[WinJobProcess] = set()

    @property
    def host_paths_shown(self) -> tuple[str, ...]:
        return (self.workspace.anchor,)  # no filesystem view of its own: the host's drives as they are

    def shell_argv(self, command: str, shell: str | None = None) -> list[str]:
        """No bash on Windows: ``shell`` (the session's effective one: cmd, Windows PowerShell or
        Git's bash), else the profile's, else the catalogue's first, runs the command."""
        return shell_argv(command, shell or self.shell)

    async def _start(
        self, argv: Sequence[str], *, env: Mapping[str, str] | None, cwd: str | None, stdin: Stdin, runner: bool = False
    ) -> WinJobProcess:
        op = None
        if runner:
            argv = await off_loop(self._runner_argv, argv[-1])
            if isinstance(stdin, bytes):
                stdin, op = self.view.request(stdin)
        proc = await off_loop(self._launch, list(argv), env, cwd, stdin is not None)
        if runner and self.view.moved:
            proc.stdout = ViewReply(proc.stdout, self.view, op)
        proc.stdin_data = stdin
        proc.on_release = self._live.discard
        self._live.add(proc)
        return proc

    def _runner_argv(self, program: str) -> list[str]:
        """The file tools' runner (``python3 -I -S -c PROGRAM`` on POSIX) as this Python runs it
        inside the job: from a file (Windows caps a command line at 32,767 characters). The runner
        is Windows-safe itself (no O_NOFOLLOW there: its realpath check of the approved path is the
        guard; binary opens; ``os.replace``); its writes are confined as Bash's are, by the job's token."""
        text = program
        path = self.private / f"jailside-{hashlib.sha256(text.encode()).hexdigest()[:16]}.py"
        if not path.exists():
            tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
            tmp.write_text(text, encoding="utf-8")
            os.replace(tmp, path)
        return [sys.executable, "-I", "-S", str(path)]

    def _launch(
        self, argv: list[str], extra: Mapping[str, str] | None, cwd: str | None, with_stdin: bool
    ) -> WinJobProcess:
        assert sys.platform == "win32"
        env = windows_env(self.profile, str(self.private / "home"), self.view.root, extra)
        where = self.view.into(cwd) if cwd else str(self.view.root)
        if not os.path.isdir(where):
            raise InvalidArgument(f"the working directory {where} does not exist", cwd=where)
        exe = resolve(argv[0], env["PATH"], where)
        if exe is None:
            # As the POSIX backends' jails answer: 127 with one line on stderr, from inside the job.
            cmd = env.get("ComSpec", "cmd.exe")
            argv = [cmd, "/d", "/c", f"echo sandbox: {argv[0]}: command not found 1>&2 & exit 127"]
            exe = cmd
        elif exe.lower().endswith((".bat", ".cmd")):
            argv = shell_argv(subprocess.list2cmdline([exe, *argv[1:]]), comspec=env.get("ComSpec"))
            exe = argv[0]
        else:
            argv = [exe, *argv[1:]]
        job = Job(self.profile, enforce_limits=self.enforce_limits)
        ours: list[int] = []
        theirs: list[int] = []
        try:
            out_r, out_w = anonymous_pipe()
            ours.append(out_r)
            theirs.append(out_w := inheritable(out_w))
            err_r, err_w = anonymous_pipe()
            ours.append(err_r)
            theirs.append(err_w := inheritable(err_w))
            in_r, in_w = anonymous_pipe()
            ours.append(in_w)
            theirs.append(in_r := inheritable(in_r))
            info = _subprocess.STARTUPINFO(
                dwFlags=STARTF_USESTDHANDLES,
                hStdInput=in_r,
                hStdOutput=out_w,
                hStdError=err_w,
                lpAttributeList={"handle_list": list(theirs)},
            )
            flags = CREATE_SUSPENDED | CREATE_UNICODE_ENVIRONMENT | CREATE_NO_WINDOW
            cmdline = command_line(argv)
            if self.confinement is not None:
                std = (in_r, out_w, err_w)
                hp, ht, pid = self.confinement.start(exe, cmdline, env, where, flags, std)
            else:
                try:
                    hp, ht, pid, _tid = _winapi.CreateProcess(exe, cmdline, None, None, True, flags, env, where, info)
                except OSError as exc:
                    raise BackendUnavailable(f"cannot start {argv[0]}: {exc.strerror}", backend=NAME) from exc
            try:
                job.assign(hp)
            except BaseException:
                _winapi.TerminateProcess(hp, KILLED_EXIT)
                close_handles(hp, ht)
                raise
            if kernel32().ResumeThread(ht) == INFINITE:  # (DWORD)-1
                _winapi.TerminateProcess(hp, KILLED_EXIT)
                close_handles(hp, ht)
                raise BackendUnavailable("ResumeThread failed", backend=NAME)
            close_handles(ht)
        except BaseException:
            close_handles(*ours)
            job.close()
            raise
        finally:
            close_handles(*theirs)
        if not with_stdin:
            close_handles(in_w)
        return WinJobProcess(job, hp, pid, PipeStream(out_r), PipeStream(err_r), in_w if with_stdin else None)

    async def _shutdown(self) -> None:
        try:
            for proc in list(self._live):
                await proc.kill_tree(0)
                proc.release()
        finally:
            if self.confinement is not None:
                await off_loop(self.confinement.close)
            await off_loop(shutil.rmtree, self.private, True)


# -- backend -----------------------------------------------------------------------------------------

WINE_NO_ACL = "Wine accepts file ACLs, integrity labels and restricted tokens but enforces none of them"
LINUX_ONLY = "a Linux facility; no Windows equivalent in this backend"


class WinJobBackend(Backend):
    name = NAME

    async def _recover(self, workspace: Path) -> None:
        """Nothing to recover: the journal is POSIX code (flock, ``O_DIRECTORY``), and a copy's
        apply here is :mod:`winjob_apply`, which keeps no journal."""

    def _probe(self) -> Report:
        if sys.platform != "win32":
            return Report(NAME, False, f"Windows job objects need Windows; this host runs {sys.platform}")
        try:
            wine = wine_version()
            api = kernel32()
            handle = api.CreateJobObjectW(None, None)
            api.check(handle, "CreateJobObjectW")
            api.CloseHandle(handle)
        except (OSError, BackendUnavailable) as exc:
            return Report(NAME, False, f"job objects are not usable here: {exc}")
        return _report(wine, _token_problem(wine))

    async def _open(
        self,
        workspace: Path,
        profile: Profile,
        *,
        scratch: Path | None,  # noqa: ARG002 - shown where it is, as every host path
        egress: Egress | None,  # noqa: ARG002 - check refuses allowlist: net-allowlist is not granted
        shared: Sequence[tuple[str, str]] = (),
        downloads: Path | None = None,  # noqa: ARG002 - refused by open_jail (binds_downloads)
        seed: Snapshot | None = None,  # noqa: ARG002 - refused by open_jail (check_snapshots)
    ) -> WinJobJail:
        if shared:
            raise GuaranteeUnavailable(
                f"the winjob backend cannot show {shared[0][0]} at {shared[0][1]} (no mount namespace)",
                backend="winjob",
            )
        if why := mount_refusal(profile.mount.strategy, wine_version()):
            raise GuaranteeUnavailable(why, backend=NAME, mount=profile.mount.strategy)
        if profile.network.mode != "host":
            raise GuaranteeUnavailable(
                f"the winjob backend cannot provide network.mode = {profile.network.mode!r}: it does not cut the "
                "network yet (that needs an AppContainer); use a profile with network.mode = 'host'",
                backend=NAME,
            )
        private = Path(await off_loop(tempfile.mkdtemp, "", "sandbox-winjob-"))
        tree: CopyTree | None = None
        try:
            for sub in ("home", "tmp", "home\\AppData\\Roaming", "home\\AppData\\Local"):
                (private / sub).mkdir(parents=True, exist_ok=True)
            if profile.mount.strategy == "copy":
                # No bind on Windows to keep an excluded path read-only: every entry is copied.
                from sandbox import mounts

                tree = await mounts.CopyTree.prepare(workspace)
                tree.root = Path(await off_loop(os.path.abspath, tree.root))  # a drive-relative data dir made whole
            jail = WinJobJail(
                workspace,
                profile,
                private,
                enforce_limits=wine_version() is None,
                view=tree.root if tree is not None else None,
            )
            jail.tree = tree
            if confines():
                jail.confinement = await off_loop(Confinement.open, jail.view.root, private, profile.mount.strategy)
        except BaseException:
            with anyio.CancelScope(shield=True):
                if tree is not None:
                    await off_loop(tree.remove)
                await off_loop(shutil.rmtree, private, True)
            raise
        return jail


def mount_refusal(strategy: str, wine: str | None) -> str | None:
    """Why this backend cannot give mount ``strategy`` here, or ``None``."""
    if strategy == "overlay":
        return "the winjob backend cannot provide mount 'overlay': it is a Linux filesystem; use copy"
    if strategy == "ro" and wine:  # never claimed under Wine, its token test hook included
        return f"the winjob backend cannot guarantee mount 'ro' here: {WINE_NO_ACL}"
    return None


TOKEN_UNDER_WINE = "SANDBOX_WINJOB_TOKEN_UNDER_WINE"


def confines(wine: str | None = None) -> bool:
    """Whether jails run under the restricted token with ACL grants: on real Windows always.

    Under Wine not (it enforces none of it), except when ``SANDBOX_WINJOB_TOKEN_UNDER_WINE=1``
    asks, so the Wine suite can run the token's code path (a test hook: nothing is claimed)."""
    if sys.platform != "win32":
        return False
    wine = wine if wine is not None else wine_version()
    return wine is None or os.environ.get(TOKEN_UNDER_WINE) == "1"


class Confinement:
    """A jail's restricted token and its grants (:mod:`sandbox.backends.winjob_token`)."""

    def __init__(self, jail_sid: str, token: int, grants: winjob_token.Grants) -> None:
        self.jail_sid = jail_sid
        self.token = token
        self.grants = grants

    @classmethod
    def open(cls, view: Path, private: Path, strategy: str) -> Confinement:
        """Grant the jail SID its private directory and the workspace's view (read-only for ``ro``),
        then make its token; on failure take back what was granted."""
        sid = winjob_token.new_jail_sid()
        grants = winjob_token.Grants(sid, labels=wine_version() is None)
        try:
            grants.grant(private, write=True)
            grants.grant(view, write=strategy != "ro")
            token = winjob_token.restricted_token(sid)
        except BaseException:
            grants.revoke()
            raise
        return cls(sid, token, grants)

    def start(
        self, exe: str, cmdline: str, env: dict[str, str], cwd: str, flags: int, std: tuple[int, int, int]
    ) -> tuple[int, int, int]:
        return winjob_token.create_process(self.token, exe, cmdline, env, cwd, flags, std)

    def close(self) -> None:
        if self.token:
            close_handles(self.token)
            self.token = 0
        self.grants.revoke()


def _token_problem(wine: str | None) -> str | None:
    """Why jails here do not run under the restricted token at low integrity, or ``None``."""
    if wine:
        return WINE_NO_ACL
    try:
        token = winjob_token.restricted_token(winjob_token.new_jail_sid())
    except (OSError, BackendUnavailable) as exc:
        return f"the restricted token cannot be made here: {exc}"
    close_handles(token)
    return None


def _report(wine: str | None, token_problem: str | None) -> Report:
    report = Report(NAME, True)
    report.details["wine"] = wine or ""
    if token_problem is None:
        # Low integrity: no write up to the (medium) system, the user's files, anything not granted.
        report.grant("fs-readonly-root", True)
        report.grant("fs-write-confined", True)
        report.grant("non-root", True)  # every privilege but SeChangeNotify gone, Administrators deny-only
        report.details["confinement"] = "restricted token, low integrity, ACL grants for the jail's SID"
    else:
        for name in ("fs-readonly-root", "fs-write-confined", "non-root"):
            report.grant(name, False, token_problem)
    report.grant(
        "fs-hidden-home",
        False,
        "not claimed: the restricted token closes only the files whose ACL names no group it keeps "
        "(Everyone, Users, Authenticated Users); home directories are not absent",
    )
    for name in ("net-none", "net-confined", "net-allowlist", "net-transparent"):
        report.grant(name, False, "not implemented: the network is the caller's (only an AppContainer would cut it)")
    for name in ("no-new-privs", "no-caps", "seccomp", "overlay"):
        report.grant(name, False, LINUX_ONLY)
    report.grant("new-session", False, "a POSIX session; the command gets a hidden console of its own instead")
    report.grant("tmp-size-limit", False, "no Windows equivalent in this backend")
    report.grant("fsize-limit", False, "no Windows equivalent in this backend")
    report.grant("env-scrubbed", True)
    report.grant("tree-kill", True)  # a job object per call, KILL_ON_JOB_CLOSE, no breakaway
    report.details["mounts"] = {m: mount_refusal(m, wine) or "available" for m in ("rw", "ro", "copy", "overlay")}
    if ro := mount_refusal("ro", wine):
        report.advice.append(f"mount ro is refused here: {ro.split(': ', 1)[1]}; rw and copy are available")
    report.advice.append("mount copy: applied file by file, guarded, staged then renamed; no crash journal on Windows")
    if wine:
        why = f"Wine {wine} accepts job limits but does not enforce them"
        for name in ("memory-limit", "pids-limit", "cpu-limit"):
            report.grant(name, False, why)
        report.limits = {name: Enforcement(None, why_not=why) for name in ("memory", "pids", "cpu_time_s", "cpus")}
        report.details["warning"] = "running under Wine: only the job's tree kill is real; limits are not enforced"
    else:
        for name in ("memory-limit", "pids-limit", "cpu-limit"):
            report.grant(name, True)
        report.limits = {
            "memory": Enforcement("job memory limit", "call"),
            "pids": Enforcement("job active-process limit", "call"),
            "cpu_time_s": Enforcement("job user-time limit", "call"),
            "cpus": Enforcement("job CPU rate control (hard cap)", "call"),
        }
    none = "no Windows equivalent in this backend"
    report.limits.update({name: Enforcement(None, why_not=none) for name in ("file_size", "nofile", "tmp_size")})
    return report


backend_class = WinJobBackend
