"""The job object itself, and the Win32 vocabulary the winjob backend speaks through ``ctypes``.

Apart from the jail (:mod:`sandbox.backends.winjob`) because it is the one piece that talks to
kernel32 about jobs: the constants and structures as the Windows headers declare them (portable
definitions: only loading the DLLs is Windows-only, so this imports on any host), the kernel32
functions bound on first use, Wine's detection, and :class:`Job`, which sets a call's limits,
takes in its processes, terminates them and reports their accounting.
"""

from __future__ import annotations

import ctypes
import os
import sys
from ctypes import wintypes
from typing import TYPE_CHECKING, Any

from sandbox.errors import BackendUnavailable

if TYPE_CHECKING:
    from sandbox.profile import Profile

_ctypes: Any = ctypes  # WinDLL, get_last_error and FormatError exist only on Windows

NAME = "winjob"
KILLED_EXIT = 0x5A4E0009  # the exit code TerminateJobObject gives; wait() reports it as -9

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


def kernel32() -> _Kernel32:
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
        k = kernel32()
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
