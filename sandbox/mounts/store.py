"""The store of kept changesets: finding them, and their retention (sweep, prune, discard)."""

from __future__ import annotations

import contextlib
import os
import time
from typing import TYPE_CHECKING

from sandbox import datadir, owners
from sandbox.errors import Conflict, InvalidArgument, map_errors
from sandbox.mounts.kept import (
    APPLIED_RETENTION_S,
    ID,
    MANIFEST,
    PARTIAL,
    RETENTION_S,
    Kept,
    Pruned,
    exclusive,
    read_kept,
    remove_tree_dir,
    store,
)

if TYPE_CHECKING:
    from pathlib import Path


def load(changeset_id: str) -> Kept:
    """The kept changeset ``changeset_id``; INVALID_ARGUMENT when there is none."""
    sweep()
    return read_kept(changeset_id)


def listing(workspace: Path | None = None) -> list[Kept]:
    """Every kept changeset (of ``workspace`` only, when given), oldest first."""
    sweep()
    found = []
    with map_errors("cannot read the changeset store"):
        names = sorted(p.name for p in store().iterdir() if ID.match(p.name))
    for name in names:
        with contextlib.suppress(InvalidArgument):
            found.append(read_kept(name))
    if workspace is not None:
        wanted = os.path.realpath(workspace)
        found = [k for k in found if os.path.realpath(k.workspace) == wanted]
    return sorted(found, key=lambda k: k.created)


def sweep(now: float | None = None) -> list[str]:
    """Remove changesets kept longer than :data:`RETENTION_S` and what interrupted keeps left."""
    now = time.time() if now is None else now
    try:
        entries = sorted(store().iterdir())
    except OSError:
        return []
    return [entry.name for entry in entries if _expired(entry, now) and remove_unless_busy(entry)]


def _expired(entry: Path, now: float) -> bool:
    if (partial := PARTIAL.match(entry.name)) is not None:
        return not owners.owner_alive(int(partial["pid"]), int(partial["start"]))
    if not ID.match(entry.name):
        return False
    try:
        kept = read_kept(entry.name)
    except InvalidArgument:  # an unreadable manifest: judge by the directory's age
        try:
            return now - entry.stat().st_mtime > RETENTION_S
        except OSError:
            return False
    if kept.state == "applied" and now - _applied_at(entry) > APPLIED_RETENTION_S:
        return True
    return now - kept.created.timestamp() > RETENTION_S


def _applied_at(entry: Path) -> float:
    """When a wholly applied changeset was applied: its manifest's last write (the apply's record)."""
    try:
        return (entry / MANIFEST).stat().st_mtime
    except OSError:
        return 0.0


def remove_unless_busy(path: Path) -> bool:
    try:
        with exclusive(path):
            remove_tree_dir(path)
    except (Conflict, InvalidArgument, OSError):
        return False
    return True


def prune(*, all_applied: bool = False, older_than_days: float | None = None, now: float | None = None) -> list[Pruned]:
    """What :func:`sweep` removes, every applied changeset too (``all_applied``) and every one kept
    more than ``older_than_days`` ago; what was removed. One being applied is left alone."""
    now = time.time() if now is None else now
    pruned = []
    for kept in all_kept():
        why = _prune_reason(kept, now, all_applied, older_than_days)
        found = pruned_entry(kept, why) if why is not None else None  # its size, before it goes
        if found is not None and remove_unless_busy(kept.path):
            pruned.append(found)
    sweep(now)  # what interrupted keeps left
    return pruned


def _prune_reason(kept: Kept, now: float, all_applied: bool, older_than_days: float | None) -> str | None:
    if _expired(kept.path, now):
        return "applied more than a day ago" if kept.state == "applied" else "kept 14 days"
    if all_applied and kept.state == "applied":
        return "applied"
    if older_than_days is not None and now - kept.created.timestamp() > older_than_days * 86400:
        return f"older than {older_than_days:g} days"
    return None


def discard_all(workspace: Path | None = None) -> list[str]:
    """Discard every kept changeset (of ``workspace`` only, when given); the ids discarded."""
    return [kept.id for kept in listing(workspace) if remove_unless_busy(kept.path)]


def all_kept() -> list[Kept]:
    """Every readable kept changeset, oldest first, without sweeping."""
    found = []
    with contextlib.suppress(OSError):
        for name in sorted(p.name for p in store().iterdir() if ID.match(p.name)):
            with contextlib.suppress(InvalidArgument):
                found.append(read_kept(name))
    return sorted(found, key=lambda k: k.created)


def pruned_entry(kept: Kept, why: str) -> Pruned:
    return Pruned(kept.id, kept.state, kept.created, datadir.tree_bytes(kept.path), why)
