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
3221225477, :func:`ntstatus_name` names it).

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
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import json
import ntpath
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from ctypes import wintypes
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
from anyio.abc import ByteReceiveStream

from sandbox.backends import winjob_token
from sandbox.backends.base import Backend, Jail, Process
from sandbox.errors import BackendUnavailable, GuaranteeUnavailable, InvalidArgument, ShellNotFound
from sandbox.guarantees import Enforcement, Report
from sandbox.threads import off_loop

if sys.platform == "win32":
    import _winapi
else:  # the module imports everywhere (the loader, ``sandbox check``); nothing here calls it
    _winapi: Any = None
_subprocess: Any = subprocess  # STARTUPINFO exists only on Windows
_ctypes: Any = ctypes  # so do WinDLL, get_last_error and FormatError

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from sandbox.backends.base import Stdin
    from sandbox.mounts import CopyTree
    from sandbox.network.egress import Egress
    from sandbox.profile import Profile

NAME = "winjob"
KILL_WAIT_S = 5.0  # how long the job may take to report no active process after TerminateJobObject
KILLED_EXIT = 0x5A4E0009  # the exit code TerminateJobObject gives; wait() reports it as -9
READ_SIZE = 1 << 16

# -- Win32 constants ---------------------------------------------------------------------------------
CREATE_SUSPENDED = 0x00000004
DETACHED_PROCESS = 0x00000008
CREATE_NEW_CONSOLE = 0x00000010
CREATE_NEW_PROCESS_GROUP = 0x00000200
CREATE_UNICODE_ENVIRONMENT = 0x00000400
CREATE_BREAKAWAY_FROM_JOB = 0x01000000
CREATE_NO_WINDOW = 0x08000000
STARTF_USESTDHANDLES = 0x00000100
INFINITE = 0xFFFFFFFF
WAIT_OBJECT_0 = 0
STILL_ACTIVE = 259
ERROR_BROKEN_PIPE = 109
ERROR_NO_DATA = 232
DUPLICATE_SAME_ACCESS = 0x2

JobObjectBasicAccountingInformation = 1
JobObjectBasicProcessIdList = 3
JobObjectBasicUIRestrictions = 4
JobObjectExtendedLimitInformation = 9
JobObjectCpuRateControlInformation = 15

JOB_OBJECT_LIMIT_JOB_TIME = 0x00000004
JOB_OBJECT_LIMIT_ACTIVE_PROCESS = 0x00000008
JOB_OBJECT_LIMIT_JOB_MEMORY = 0x00000200
JOB_OBJECT_LIMIT_DIE_ON_UNHANDLED_EXCEPTION = 0x00000400
JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE = 0x00002000
JOB_OBJECT_CPU_RATE_CONTROL_ENABLE = 0x1
JOB_OBJECT_CPU_RATE_CONTROL_HARD_CAP = 0x4
UI_RESTRICTIONS = 0x01 | 0x02 | 0x04 | 0x08 | 0x10 | 0x20 | 0x40 | 0x80  # handles ... exitwindows

NTSTATUS_NAMES = {
    0xC0000005: "STATUS_ACCESS_VIOLATION",
    0xC000001D: "STATUS_ILLEGAL_INSTRUCTION",
    0xC0000094: "STATUS_INTEGER_DIVIDE_BY_ZERO",
    0xC00000FD: "STATUS_STACK_OVERFLOW",
    0xC0000409: "STATUS_STACK_BUFFER_OVERRUN",
    0xC0000017: "STATUS_NO_MEMORY",
    0xC000013A: "STATUS_CONTROL_C_EXIT",
    0xC0000135: "STATUS_DLL_NOT_FOUND",
    0xC0000142: "STATUS_DLL_INIT_FAILED",
    0x80000003: "STATUS_BREAKPOINT",
}


def ntstatus_name(code: int) -> str | None:
    """``"0xC0000005 STATUS_ACCESS_VIOLATION"`` for an exit code that is an NTSTATUS error or
    warning (the high bits of a crash), else ``None``."""
    code &= 0xFFFFFFFF
    if code < 0x80000000:
        return None
    name = NTSTATUS_NAMES.get(code)
    return f"0x{code:08X}" + (f" {name}" if name else "")


# -- structures (portable definitions; only loaded DLLs are Windows-only) -------------------------


