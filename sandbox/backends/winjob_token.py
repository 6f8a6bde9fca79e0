"""Confinement on real Windows: a restricted token at low integrity, and the jail's ACL grants.

Each jail gets a SID of its own (``S-1-9-…``, random: the resource-manager authority, which no
account uses) and a primary token derived from ours by ``CreateRestrictedToken``:

- **every privilege removed** but SeChangeNotify (``DISABLE_MAX_PRIVILEGE``), and the
  Administrators group made deny-only: an elevated caller's jail holds no admin right;
- **restricting SIDs**: the jail SID, the logon SID (a process needs its window station), and
  Everyone, Users, Authenticated Users and RESTRICTED for reading system files. Access is granted
  only when both the normal and the restricting SIDs allow it, so a file whose ACL names only the
  user (most of a user's profile) is closed to the jail, and nothing is the jail's but what names
  its SID;
- **low integrity** (``TokenIntegrityLevel`` = S-1-16-4096): the system's no-write-up rule
  refuses every write to an object labelled higher, and an object without a label counts as
  medium: all of the disk but what is granted below.

The grants: the workspace (or, for ``copy``, its private copy) and the jail's private home and
temp directory get an inheritable ACE for the jail SID (modify; read only for ``ro``) and, where
the jail may write, a low mandatory label; both are taken back when the jail closes (a killed
executor leaves them: an ACE for a SID nobody holds, and a low label).

Network: a restricted token does not cut it. Only an AppContainer without network capabilities
would, and this backend does not create one: ``net-none`` is refused, never claimed.

Under Wine every call here succeeds and nothing is enforced (Wine checks no token against an
ACL): the backend does not use this module there, and ``sandbox check`` says why. The tests that
attack it are marked Windows-only and run in the windows-latest workflow.
"""

from __future__ import annotations

import ctypes
import secrets
import sys
from ctypes import wintypes
from typing import TYPE_CHECKING, Any

from sandbox.errors import BackendUnavailable

if TYPE_CHECKING:
    from collections.abc import Sequence
    from pathlib import Path

_ctypes: Any = ctypes  # WinDLL and get_last_error exist only on Windows

NAME = "winjob"
TOKEN_ALL_NEEDED = (
    0x0001 | 0x0002 | 0x0008 | 0x0080 | 0x0020
)  # assign primary, duplicate, query, adjust default, adj privs
DISABLE_MAX_PRIVILEGE = 0x1
TokenGroups = 2
TokenDefaultDacl = 6
TokenIntegrityLevel = 25
SE_GROUP_INTEGRITY = 0x20
SE_GROUP_LOGON_ID = 0xC0000000
SE_FILE_OBJECT = 1
DACL_SECURITY_INFORMATION = 0x4
LABEL_SECURITY_INFORMATION = 0x10
GRANT_ACCESS = 1
REVOKE_ACCESS = 4
SUB_CONTAINERS_AND_OBJECTS_INHERIT = 0x3
TRUSTEE_IS_SID = 0
FILE_ALL_ACCESS = 0x1F01FF
FILE_GENERIC_READ_EXECUTE = 0x1200A9
SDDL_REVISION_1 = 1
LOW_LABEL_SDDL = "S:(ML;OICI;NW;;;LW)"  # low, inherited by files and directories, no write up
READ_SIDS = ("S-1-1-0", "S-1-5-32-545", "S-1-5-11", "S-1-5-12")  # Everyone, Users, Authenticated Users, RESTRICTED
ADMINISTRATORS = "S-1-5-32-544"
LOW_INTEGRITY = "S-1-16-4096"


class SID_AND_ATTRIBUTES(ctypes.Structure):
    _fields_ = [("Sid", ctypes.c_void_p), ("Attributes", wintypes.DWORD)]


class TOKEN_MANDATORY_LABEL(ctypes.Structure):
    _fields_ = [("Label", SID_AND_ATTRIBUTES)]


class TOKEN_DEFAULT_DACL(ctypes.Structure):
    _fields_ = [("DefaultDacl", ctypes.c_void_p)]


class TRUSTEE_W(ctypes.Structure):
    _fields_ = [
        ("pMultipleTrustee", ctypes.c_void_p),
        ("MultipleTrusteeOperation", ctypes.c_int),
        ("TrusteeForm", ctypes.c_int),
        ("TrusteeType", ctypes.c_int),
        ("ptstrName", ctypes.c_void_p),
    ]


