"""The changeset: what a jail changed in its private tree, what applying it reported, and who consents.

:class:`Change` is one entry (its status, kind, flags, modes, digest, whether it can be applied);
:class:`Changeset` all of them with the paths kept out of the copy; :class:`ApplyReport` what an
apply did. The one consent rule lives here (:func:`needs_consent`, :func:`selected`): a flagged
change is applied only when named or when flagged changes are included explicitly. An apply's
target is any :class:`ApplyTarget` (a private copy, a kept changeset's tree): the journal and the
Windows planner guard each entry against it with :func:`guard_entry`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import TYPE_CHECKING, Any, Protocol

from sandbox.errors import Conflict
from sandbox.mounts.stamps import Stamp

if TYPE_CHECKING:
    from collections.abc import Collection, Iterable, Iterator
    from pathlib import Path

    from sandbox.vocabulary import ChangeStatus as Status
    from sandbox.vocabulary import EntryKind as Kind


RISKY_FLAGS = (
    "git-hook",
    "git-config",
    "dotfile",
    "new-executable",
    "setuid",
    "symlink-outside",
    "special-file",
    "hardlink",
    "tool-config",
    "system-link",
)


# Listed in the review but needing no consent: a link into the read-only system tree the jail was
# given (``.venv/bin/python3 -> /usr/bin/python3``) can only name a host file the user can run already.
NOTICE_FLAGS = frozenset({"system-link"})


@dataclass
class Change:
    path: str
    status: Status
    kind: Kind
    flags: list[str] = field(default_factory=list)
    mode_before: int | None = None
    mode_after: int | None = None
    size: int | None = None
    sha256: str | None = None
    target: str | None = None
    applicable: bool = True
    reason: str = ""
    note: str = ""  # for the reviewer: a system link to a file this host lacks

    def to_dict(self) -> dict[str, Any]:
        data = {f.name: getattr(self, f.name) for f in fields(self)}  # not asdict: no deep copy of plain values
        data["flags"] = list(self.flags)
        for key in ("mode_before", "mode_after"):
            if data[key] is not None:
                data[key] = oct(data[key])
        return {k: v for k, v in data.items() if v not in (None, "")}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Change:
        """The inverse of :meth:`to_dict` (keys it does not know are refused by the constructor)."""
        values = dict(data)
        for key in ("mode_before", "mode_after"):
            if isinstance(values.get(key), str):
                values[key] = int(values[key], 8)
        return cls(**values)


@dataclass
class Changeset:
    """What the jail changed in its private tree; ``untracked``: paths kept out of it (bound read-only)."""

    changes: list[Change] = field(default_factory=list)
    untracked: list[str] = field(default_factory=list)

    @property
    def risky(self) -> list[Change]:
        return [c for c in self.changes if set(c.flags) - NOTICE_FLAGS]

    def summary(self) -> dict[str, int]:
        counts = {"added": 0, "modified": 0, "deleted": 0, "flagged": len(self.risky)}
        for change in self.changes:
            counts[change.status] += 1
        return counts

    def to_list(self) -> list[dict[str, Any]]:
        return [c.to_dict() for c in self.changes]


@dataclass
class ApplyReport:
    applied: list[str] = field(default_factory=list)
    conflicts: list[dict[str, str]] = field(default_factory=list)
    skipped: list[dict[str, str]] = field(default_factory=list)
    held_back: list[dict[str, Any]] = field(default_factory=list)  # flagged, not consented: path, flags

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def needs_consent(change: Change, named: Collection[str] | None, include_flagged: bool) -> bool:
    """Whether a flagged change waits for consent: it is applied only when named or when flagged
    changes are included explicitly (``--include-flagged``)."""
    named_it = named is not None and change.path in named
    return bool(set(change.flags) - NOTICE_FLAGS) and change.applicable and not include_flagged and not named_it


def with_contents(named: Collection[str], paths: Iterable[str]) -> set[str]:
    """The entries of ``paths`` that ``named`` names: a directory names every entry below it, so
    ``--only .venv`` applies its content, not only its own entry (an empty directory). A directory
    that has no entry of its own is replaced by those below it; an unknown name stays, for the
    caller to refuse."""
    named = {n.rstrip("/") or n for n in named}
    entries = set(paths)
    dirs = {a for p in entries for a in _ancestors(p)}
    below = {p for p in entries if any(a in named for a in _ancestors(p))}
    return {n for n in named if n in entries or n not in dirs} | below


def _ancestors(path: str) -> Iterator[str]:
    at = path.rfind("/")
    while at > 0:
        path = path[:at]
        yield path
        at = path.rfind("/")


def selected(changeset: Changeset, only: set[str] | None, include_flagged: bool, report: ApplyReport) -> list[Change]:
    """The changes an apply tries, in apply order: named (when ``only``), applicable and consented;
    the others go to ``report`` as skipped or held back."""
    chosen = []
    if only is not None:
        only = with_contents(only, (c.path for c in changeset.changes))
    for change in sorted(changeset.changes, key=apply_order):
        if only is not None and change.path not in only:
            continue
        if not change.applicable:
            report.skipped.append({"path": change.path, "reason": change.reason})
            continue
        if needs_consent(change, only, include_flagged):
            report.held_back.append({"path": change.path, "flags": list(change.flags)})
            continue
        chosen.append(change)
    return chosen


def apply_order(change: Change) -> tuple[int, int, str]:
    """Deletions first, children before their directory, then the rest, directories before their children.

    A directory replaced by a file (or deleted) must hold only planned deletions when it is checked.
    """
    depth = change.path.count("/")
    if change.status == "deleted":
        return (0, -depth, change.path)
    return (1, depth, change.path)


class ApplyTarget(Protocol):
    """What an apply brings changes back to: the host ``workspace``, the private tree (``root``)
    holding what the jail wrote, and the check that a host entry is still what was copied in."""

    workspace: Path
    root: Path

    def guard_stamp(self, change: Change, current: Stamp | None) -> None:
        """Raise CONFLICT unless ``current`` (the host entry now; ``None``: absent) is as copied in."""


def guard_entry(target: ApplyTarget, change: Change, pfd: int, name: str) -> None:
    """The host entry ``name`` in the directory ``pfd`` must still be what was copied in (or still
    absent for an addition): read without following it, then judged by ``target``."""
    try:
        current: Stamp | None = Stamp.of(name, dir_fd=pfd)
    except FileNotFoundError:
        current = None
    except OSError as exc:
        raise Conflict(f"cannot check the host file: {exc.strerror}") from exc
    target.guard_stamp(change, current)
