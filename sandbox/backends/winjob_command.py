"""What a winjob call runs with: its environment, its command line, its shell and its program's path.

Apart from the jail (:mod:`sandbox.backends.winjob`) because none of it touches a job or a
handle: these are the pure rules by which a POSIX-minded call becomes a Windows one. The
environment is rebuilt from system locations, a private home and the profile's allowlist (never
the caller's secrets); ``argv`` is quoted as the C runtime parses it, except what follows
``cmd /s /c`` (:class:`Verbatim`); the Bash tool's command goes to the profile's shell; and the
program is looked up in the jail's PATH, not ours.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

from sandbox import shells
from sandbox.backends.winjob_job import NAME
from sandbox.errors import CommandShellInvalid, ShellNotFound

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from sandbox.profile import Profile

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


def shell_argv(command: str, shell: str = "cmd", comspec: str | None = None) -> list[str]:
    """The Bash tool's ``command`` for a Windows shell of :data:`sandbox.shells.CATALOGUE` (its id,
    or ``winjob.shell``'s earlier spelling): ``cmd`` (the first; always there, and under Wine the
    one there is), ``windows-powershell`` (no profile, non-interactive) or ``git-bash`` (Git for
    Windows' bash, without its rc files: refused with SHELL_NOT_FOUND where it is not installed)."""
    found = shells.find(shell, "windows")
    if found is None:
        ids = ", ".join(s.id for s in shells.CATALOGUE if s.platform == "windows")
        raise CommandShellInvalid(f"unknown Windows shell {shell!r}; choose one of {ids}", shell=shell)
    if found.id == "windows-powershell":
        return ["powershell.exe", "-NoLogo", "-NoProfile", "-NonInteractive", "-Command", command]
    if found.id == "git-bash":
        bash = git_bash()
        if bash is None:
            raise ShellNotFound(
                "the shell git-bash needs Git for Windows' bash (Git\\bin\\bash.exe), which is not installed "
                "here; install Git for Windows or choose shell = 'cmd' or 'powershell'",
                backend=NAME,
            )
        return [bash, "--noprofile", "--norc", "-c", command]
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