class EXPLICIT_ACCESS_W(ctypes.Structure):
    _fields_ = [
        ("grfAccessPermissions", wintypes.DWORD),
        ("grfAccessMode", ctypes.c_int),
        ("grfInheritance", wintypes.DWORD),
        ("Trustee", TRUSTEE_W),
    ]


class _Advapi:
    """The advapi32/kernel32 functions this module calls, with their signatures."""

    def __init__(self) -> None:
        assert sys.platform == "win32"
        a = _ctypes.WinDLL("advapi32", use_last_error=True)
        k = _ctypes.WinDLL("kernel32", use_last_error=True)
        B, D, H, P, W = wintypes.BOOL, wintypes.DWORD, wintypes.HANDLE, ctypes.c_void_p, wintypes.LPCWSTR
        PP, PH = ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(wintypes.HANDLE)
        self.OpenProcessToken = _fn(a.OpenProcessToken, B, H, D, PH)
        self.GetCurrentProcess = _fn(k.GetCurrentProcess, H)
        self.CreateRestrictedToken = _fn(a.CreateRestrictedToken, B, H, D, D, P, D, P, D, P, PH)
        self.SetTokenInformation = _fn(a.SetTokenInformation, B, H, ctypes.c_int, P, D)
        self.GetTokenInformation = _fn(a.GetTokenInformation, B, H, ctypes.c_int, P, D, ctypes.POINTER(D))
        self.ConvertStringSidToSidW = _fn(a.ConvertStringSidToSidW, B, W, PP)
        self.ConvertSidToStringSidW = _fn(a.ConvertSidToStringSidW, B, P, ctypes.POINTER(wintypes.LPWSTR))
        self.ConvertStringSecurityDescriptorToSecurityDescriptorW = _fn(
            a.ConvertStringSecurityDescriptorToSecurityDescriptorW, B, W, D, PP, ctypes.POINTER(D)
        )
        self.GetSecurityDescriptorSacl = _fn(
            a.GetSecurityDescriptorSacl, B, P, ctypes.POINTER(B), PP, ctypes.POINTER(B)
        )
        self.GetSecurityDescriptorDacl = _fn(
            a.GetSecurityDescriptorDacl, B, P, ctypes.POINTER(B), PP, ctypes.POINTER(B)
        )
        self.GetNamedSecurityInfoW = _fn(a.GetNamedSecurityInfoW, D, W, ctypes.c_int, D, PP, PP, PP, PP, PP)
        self.SetNamedSecurityInfoW = _fn(a.SetNamedSecurityInfoW, D, W, ctypes.c_int, D, P, P, P, P)
        self.SetEntriesInAclW = _fn(a.SetEntriesInAclW, D, wintypes.ULONG, P, P, PP)
        self.LocalFree = _fn(k.LocalFree, P, P)
        self.GetLengthSid = _fn(a.GetLengthSid, D, P)
        self.CreateProcessAsUserW = _fn(a.CreateProcessAsUserW, B, H, W, wintypes.LPWSTR, P, P, B, D, P, W, P, P)
        self.InitializeProcThreadAttributeList = _fn(
            k.InitializeProcThreadAttributeList, B, P, D, D, ctypes.POINTER(ctypes.c_size_t)
        )
        self.UpdateProcThreadAttribute = _fn(
            k.UpdateProcThreadAttribute, B, P, D, ctypes.c_size_t, P, ctypes.c_size_t, P, P
        )
        self.DeleteProcThreadAttributeList = _fn(k.DeleteProcThreadAttributeList, None, P)
        self.CloseHandle = _fn(k.CloseHandle, B, H)

    def ok(self, result: int, what: str) -> None:
        if not result:
            err = _ctypes.get_last_error()
            raise BackendUnavailable(f"{what} failed: {_ctypes.FormatError(err)} (error {err})", backend=NAME)

    def status(self, code: int, what: str) -> None:
        """The *SecurityInfo calls return their error instead of setting the last one."""
        if code:
            raise BackendUnavailable(f"{what} failed: {_ctypes.FormatError(code)} (error {code})", backend=NAME)


def _fn(f: Any, restype: Any, *argtypes: Any) -> Any:
    f.restype = restype
    f.argtypes = argtypes
    return f


_api: _Advapi | None = None


def api() -> _Advapi:
    global _api
    if _api is None:
        _api = _Advapi()
    return _api


