"""The shell catalogue (seed 003 D190): the shells the Bash tool may run a command in, by stable id.

``bash`` (a POSIX jail's), and on Windows ``cmd``, ``windows-powershell`` and ``git-bash`` (Git for
Windows'). A shell is named by its id only, never by an executable's path or hash. The effective
shell is the profile's (``winjob.shell``), else the user's stored default (``sandbox shells default
ID``), else the platform's first: a stored choice that is not available on the platform falls back
on purpose. A turn pins the shell its first Bash call ran in (:class:`TurnShells`): a later call
of the same turn that would run in another shell or dialect is COMMAND_SHELL_CHANGED, and a
request naming a shell other than the effective one too. Storing an unknown id, or one of another
platform, is COMMAND_SHELL_INVALID.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from sandbox import datadir
from sandbox.errors import CommandShellChanged, CommandShellInvalid

if TYPE_CHECKING:
    from pathlib import Path

ShellId = Literal["bash", "cmd", "windows-powershell", "git-bash"]
Dialect = Literal["bash", "cmd", "powershell"]
Platform = Literal["posix", "windows"]


@dataclass(frozen=True, slots=True)
class Shell:
    id: ShellId
    dialect: Dialect
    platform: Platform
    description: str


CATALOGUE: tuple[Shell, ...] = (
    Shell("bash", "bash", "posix", "bash in the jail (looked up in the system directories only)"),
    Shell("cmd", "cmd", "windows", "cmd.exe /d /s /c: no AutoRun; under Wine the one there is"),
    Shell("windows-powershell", "powershell", "windows", "Windows PowerShell, no profile, non-interactive"),
    Shell("git-bash", "bash", "windows", "Git for Windows' bash, without its rc files (SHELL_NOT_FOUND if absent)"),
)
"""Each platform's shells, its first being the one a choice falls back to."""

LEGACY = {"powershell": "windows-powershell"}
"""``winjob.shell``'s earlier spellings; ``bash`` under winjob meant Git for Windows' (``git-bash``)."""


def platform_of(backend: str) -> Platform:
    """The platform a backend's commands run on."""
    return "windows" if backend == "winjob" else "posix"


def host_platform() -> Platform:
    return "windows" if sys.platform == "win32" else "posix"


def find(name: str, platform: Platform) -> Shell | None:
    """The catalogue's entry for ``name`` (an id or an earlier spelling) on ``platform``, if any."""
    wanted = LEGACY.get(name, name)
    if wanted == "bash" and platform == "windows":
        wanted = "git-bash"
    return next((shell for shell in CATALOGUE if shell.id == wanted and shell.platform == platform), None)


def effective(backend: str, chosen: str | None = None, store: ShellStore | None = None) -> Shell:
    """The shell a Bash call runs in: ``chosen`` (the profile's), else the stored default, else the
    platform's first; a choice not available on the platform is passed over."""
    platform = platform_of(backend)
    offered = [shell for shell in CATALOGUE if shell.platform == platform]
    if len(offered) == 1:  # a POSIX jail has bash only: nothing to choose, no file read per call
        return offered[0]
    for name in (chosen, (store or ShellStore()).default()):
        if name and (shell := find(name, platform)) is not None:
            return shell
    return offered[0]


class ShellStore:
    """The user's default shell, kept in the data directory (``shells.json``)."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path or datadir.subdir("policy") / "shells.json"

    def default(self) -> str | None:
        try:
            value = json.loads(self.path.read_text(encoding="utf-8")).get("default")
        except (OSError, ValueError, AttributeError):
            return None
        return value if isinstance(value, str) else None

    def set_default(self, name: str, platform: Platform | None = None) -> Shell:
        """Store ``name`` as the default: COMMAND_SHELL_INVALID when it is no shell of ``platform``
        (this host's by default)."""
        platform = platform or host_platform()
        shell = find(name, platform)
        if shell is None:
            ids = ", ".join(s.id for s in CATALOGUE if s.platform == platform)
            known = any(s.id == LEGACY.get(name, name) for s in CATALOGUE)
            why = "is not available on this platform" if known else "is not a shell of the catalogue"
            raise CommandShellInvalid(f"shell {name!r} {why}; choose one of {ids}", shell=name, platform=platform)
        datadir.atomic_write(self.path, json.dumps({"default": shell.id}) + "\n")
        return shell


class TurnShells:
    """The shell each turn pinned with its first Bash call."""

    def __init__(self) -> None:
        self._pinned: dict[str, Shell] = {}

    def pin(self, turn_id: str, now: Shell, requested: str | None = None) -> Shell:
        """``now`` for this call of ``turn_id``, or COMMAND_SHELL_CHANGED when the turn pinned another
        shell or dialect, or the request names a shell other than ``now``."""
        if requested is not None and find(requested, now.platform) != now:
            raise CommandShellChanged(
                f"the call names shell {requested!r}, but Bash runs in {now.id} now; ask again with {now.id}",
                shell=now.id,
                requested=requested,
            )
        pinned = self._pinned.setdefault(turn_id, now)
        if len(self._pinned) > 64:  # a client that never ends its turns
            del self._pinned[next(iter(self._pinned))]
        if (pinned.id, pinned.dialect) != (now.id, now.dialect):
            raise CommandShellChanged(
                f"this turn's commands run in {pinned.id} ({pinned.dialect}); the shell is now {now.id} "
                f"({now.dialect}): the next turn runs in it",
                shell=now.id,
                pinned=pinned.id,
            )
        return pinned

    def end_turn(self, turn_id: str) -> None:
        self._pinned.pop(turn_id, None)