class IO_COUNTERS(ctypes.Structure):
    _fields_ = [(name, ctypes.c_ulonglong) for name in ("Read", "Write", "Other")] + [
        (f"{name}TransferCount", ctypes.c_ulonglong) for name in ("Read", "Write", "Other")
    ]


class JOBOBJECT_BASIC_LIMIT_INFORMATION(ctypes.Structure):
    _fields_ = [
        ("PerProcessUserTimeLimit", ctypes.c_int64),
        ("PerJobUserTimeLimit", ctypes.c_int64),
        ("LimitFlags", wintypes.DWORD),
        ("MinimumWorkingSetSize", ctypes.c_size_t),
        ("MaximumWorkingSetSize", ctypes.c_size_t),
        ("ActiveProcessLimit", wintypes.DWORD),
        ("Affinity", ctypes.c_size_t),
        ("PriorityClass", wintypes.DWORD),
        ("SchedulingClass", wintypes.DWORD),
    ]


class JOBOBJECT_EXTENDED_LIMIT_INFORMATION(ctypes.Structure):
    _fields_ = [
        ("BasicLimitInformation", JOBOBJECT_BASIC_LIMIT_INFORMATION),
        ("IoInfo", IO_COUNTERS),
        ("ProcessMemoryLimit", ctypes.c_size_t),
        ("JobMemoryLimit", ctypes.c_size_t),
        ("PeakProcessMemoryUsed", ctypes.c_size_t),
        ("PeakJobMemoryUsed", ctypes.c_size_t),
    ]


class JOBOBJECT_BASIC_ACCOUNTING_INFORMATION(ctypes.Structure):
    _fields_ = [
        ("TotalUserTime", ctypes.c_int64),
        ("TotalKernelTime", ctypes.c_int64),
        ("ThisPeriodTotalUserTime", ctypes.c_int64),
        ("ThisPeriodTotalKernelTime", ctypes.c_int64),
        ("TotalPageFaultCount", wintypes.DWORD),
        ("TotalProcesses", wintypes.DWORD),
        ("ActiveProcesses", wintypes.DWORD),
        ("TotalTerminatedProcesses", wintypes.DWORD),
    ]


class JOBOBJECT_BASIC_UI_RESTRICTIONS(ctypes.Structure):
    _fields_ = [("UIRestrictionsClass", wintypes.DWORD)]


class JOBOBJECT_CPU_RATE_CONTROL_INFORMATION(ctypes.Structure):
    _fields_ = [("ControlFlags", wintypes.DWORD), ("CpuRate", wintypes.DWORD)]


MAX_PIDS = 1024


class JOBOBJECT_BASIC_PROCESS_ID_LIST(ctypes.Structure):
    _fields_ = [
        ("NumberOfAssignedProcesses", wintypes.DWORD),
        ("NumberOfProcessIdsInList", wintypes.DWORD),
        ("ProcessIdList", ctypes.c_size_t * MAX_PIDS),
    ]


# -- the Win32 calls, bound on first use (Windows only) -------------------------------------------


class _Kernel32:
    """The kernel32 functions the backend calls, with their signatures (``use_last_error``)."""

    def __init__(self) -> None:
        assert sys.platform == "win32"
        k = _ctypes.WinDLL("kernel32", use_last_error=True)
        H, B, D, P = wintypes.HANDLE, wintypes.BOOL, wintypes.DWORD, ctypes.c_void_p
        self.CreateJobObjectW = _fn(k.CreateJobObjectW, H, P, wintypes.LPCWSTR)
        self.SetInformationJobObject = _fn(k.SetInformationJobObject, B, H, ctypes.c_int, P, D)
        self.QueryInformationJobObject = _fn(k.QueryInformationJobObject, B, H, ctypes.c_int, P, D, P)
        self.AssignProcessToJobObject = _fn(k.AssignProcessToJobObject, B, H, H)
        self.TerminateJobObject = _fn(k.TerminateJobObject, B, H, wintypes.UINT)
        self.ResumeThread = _fn(k.ResumeThread, D, H)
        self.CloseHandle = _fn(k.CloseHandle, B, H)
        self.wine = hasattr(_ctypes.WinDLL("ntdll"), "wine_get_version")

    def check(self, ok: int, what: str) -> None:
        if not ok:
            assert sys.platform == "win32"
            err = _ctypes.get_last_error()
            raise BackendUnavailable(f"{what} failed: {_ctypes.FormatError(err)} (error {err})", backend=NAME)