class Sid:
    """A SID from its string form, freed with ``LocalFree``."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.ptr = ctypes.c_void_p()
        api().ok(api().ConvertStringSidToSidW(text, ctypes.byref(self.ptr)), f"ConvertStringSidToSidW({text})")

    def free(self) -> None:
        if self.ptr:
            api().LocalFree(self.ptr)
            self.ptr = ctypes.c_void_p()


def new_jail_sid() -> str:
    """A SID no account holds: the resource-manager authority (9) and four random sub-authorities."""
    return "S-1-9-" + "-".join(str(secrets.randbits(32)) for _ in range(4))


def restricted_token(jail_sid: str) -> int:
    """A primary token for the jail's processes (see the module docstring); the caller closes it."""
    a = api()
    own = wintypes.HANDLE()
    a.ok(a.OpenProcessToken(a.GetCurrentProcess(), TOKEN_ALL_NEEDED, ctypes.byref(own)), "OpenProcessToken")
    sids: list[Sid] = []
    try:
        sids = [Sid(jail_sid), *(Sid(s) for s in READ_SIDS)]
        logon = logon_sid(own.value or 0)
        if logon:
            sids.append(Sid(logon))
        admins = Sid(ADMINISTRATORS)
        sids.append(admins)
        restricting = (SID_AND_ATTRIBUTES * (len(sids) - 1))(*(SID_AND_ATTRIBUTES(s.ptr, 0) for s in sids[:-1]))
        disabled = (SID_AND_ATTRIBUTES * 1)(SID_AND_ATTRIBUTES(admins.ptr, 0))
        token = wintypes.HANDLE()
        a.ok(
            a.CreateRestrictedToken(
                own, DISABLE_MAX_PRIVILEGE, 1, disabled, 0, None, len(restricting), restricting, ctypes.byref(token)
            ),
            "CreateRestrictedToken",
        )
        try:
            _set_low_integrity(token.value or 0)
            _set_default_dacl(token.value or 0, [s.text for s in sids[:-1] if s.text not in READ_SIDS])
        except BaseException:
            a.CloseHandle(token)
            raise
        return int(token.value or 0)
    finally:
        for sid in sids:
            sid.free()
        a.CloseHandle(own)


def logon_sid(token: int) -> str | None:
    """The logon SID among ``token``'s groups (its window station and desktop are granted to it)."""
    a = api()
    size = wintypes.DWORD()
    a.GetTokenInformation(token, TokenGroups, None, 0, ctypes.byref(size))
    buf = ctypes.create_string_buffer(size.value)
    a.ok(a.GetTokenInformation(token, TokenGroups, buf, size, ctypes.byref(size)), "GetTokenInformation(groups)")
    count = ctypes.cast(buf, ctypes.POINTER(wintypes.DWORD))[0]
    offset = ctypes.sizeof(ctypes.c_void_p)  # GroupCount, padded to the array's alignment
    groups = (SID_AND_ATTRIBUTES * count).from_buffer(buf, offset)
    for group in groups:
        if group.Attributes & SE_GROUP_LOGON_ID == SE_GROUP_LOGON_ID:
            text = wintypes.LPWSTR()
            a.ok(a.ConvertSidToStringSidW(group.Sid, ctypes.byref(text)), "ConvertSidToStringSidW")
            try:
                return str(text.value)
            finally:
                a.LocalFree(ctypes.cast(text, ctypes.c_void_p))
    return None


def _set_low_integrity(token: int) -> None:
    low = Sid(LOW_INTEGRITY)
    try:
        label = TOKEN_MANDATORY_LABEL(SID_AND_ATTRIBUTES(low.ptr, SE_GROUP_INTEGRITY))
        size = ctypes.sizeof(label) + api().GetLengthSid(low.ptr)  # as the documentation sizes it
        api().ok(
            api().SetTokenInformation(token, TokenIntegrityLevel, ctypes.byref(label), size),
            "SetTokenInformation(TokenIntegrityLevel)",
        )
    finally:
        low.free()


