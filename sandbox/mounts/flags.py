"""The review flags of a change: what a reviewer must consent to before it reaches the host.

Git hooks and config, files the host's git or tools obey, dotfiles, new executables, setuid bits,
special files, hard links and links that lead out (:func:`change_flags`); on Windows, a name the
Win32 rules read as another file or a device (:func:`windows_unsafe`).
"""

from __future__ import annotations

import stat
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from sandbox.mounts import gitobeyed, gitreview, winpaths

if TYPE_CHECKING:
    from sandbox.mounts.stamps import Stamp
    from sandbox.vocabulary import ChangeStatus as Status
    from sandbox.vocabulary import EntryKind as Kind
from sandbox.mounts.changeset import Change
from sandbox.mounts.links import LinkVerdict, link_verdict


def change_flags(rel: str, kind: Kind, before: Stamp | None, after: Stamp | None, workspace: Path) -> list[str]:
    parts = PurePosixPath(rel).parts
    if parts[0] == ".git" and gitreview.is_repository(workspace):
        # A repository's own data files form one consent group (sandbox.mounts.gitreview), not dotfiles.
        return gitreview.internal_flags(rel) + mode_flags(rel, kind, before, after, workspace)
    flags: list[str] = []
    if parts[:2] == (".git", "hooks") and len(parts) > 2:
        flags.append("git-hook")
    if parts[:2] == (".git", "config"):
        flags.append("git-config")
    if not flags and gitreview.is_repository(workspace) and gitobeyed.obeyed_in_worktree(workspace, rel):
        flags.append("git-hook")  # core.hooksPath's directory, .husky, lefthook.yml, a file the config includes
    if rel in gitobeyed.HOST_TOOL_FILES:
        flags.append("tool-config")  # mise runs its hooks at the next prompt
    if any(p.startswith(".") for p in parts) and not flags:
        flags.append("dotfile")
    return flags + mode_flags(rel, kind, before, after, workspace)


def mode_flags(rel: str, kind: Kind, before: Stamp | None, after: Stamp | None, workspace: Path) -> list[str]:
    flags: list[str] = []
    if after is None:
        return flags
    was_exec = before is not None and before.kind == "file" and before.mode & 0o111
    if kind == "file" and after.mode & 0o111 and not was_exec:
        flags.append("new-executable")
    if after.mode & (stat.S_ISUID | stat.S_ISGID):
        flags.append("setuid")
    if kind == "special":
        flags.append("special-file")
    if kind == "file" and after.nlink > 1:
        flags.append("hardlink")
    if kind == "symlink" and after.target is not None:
        flags += _LINK_FLAGS[link_verdict(rel, after.target, workspace)]  # the host's view; the tree's: _change
    return flags


_LINK_FLAGS: dict[LinkVerdict, list[str]] = {"inside": [], "system": ["system-link"], "outside": ["symlink-outside"]}


def windows_unsafe(rel: str, before: Stamp | None, after: Stamp | None) -> Change | None:
    """A change whose name Windows reads as another file or a device (``x.``, ``con``): listed,
    never read (its content could be a console's) and never applied."""
    problems = [p for part in rel.split("/") if (p := winpaths.windows_name_problem(part))]
    if not problems:
        return None
    now = after or before
    assert now is not None
    status: Status = "deleted" if after is None else "added" if before is None else "modified"
    change = Change(rel, status, now.kind, [], before.mode if before else None, after.mode if after else None)
    change.applicable, change.reason = False, f"not applied on Windows: {problems[0]}"
    return change