def _fn(f: Any, restype: Any, *argtypes: Any) -> Any:
    f.restype = restype
    f.argtypes = argtypes
    return f


_api: _Kernel32 | None = None


def _k32() -> _Kernel32:
    global _api
    if _api is None:
        _api = _Kernel32()
    return _api


def wine_version() -> str | None:
    """Wine's version when this Windows process runs under Wine, else ``None``."""
    if sys.platform != "win32":
        return None
    ntdll = _ctypes.WinDLL("ntdll")
    if not hasattr(ntdll, "wine_get_version"):
        return None
    get = ntdll.wine_get_version
    get.restype = ctypes.c_char_p
    value = get()
    return value.decode() if isinstance(value, bytes) else "unknown"


# -- the job ------------------------------------------------------------------------------------------


class Job:
    """One job object: limits set, processes assigned, terminated and confirmed empty."""

    def __init__(self, profile: Profile, *, enforce_limits: bool) -> None:
        k = _k32()
        self.k = k
        handle = k.CreateJobObjectW(None, None)
        k.check(handle, "CreateJobObjectW")
        self.handle: int = handle
        self.closed = False
        try:
            self._set_limits(profile, enforce_limits)
        except BaseException:
            self.close()
            raise

    def _set(self, cls: int, info: ctypes.Structure, what: str) -> None:
        self.k.check(self.k.SetInformationJobObject(self.handle, cls, ctypes.byref(info), ctypes.sizeof(info)), what)

    def _set_limits(self, profile: Profile, enforce: bool) -> None:
        ext = JOBOBJECT_EXTENDED_LIMIT_INFORMATION()
        basic = ext.BasicLimitInformation
        flags = JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE | JOB_OBJECT_LIMIT_DIE_ON_UNHANDLED_EXCEPTION
        limits = profile.limits
        if enforce and limits.pids is not None:
            flags |= JOB_OBJECT_LIMIT_ACTIVE_PROCESS
            basic.ActiveProcessLimit = limits.pids
        if enforce and limits.memory is not None:
            flags |= JOB_OBJECT_LIMIT_JOB_MEMORY
            ext.JobMemoryLimit = limits.memory
        if enforce and limits.cpu_time_s is not None:
            flags |= JOB_OBJECT_LIMIT_JOB_TIME
            basic.PerJobUserTimeLimit = limits.cpu_time_s * 10_000_000  # 100 ns units
        basic.LimitFlags = flags  # no BREAKAWAY_OK: CREATE_BREAKAWAY_FROM_JOB is refused
        self._set(JobObjectExtendedLimitInformation, ext, "SetInformationJobObject (limits)")
        ui = JOBOBJECT_BASIC_UI_RESTRICTIONS(UI_RESTRICTIONS)
        self._set(JobObjectBasicUIRestrictions, ui, "SetInformationJobObject (UI restrictions)")
        if enforce and limits.cpus is not None:
            rate = min(10000, max(1, round(limits.cpus * 10000 / (os.cpu_count() or 1))))
            cpu = JOBOBJECT_CPU_RATE_CONTROL_INFORMATION(
                JOB_OBJECT_CPU_RATE_CONTROL_ENABLE | JOB_OBJECT_CPU_RATE_CONTROL_HARD_CAP, rate
            )
            self._set(JobObjectCpuRateControlInformation, cpu, "SetInformationJobObject (CPU rate)")

    def assign(self, process: int) -> None:
        self.k.check(self.k.AssignProcessToJobObject(self.handle, process), "AssignProcessToJobObject")

    def accounting(self) -> JOBOBJECT_BASIC_ACCOUNTING_INFORMATION:
        info = JOBOBJECT_BASIC_ACCOUNTING_INFORMATION()
        ok = self.k.QueryInformationJobObject(
            self.handle, JobObjectBasicAccountingInformation, ctypes.byref(info), ctypes.sizeof(info), None
        )
        self.k.check(ok, "QueryInformationJobObject (accounting)")
        return info

    def active(self) -> int:
        return 0 if self.closed else int(self.accounting().ActiveProcesses)

    def pids(self) -> list[int]:
        if self.closed:
            return []
        info = JOBOBJECT_BASIC_PROCESS_ID_LIST()
        ok = self.k.QueryInformationJobObject(
            self.handle, JobObjectBasicProcessIdList, ctypes.byref(info), ctypes.sizeof(info), None
        )
        self.k.check(ok, "QueryInformationJobObject (process list)")
        return [int(info.ProcessIdList[i]) for i in range(info.NumberOfProcessIdsInList)]

    def peak_memory(self) -> int | None:
        if self.closed:
            return None
        ext = JOBOBJECT_EXTENDED_LIMIT_INFORMATION()
        ok = self.k.QueryInformationJobObject(
            self.handle, JobObjectExtendedLimitInformation, ctypes.byref(ext), ctypes.sizeof(ext), None
        )
        return int(ext.PeakJobMemoryUsed) if ok and ext.PeakJobMemoryUsed else None

    def terminate(self) -> None:
        if not self.closed and self.active():
            self.k.check(self.k.TerminateJobObject(self.handle, KILLED_EXIT), "TerminateJobObject")

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.k.CloseHandle(self.handle)  # KILL_ON_JOB_CLOSE: anything left dies with the handle