def _set_default_dacl(token: int, sids: Sequence[str]) -> None:
    """What the jail's own new objects (its processes, threads, pipes) grant: SYSTEM and the
    jail's SIDs, so that a restricted process can still open what it made itself."""
    sddl = "D:(A;;GA;;;SY)" + "".join(f"(A;;GA;;;{sid})" for sid in sids)
    sd = _security_descriptor(sddl)
    try:
        present, dacl, defaulted = wintypes.BOOL(), ctypes.c_void_p(), wintypes.BOOL()
        api().ok(
            api().GetSecurityDescriptorDacl(sd, ctypes.byref(present), ctypes.byref(dacl), ctypes.byref(defaulted)),
            "GetSecurityDescriptorDacl",
        )
        info = TOKEN_DEFAULT_DACL(dacl)
        api().ok(
            api().SetTokenInformation(token, TokenDefaultDacl, ctypes.byref(info), ctypes.sizeof(info)),
            "SetTokenInformation(TokenDefaultDacl)",
        )
    finally:
        api().LocalFree(sd)


def _security_descriptor(sddl: str) -> ctypes.c_void_p:
    sd = ctypes.c_void_p()
    api().ok(
        api().ConvertStringSecurityDescriptorToSecurityDescriptorW(sddl, SDDL_REVISION_1, ctypes.byref(sd), None),
        f"ConvertStringSecurityDescriptorToSecurityDescriptorW({sddl})",
    )
    return sd


class Grants:
    """The ACEs and labels given to the jail SID, each taken back by :meth:`revoke` (reverse order)."""

    def __init__(self, jail_sid: str, *, labels: bool = True) -> None:
        self.jail_sid = jail_sid
        self.labels = labels  # False only under Wine's test hook: Wine refuses to set a label (error 5)
        self.done: list[tuple[str, bool]] = []

    def grant(self, path: Path, *, write: bool) -> None:
        """Give the jail SID ``path`` and what is below it: modify (``write``) or read and run."""
        _set_ace(str(path), self.jail_sid, FILE_ALL_ACCESS if write else FILE_GENERIC_READ_EXECUTE, GRANT_ACCESS)
        self.done.append((str(path), False))
        if write and self.labels:
            _set_label(str(path), LOW_LABEL_SDDL)
            self.done.append((str(path), True))

    def revoke(self) -> list[str]:
        """Take every grant back; the paths where that failed (a grant may outlive a deleted path)."""
        failed = []
        while self.done:
            path, label = self.done.pop()
            try:
                if label:
                    _set_label(path, "S:")  # an empty SACL: no label, medium again
                else:
                    _set_ace(path, self.jail_sid, 0, REVOKE_ACCESS)
            except BackendUnavailable:
                failed.append(path)
        return failed


def _set_ace(path: str, sid_text: str, access: int, mode: int) -> None:
    a = api()
    sid = Sid(sid_text)
    old_sd, old_dacl, new_dacl = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p()
    try:
        a.status(
            a.GetNamedSecurityInfoW(
                path,
                SE_FILE_OBJECT,
                DACL_SECURITY_INFORMATION,
                None,
                None,
                ctypes.byref(old_dacl),
                None,
                ctypes.byref(old_sd),
            ),
            f"GetNamedSecurityInfoW({path})",
        )
        entry = EXPLICIT_ACCESS_W(
            access, mode, SUB_CONTAINERS_AND_OBJECTS_INHERIT, TRUSTEE_W(None, 0, TRUSTEE_IS_SID, 0, sid.ptr)
        )
        a.status(a.SetEntriesInAclW(1, ctypes.byref(entry), old_dacl, ctypes.byref(new_dacl)), "SetEntriesInAclW")
        a.status(
            a.SetNamedSecurityInfoW(path, SE_FILE_OBJECT, DACL_SECURITY_INFORMATION, None, None, new_dacl, None),
            f"SetNamedSecurityInfoW({path}, DACL)",
        )
    finally:
        for ptr in (new_dacl, old_sd):
            if ptr:
                a.LocalFree(ptr)
        sid.free()


# -- starting a process under the token ----------------------------------------------------------

EXTENDED_STARTUPINFO_PRESENT = 0x00080000
PROC_THREAD_ATTRIBUTE_HANDLE_LIST = 0x00020002
STARTF_USESTDHANDLES = 0x00000100


