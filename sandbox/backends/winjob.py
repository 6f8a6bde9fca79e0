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

What this backend does not do yet (and :meth:`WinJobBackend.probe` says so, never claims): a
restricted token, low integrity or an AppContainer, ACLs confining writes to the workspace, and
network denial; mounts other than ``rw``. Under Wine (detected by ``ntdll.wine_get_version``) the
job limits are accepted but not enforced, so they are reported unavailable there.

On any other platform the module still imports (for the loader and ``sandbox check``) and the
backend reports itself unavailable with the reason.
"""

from __future__ import annotations

import contextlib
import ctypes
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

from sandbox.backends.base import Backend, Jail, Process, off_loop
from sandbox.errors import BackendUnavailable, GuaranteeUnavailable, InvalidArgument
from sandbox.guarantees import Enforcement, Report

if sys.platform == "win32":
    import _winapi
else:  # the module imports everywhere (the loader, ``sandbox check``); nothing here calls it
    _winapi: Any = None
_subprocess: Any = subprocess  # STARTUPINFO exists only on Windows
_ctypes: Any = ctypes  # so do WinDLL, get_last_error and FormatError

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from sandbox.backends.base import Stdin
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


SHELLS = ("cmd", "powershell")


def shell_argv(command: str, shell: str = "cmd", comspec: str | None = None) -> list[str]:
    """The Bash tool's ``command`` for a Windows shell: ``cmd`` (the default; always there, and under
    Wine the one there is) or ``powershell`` (Windows PowerShell, no profile, non-interactive)."""
    if shell == "powershell":
        return ["powershell.exe", "-NoLogo", "-NoProfile", "-NonInteractive", "-Command", command]
    if shell != "cmd":
        raise InvalidArgument(f"unknown Windows shell {shell!r}; choose one of {', '.join(SHELLS)}", shell=shell)
    # /d: no AutoRun from the registry; /s with the outer quotes: the command runs exactly as given.
    return [comspec or os.environ.get("COMSPEC", "cmd.exe"), "/d", "/s", "/c", Verbatim(f'"{command}"')]


def resolve(argv0: str, path: str, cwd: str) -> str | None:
    """Where ``argv0`` is, searched in the jail's PATH (not ours) with PATHEXT, as cmd would."""
    if os.path.dirname(argv0):
        candidate = argv0 if os.path.isabs(argv0) else os.path.join(cwd, argv0)
        return shutil.which(candidate) or (candidate if os.path.isfile(candidate) else None)
    return shutil.which(argv0, path=path)


# -- jail --------------------------------------------------------------------------------------------


class WinJobJail(Jail):
    backend = NAME
    shell = "cmd"  # what the Bash tool runs a command with (:data:`SHELLS`); a profile key for it is future work

    def __init__(self, workspace: Path, profile: Profile, private: Path, *, enforce_limits: bool) -> None:
        self.workspace = workspace
        self.profile = profile
        self.private = private  # the jail's home and temp directory, removed on close
        self.enforce_limits = enforce_limits
        self._live: set[WinJobProcess] = set()

    @property
    def host_paths_shown(self) -> tuple[str, ...]:
        return (self.workspace.anchor,)  # no filesystem view of its own: the host's drives as they are

    async def _start(
        self, argv: Sequence[str], *, env: Mapping[str, str] | None, cwd: str | None, stdin: Stdin
    ) -> WinJobProcess:
        proc = await off_loop(self._launch, list(argv), env, cwd, stdin is not None)
        proc.stdin_data = stdin
        proc.on_release = self._live.discard
        self._live.add(proc)
        return proc

    def _launch(
        self, argv: list[str], extra: Mapping[str, str] | None, cwd: str | None, with_stdin: bool
    ) -> WinJobProcess:
        assert sys.platform == "win32"
        env = windows_env(self.profile, str(self.private / "home"), self.workspace, extra)
        where = cwd or str(self.workspace)
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
            await off_loop(shutil.rmtree, self.private, True)


# -- backend -----------------------------------------------------------------------------------------

NO_TOKEN = "not implemented: commands run with the caller's own token (no restricted token, low integrity or ACLs yet)"
LINUX_ONLY = "a Linux facility; no Windows equivalent in this backend"


class WinJobBackend(Backend):
    name = NAME

    async def open_jail(self, workspace: Path, profile: Profile, *, scratch: Path | None = None) -> Jail:
        """:meth:`Backend.open_jail`'s template without the apply journal's recovery: the journal
        is POSIX code (flock, ``O_DIRECTORY``), and this backend has no copy mount to apply from."""
        from sandbox.backends.base import _check_scratch
        from sandbox.calls import check_workspace

        self.check(profile)
        _check_scratch(scratch)
        return await self._open(check_workspace(workspace), profile, scratch=scratch, egress=None)

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
        return _report(wine)

    async def _open(
        self,
        workspace: Path,
        profile: Profile,
        *,
        scratch: Path | None,  # noqa: ARG002 - shown where it is, as every host path
        egress: Egress | None,  # noqa: ARG002 - check refuses allowlist: net-allowlist is not granted
    ) -> WinJobJail:
        if profile.mount.strategy != "rw":
            raise GuaranteeUnavailable(
                f"the winjob backend cannot provide mount {profile.mount.strategy!r} yet, only rw: a private copy "
                "or a read-only workspace needs ACLs on the workspace, which it does not set yet",
                backend=NAME,
            )
        if profile.network.mode != "host":
            raise GuaranteeUnavailable(
                f"the winjob backend cannot provide network.mode = {profile.network.mode!r}: it does not cut the "
                "network yet (that needs an AppContainer); use a profile with network.mode = 'host'",
                backend=NAME,
            )
        private = Path(await off_loop(tempfile.mkdtemp, "", "sandbox-winjob-"))
        for sub in ("home", "tmp", "home\\AppData\\Roaming", "home\\AppData\\Local"):
            (private / sub).mkdir(parents=True, exist_ok=True)
        return WinJobJail(workspace, profile, private, enforce_limits=wine_version() is None)


def _report(wine: str | None) -> Report:
    report = Report(NAME, True)
    report.details["wine"] = wine or ""
    for name in ("fs-readonly-root", "fs-write-confined", "fs-hidden-home", "non-root"):
        report.grant(name, False, NO_TOKEN)
    for name in ("net-none", "net-confined", "net-allowlist", "net-transparent"):
        report.grant(name, False, "not implemented: the network is the caller's (an AppContainer would cut it)")
    for name in ("no-new-privs", "no-caps", "seccomp", "overlay"):
        report.grant(name, False, LINUX_ONLY)
    report.grant("new-session", False, "a POSIX session; the command gets a hidden console of its own instead")
    report.grant("tmp-size-limit", False, "no Windows equivalent in this backend")
    report.grant("fsize-limit", False, "no Windows equivalent in this backend")
    report.grant("env-scrubbed", True)
    report.grant("tree-kill", True)  # a job object per call, KILL_ON_JOB_CLOSE, no breakaway
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