# -- pipes -------------------------------------------------------------------------------------------


class PipeStream(ByteReceiveStream):
    """One pipe's read end, read by a blocking ``ReadFile`` in a worker thread.

    A read abandoned by a cancellation keeps its chunk for the next ``receive``, and no two reads
    ever run at once (a lock); the handle is closed by whoever holds it last after EOF or ``aclose``.
    """

    def __init__(self, handle: int) -> None:
        self._handle = handle
        self._lock = threading.Lock()
        self._buffer: list[bytes] = []
        self._eof = False
        self._closing = False
        self._limiter: anyio.CapacityLimiter | None = None  # made on the loop: we are built in a worker thread

    def _read(self) -> None:
        assert sys.platform == "win32"
        with self._lock:
            if self._buffer or self._eof or self._closing:
                return
            try:
                data, _ = _winapi.ReadFile(self._handle, READ_SIZE)
            except OSError as exc:
                if getattr(exc, "winerror", None) not in (ERROR_BROKEN_PIPE, ERROR_NO_DATA):
                    raise
                data = b""
            if data:
                self._buffer.append(data)
            else:
                self._eof = True
                self._close_handle()

    def _close_handle(self) -> None:
        if self._handle:
            assert sys.platform == "win32"
            _winapi.CloseHandle(self._handle)
            self._handle = 0

    async def receive(self, max_bytes: int = READ_SIZE) -> bytes:  # noqa: ARG002 - a chunk as it comes
        while True:
            if self._buffer:
                return self._buffer.pop(0)
            if self._eof or self._closing:
                raise anyio.EndOfStream
            if self._limiter is None:  # our own: a blocked read must not hold one of anyio's default 40 threads
                self._limiter = anyio.CapacityLimiter(1)
            await anyio.to_thread.run_sync(self._read, abandon_on_cancel=True, limiter=self._limiter)

    async def aclose(self) -> None:
        self.close()

    def close(self) -> None:
        self._closing = True
        if self._lock.acquire(blocking=False):  # a read still blocked closes it on its EOF
            try:
                self._close_handle()
            finally:
                self._lock.release()


def _pipe() -> tuple[int, int]:
    """An anonymous pipe: (ours, the child's inheritable end); which end is which is the caller's."""
    assert sys.platform == "win32"
    read, write = _winapi.CreatePipe(None, 0)
    return read, write


def _inheritable(handle: int) -> int:
    assert sys.platform == "win32"
    me = _winapi.GetCurrentProcess()
    dup = _winapi.DuplicateHandle(me, handle, me, 0, True, DUPLICATE_SAME_ACCESS)
    _winapi.CloseHandle(handle)
    return int(dup)


def _close(*handles: int) -> None:
    assert sys.platform == "win32"
    for h in handles:
        if h:
            with contextlib.suppress(OSError):
                _winapi.CloseHandle(h)


# -- process -----------------------------------------------------------------------------------------