class STARTUPINFOW(ctypes.Structure):
    _fields_ = [
        ("cb", wintypes.DWORD),
        ("lpReserved", wintypes.LPWSTR),
        ("lpDesktop", wintypes.LPWSTR),
        ("lpTitle", wintypes.LPWSTR),
        ("dwX", wintypes.DWORD),
        ("dwY", wintypes.DWORD),
        ("dwXSize", wintypes.DWORD),
        ("dwYSize", wintypes.DWORD),
        ("dwXCountChars", wintypes.DWORD),
        ("dwYCountChars", wintypes.DWORD),
        ("dwFillAttribute", wintypes.DWORD),
        ("dwFlags", wintypes.DWORD),
        ("wShowWindow", wintypes.WORD),
        ("cbReserved2", wintypes.WORD),
        ("lpReserved2", ctypes.c_void_p),
        ("hStdInput", wintypes.HANDLE),
        ("hStdOutput", wintypes.HANDLE),
        ("hStdError", wintypes.HANDLE),
    ]


class STARTUPINFOEXW(ctypes.Structure):
    _fields_ = [("StartupInfo", STARTUPINFOW), ("lpAttributeList", ctypes.c_void_p)]


class PROCESS_INFORMATION(ctypes.Structure):
    _fields_ = [
        ("hProcess", wintypes.HANDLE),
        ("hThread", wintypes.HANDLE),
        ("dwProcessId", wintypes.DWORD),
        ("dwThreadId", wintypes.DWORD),
    ]


def environment_block(env: dict[str, str]) -> ctypes.Array[ctypes.c_wchar]:
    """``name=value`` strings, sorted without case as Windows keeps them, each NUL-ended, then a NUL."""
    text = "".join(f"{k}={v}\0" for k, v in sorted(env.items(), key=lambda kv: kv[0].upper())) + "\0"
    return ctypes.create_unicode_buffer(text, len(text))


def create_process(
    token: int, exe: str, cmdline: str, env: dict[str, str], cwd: str, flags: int, std: tuple[int, int, int]
) -> tuple[int, int, int]:
    """``CreateProcessAsUserW`` with ``token``, inheriting exactly the three ``std`` handles
    (a ``PROC_THREAD_ATTRIBUTE_HANDLE_LIST``); returns (process handle, thread handle, pid)."""
    a = api()
    size = ctypes.c_size_t()
    a.InitializeProcThreadAttributeList(None, 1, 0, ctypes.byref(size))
    attributes = ctypes.create_string_buffer(size.value)
    a.ok(a.InitializeProcThreadAttributeList(attributes, 1, 0, ctypes.byref(size)), "InitializeProcThreadAttributeList")
    try:
        handles = (wintypes.HANDLE * 3)(*std)
        a.ok(
            a.UpdateProcThreadAttribute(
                attributes, 0, PROC_THREAD_ATTRIBUTE_HANDLE_LIST, handles, ctypes.sizeof(handles), None, None
            ),
            "UpdateProcThreadAttribute(handle list)",
        )
        info = STARTUPINFOEXW()
        info.StartupInfo.cb = ctypes.sizeof(info)
        info.StartupInfo.dwFlags = STARTF_USESTDHANDLES
        info.StartupInfo.hStdInput, info.StartupInfo.hStdOutput, info.StartupInfo.hStdError = std
        info.lpAttributeList = ctypes.cast(attributes, ctypes.c_void_p)
        process = PROCESS_INFORMATION()
        line = ctypes.create_unicode_buffer(cmdline)  # CreateProcessW may write into it
        a.ok(
            a.CreateProcessAsUserW(
                token,
                exe,
                line,
                None,
                None,
                True,
                flags | EXTENDED_STARTUPINFO_PRESENT,
                environment_block(env),
                cwd,
                ctypes.byref(info),
                ctypes.byref(process),
            ),
            f"CreateProcessAsUserW({exe})",
        )
        return int(process.hProcess or 0), int(process.hThread or 0), int(process.dwProcessId)
    finally:
        a.DeleteProcThreadAttributeList(attributes)


def _set_label(path: str, sddl: str) -> None:
    a = api()
    sd = _security_descriptor(sddl)
    try:
        present, sacl, defaulted = wintypes.BOOL(), ctypes.c_void_p(), wintypes.BOOL()
        a.ok(
            a.GetSecurityDescriptorSacl(sd, ctypes.byref(present), ctypes.byref(sacl), ctypes.byref(defaulted)),
            "GetSecurityDescriptorSacl",
        )
        a.status(
            a.SetNamedSecurityInfoW(path, SE_FILE_OBJECT, LABEL_SECURITY_INFORMATION, None, None, None, sacl),
            f"SetNamedSecurityInfoW({path}, label)",
        )
    finally:
        a.LocalFree(sd)
