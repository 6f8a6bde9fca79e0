"""Workspace-relative paths as Windows reads them: the checks an apply makes before it writes.

A changeset names its entries with ``/`` between components, as the copy tree was walked. On
POSIX a name may hold any byte but ``/`` and NUL; on Windows the same text can mean another file,
or none: ``\\`` is a separator too (``a\\..\\..\\x`` climbs out of the workspace), ``C:x`` and
``\\\\server\\share`` leave it, ``name:stream`` writes an alternate data stream of ``name``,
``CON``, ``NUL``, ``COM1``… open a device whatever their extension, and the Win32 layer drops a
name's trailing dots and spaces (``notes.txt.`` *is* ``notes.txt``). A jail can create such names
in its private copy all the same (the ``\\\\?\\`` prefix skips the Win32 rules), so a name that
would reach another file than the one reviewed is refused, never "normalised".

Names are also compared without case on Windows: two changes whose paths differ only by case
would write one file twice, so both are refused (:func:`case_collisions`).

Pure functions, no Windows calls: the Linux suite tests them too.
"""

from __future__ import annotations

import re
from pathlib import PurePosixPath
from typing import TYPE_CHECKING, Literal

from sandbox.errors import Conflict

if TYPE_CHECKING:
    from collections.abc import Iterable

Flavour = Literal["posix", "windows"]

_DEVICES = {"CON", "PRN", "AUX", "NUL", "CONIN$", "CONOUT$", "CLOCK$"}
_NUMBERED = re.compile(r"^(COM|LPT)[0-9\u00b9\u00b2\u00b3]$")  # COM0-9, LPT0-9 and the superscript digits
_FORBIDDEN = set('<>"/\\|?*')


def windows_name_problem(name: str) -> str | None:
    """Why ``name`` (one component) cannot name the same file on Windows, or ``None``."""
    if name in ("", ".", ".."):
        return "an empty, '.' or '..' component"
    if ":" in name:
        return "a ':' (a drive or an alternate data stream 'name:stream')"
    if "\\" in name:
        return "a '\\' (a path separator on Windows)"
    if bad := sorted(c for c in set(name) if c in _FORBIDDEN or ord(c) < 32):
        return f"a character Windows forbids in names ({', '.join(repr(c) for c in bad)})"
    if name[-1] in ". ":
        return "a trailing dot or space (Windows drops it: another file's name)"
    stem = name.split(".", 1)[0].rstrip(" ").upper()
    if stem in _DEVICES or _NUMBERED.match(stem):
        return f"a reserved device name ({stem})"
    return None


def checked_parts(path: str, flavour: Flavour) -> tuple[str, ...]:
    """The components of a changeset path, refused (CONFLICT) unless it stays inside the workspace
    and names there, under ``flavour``'s rules, exactly the entry it says."""
    pure = PurePosixPath(path)
    parts = pure.parts
    if not parts or pure.is_absolute() or any(p in ("", ".", "..") for p in parts) or "/".join(parts) != path:
        raise Conflict("not a relative path inside the workspace", path=path)
    if flavour == "windows":
        for part in parts:
            if problem := windows_name_problem(part):
                raise Conflict(f"not applied on Windows: {problem} in {part!r}", path=path)
    return parts


def fold(path: str) -> str:
    """A path as a case-insensitive filesystem compares it."""
    return path.casefold()


def case_collisions(paths: Iterable[str]) -> set[str]:
    """The paths that another path of ``paths`` equals but for case (every one of each such group)."""
    groups: dict[str, set[str]] = {}
    for path in paths:
        groups.setdefault(fold(path), set()).add(path)
    return {p for group in groups.values() if len(group) > 1 for p in group}