class WinJobProcess(Process):
    def __init__(
        self, job: Job, hprocess: int, pid: int, stdout: PipeStream, stderr: PipeStream, stdin: int | None
    ) -> None:
        self.job = job
        self.hprocess = hprocess
        self.pid = pid
        self.stdout = stdout
        self.stderr = stderr
        self._stdin = stdin
        self.stdin_data: Stdin = None
        self.returncode: int | None = None
        self.killed = False
        self.on_release: Any = None

    def _wait_blocking(self) -> int:
        assert sys.platform == "win32"
        _winapi.WaitForSingleObject(self.hprocess, INFINITE)
        return int(_winapi.GetExitCodeProcess(self.hprocess))

    async def wait(self) -> int:
        if self.returncode is None:
            code = await anyio.to_thread.run_sync(self._wait_blocking, abandon_on_cancel=True)
            self.returncode = -9 if self.killed and code == KILLED_EXIT else code
        return self.returncode

    async def feed_stdin(self) -> None:
        handle, self._stdin = self._stdin, None
        if handle is None:
            return
        data = self.stdin_data
        try:
            if isinstance(data, bytes | bytearray):
                await off_loop(_write_all, handle, bytes(data))
            elif data is not None:
                async for chunk in data:
                    await off_loop(_write_all, handle, chunk)
        except OSError:
            pass  # the command closed its stdin (exited): what it did not read is dropped, as a pipe does
        finally:
            _close(handle)

    async def kill_tree(self, grace: float) -> None:  # noqa: ARG002 - Windows has no TERM to give a grace to
        with anyio.CancelScope(shield=True):
            if self.job.closed:
                return
            if self.job.active():
                self.killed = True
                await off_loop(self.job.terminate)
            deadline = time.monotonic() + KILL_WAIT_S
            while self.job.active():
                if time.monotonic() > deadline:
                    raise BackendUnavailable(
                        f"the job still reports {self.job.active()} active process(es) {KILL_WAIT_S:g} s after "
                        "TerminateJobObject",
                        backend=NAME,
                    )
                await anyio.sleep(0.01)
            with anyio.move_on_after(KILL_WAIT_S):
                await self.wait()

    def running_pids(self) -> list[int]:
        return self.job.pids()

    def peak_memory(self) -> int | None:
        return self.job.peak_memory()

    def release(self) -> None:
        # KILL_ON_JOB_CLOSE: closing the job handle kills anything a broken promise left in it.
        self.job.close()
        self.stdout.close()  # type: ignore[attr-defined]
        self.stderr.close()  # type: ignore[attr-defined]
        if self._stdin is not None:
            _close(self._stdin)
            self._stdin = None
        if self.hprocess:
            _close(self.hprocess)
            self.hprocess = 0
        if self.on_release is not None:
            self.on_release(self)


def _write_all(handle: int, data: bytes) -> None:
    assert sys.platform == "win32"
    view = memoryview(data)
    while view:
        written, _ = _winapi.WriteFile(handle, bytes(view[:READ_SIZE]))
        view = view[written:]


# -- environment -------------------------------------------------------------------------------------

# System locations programs need to start at all (SystemRoot above all: Winsock fails without it).
SYSTEM_VARS = (
    "SystemRoot",
    "SystemDrive",
    "windir",
    "ComSpec",
    "PATHEXT",
    "OS",
    "PROCESSOR_ARCHITECTURE",
    "PROCESSOR_IDENTIFIER",
    "NUMBER_OF_PROCESSORS",
    "ProgramFiles",
    "ProgramFiles(x86)",
    "ProgramW6432",
    "CommonProgramFiles",
    "ProgramData",
)
PASSTHROUGH = ("LANG", "LANGUAGE", "LC_ALL", "TZ", "NO_COLOR")


def windows_env(profile: Profile, home: str, workspace: Path, extra: Mapping[str, str] | None) -> dict[str, str]:
    """The command's environment: system locations, a private home and temp, the allowlisted
    names, the profile's ``env.set``, then the call's own; never the caller's secrets."""
    src = {k.upper(): v for k, v in os.environ.items()}
    env: dict[str, str] = {}
    for name in SYSTEM_VARS:
        if name.upper() in src:
            env[name] = src[name.upper()]
    root = env.get("SystemRoot", "C:\\windows")
    found = [str(workspace / rel) for rel in (".venv\\Scripts", "node_modules\\.bin") if (workspace / rel).is_dir()]
    system = [f"{root}\\system32", root, f"{root}\\System32\\Wbem", f"{root}\\System32\\WindowsPowerShell\\v1.0"]
    tmp = str(Path(home).parent / "tmp")
    env.update(
        {
            "PATH": ";".join([*found, *system]),
            "HOME": home,
            "USERPROFILE": home,
            "APPDATA": f"{home}\\AppData\\Roaming",
            "LOCALAPPDATA": f"{home}\\AppData\\Local",
            "TEMP": tmp,
            "TMP": tmp,
            "USERNAME": "sandbox",
            "SANDBOX": "1",
        }
    )
    for name in (*PASSTHROUGH, *profile.env.allow):
        if name.upper() in src:
            env[name] = src[name.upper()]
    env.update(profile.env.set)
    env.update(extra or {})
    return env


class Verbatim(str):
    """An argument put on the command line as it is, unquoted: what follows ``cmd /s /c``."""

    __slots__ = ()


def command_line(argv: Sequence[str]) -> str:
    """``argv`` quoted as the C runtime parses it (``subprocess.list2cmdline``), but a last
    :class:`Verbatim` argument appended as it is (cmd reads its command after ``/c`` raw)."""
    if argv and isinstance(argv[-1], Verbatim):
        return subprocess.list2cmdline(argv[:-1]) + " " + argv[-1]
    return subprocess.list2cmdline(argv)


SHELLS = ("cmd", "powershell", "bash")


def shell_argv(command: str, shell: str = "cmd", comspec: str | None = None) -> list[str]:
    """The Bash tool's ``command`` for a Windows shell (the profile's ``winjob.shell``): ``cmd`` (the
    default; always there, and under Wine the one there is), ``powershell`` (Windows PowerShell, no
    profile, non-interactive) or ``bash`` (Git for Windows' bash, without its rc files: refused with
    SHELL_NOT_FOUND where it is not installed)."""
    if shell == "powershell":
        return ["powershell.exe", "-NoLogo", "-NoProfile", "-NonInteractive", "-Command", command]
    if shell == "bash":
        bash = git_bash()
        if bash is None:
            raise ShellNotFound(
                "winjob.shell = 'bash' needs Git for Windows' bash (Git\\bin\\bash.exe), which is not installed "
                "here; install Git for Windows or choose shell = 'cmd' or 'powershell'",
                backend=NAME,
            )
        return [bash, "--noprofile", "--norc", "-c", command]
    if shell != "cmd":
        raise InvalidArgument(f"unknown Windows shell {shell!r}; choose one of {', '.join(SHELLS)}", shell=shell)
    # /d: no AutoRun from the registry; /s with the outer quotes: the command runs exactly as given.
    return [comspec or os.environ.get("COMSPEC", "cmd.exe"), "/d", "/s", "/c", Verbatim(f'"{command}"')]


def git_bash(environ: Mapping[str, str] | None = None) -> str | None:
    """Git for Windows' ``bash.exe``: beside the ``git`` on PATH, else where its installer puts it.

    Never ``%SystemRoot%\\System32\\bash.exe``: that is WSL's launcher, whose commands run in a
    Linux VM, outside the job object and every guarantee of this backend.
    """
    env = {k.upper(): v for k, v in (os.environ if environ is None else environ).items()}
    roots = []
    if git := shutil.which("git", path=env.get("PATH", "")):
        roots.append(os.path.dirname(os.path.dirname(git)))  # <root>\cmd\git.exe or <root>\bin\git.exe
    for var, sub in (("PROGRAMFILES", "Git"), ("PROGRAMW6432", "Git"), ("LOCALAPPDATA", "Programs\\Git")):
        if env.get(var):
            roots.append(os.path.join(env[var], sub))
    system = os.path.normcase(env.get("SYSTEMROOT", "C:\\Windows"))
    for root in roots:
        bash = os.path.join(root, "bin", "bash.exe")
        if os.path.isfile(bash) and not os.path.normcase(bash).startswith(system):
            return bash
    return None


def resolve(argv0: str, path: str, cwd: str) -> str | None:
    """Where ``argv0`` is, searched in the jail's PATH (not ours) with PATHEXT, as cmd would."""
    if os.path.dirname(argv0):
        candidate = argv0 if os.path.isabs(argv0) else os.path.join(cwd, argv0)
        return shutil.which(candidate) or (candidate if os.path.isfile(candidate) else None)
    return shutil.which(argv0, path=path)


# -- the file tools' runner and the copy's view ---------------------------------------------------


class View:
    """Where the jail's commands see the workspace: ``root`` (the workspace, or its private copy)."""

    def __init__(self, workspace: Path, root: Path) -> None:
        self.workspace = workspace
        self.root = root
        self.moved = root != workspace

    @staticmethod
    def _swap(path: str, old: Path, new: Path) -> str | None:
        """``path`` under ``old`` (compared as Windows does, without case), moved under ``new``."""
        base = str(old).rstrip("\\/")
        if ntpath.normcase(path[: len(base)]) != ntpath.normcase(base):
            return None
        rest = path[len(base) :]
        if rest and rest[0] not in "\\/":
            return None
        return str(new).rstrip("\\/") + rest

    def into(self, path: str) -> str:
        """A host path as the jail's commands reach it (a path elsewhere is left as it is)."""
        return self._swap(path, self.workspace, self.root) or path if self.moved else path

    def out(self, path: str) -> str:
        return self._swap(path, self.root, self.workspace) or path if self.moved else path

    def request(self, data: bytes) -> tuple[bytes, str | None]:
        """A runner request with its paths moved into the view, and its operation."""
        try:
            request = json.loads(data)
        except ValueError:
            return data, None
        if not isinstance(request, dict):
            return data, None
        if self.moved:
            for key in ("path", "given"):
                if isinstance(request.get(key), str):
                    request[key] = self.into(request[key])
        op = request.get("op")
        return json.dumps(request).encode(), op if isinstance(op, str) else None

    def reply(self, data: bytes, op: str | None) -> bytes:
        """A runner reply with every path in the view named by its workspace path again. A Read's
        ``content`` is the file's and left alone; another's is a message, whose mentions of the
        copy's root are replaced."""
        try:
            reply = json.loads(data)
        except ValueError:
            return data
        if not isinstance(reply, dict):
            return data
        mapped = {k: self._out_all(v) for k, v in reply.items() if k != "content"}
        content = reply.get("content")
        if isinstance(content, str) and op != "read":
            content = content.replace(str(self.root), str(self.workspace))
        return json.dumps({**mapped, "content": content}).encode()

    def _out_all(self, value: Any) -> Any:
        if isinstance(value, str):
            return self.out(value)
        if isinstance(value, list | tuple):
            return [self._out_all(v) for v in value]
        if isinstance(value, dict):
            return {k: self._out_all(v) for k, v in value.items()}
        return value


class ViewReply(ByteReceiveStream):
    """A runner's stdout read whole (one JSON reply), then handed on with :meth:`View.reply`'s paths."""

    def __init__(self, inner: ByteReceiveStream, view: View, op: str | None) -> None:
        self.inner = inner
        self.view = view
        self.op = op
        self._out: bytes | None = None

    async def receive(self, max_bytes: int = READ_SIZE) -> bytes:
        if self._out is None:
            chunks = []
            with contextlib.suppress(anyio.EndOfStream):
                while True:
                    chunks.append(await self.inner.receive())
            self._out = self.view.reply(b"".join(chunks), self.op)
        if not self._out:
            raise anyio.EndOfStream
        chunk, self._out = self._out[:max_bytes], self._out[max_bytes:]
        return chunk

    async def aclose(self) -> None:
        await self.inner.aclose()

    def close(self) -> None:
        self.inner.close()  # type: ignore[attr-defined]


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
        self.shell = profile.winjob.shell  # what the Bash tool runs a command with (:data:`SHELLS`)
        self.confinement: Confinement | None = None  # the token and grants (real Windows)
        self._live: set[WinJobProcess] = set()

    @property
    def host_paths_shown(self) -> tuple[str, ...]:
        return (self.workspace.anchor,)  # no filesystem view of its own: the host's drives as they are

    def shell_argv(self, command: str) -> list[str]:
        """No bash on Windows: the profile's shell (cmd, PowerShell or Git's bash) runs the command."""
        return shell_argv(command, self.shell)

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
            out_r, out_w = _pipe()
            ours.append(out_r)
            theirs.append(out_w := _inheritable(out_w))
            err_r, err_w = _pipe()
            ours.append(err_r)
            theirs.append(err_w := _inheritable(err_w))
            in_r, in_w = _pipe()
            ours.append(in_w)
            theirs.append(in_r := _inheritable(in_r))
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
                _close(hp, ht)
                raise
            if _k32().ResumeThread(ht) == INFINITE:  # (DWORD)-1
                _winapi.TerminateProcess(hp, KILLED_EXIT)
                _close(hp, ht)
                raise BackendUnavailable("ResumeThread failed", backend=NAME)
            _close(ht)
        except BaseException:
            _close(*ours)
            job.close()
            raise
        finally:
            _close(*theirs)
        if not with_stdin:
            _close(in_w)
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
            api = _k32()
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
            _close(self.token)
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
    _close(token)
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
