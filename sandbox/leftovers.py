"""What a dead executor left behind, and the sweep that removes it (``sandbox gc``).

An executor killed with SIGKILL (or a host that crashed) cannot clean up: its calls' cgroups,
its private copies and overlays in the data directory and its sessions' scratch directories
stay. Each of them therefore names its owner: cgroups and copies in their name,
``<kind>-<pid>-<starttime>-<id>``; a scratch directory, whose name is its session's, in a
``<name>.owner`` file beside it. ``starttime`` is the kernel's start time of the process (in
clock ticks since boot), so a pid reused by another process never passes for the owner.
:func:`sweep` removes only what belongs to an executor that is no longer running; a live
executor's entries are never touched. A session's review snapshots (``review-changes/<session>``)
go with its scratch directory's claim: :func:`sweep_sessions`, which a session runs as it opens,
removes both once the session no longer exists.
"""

from __future__ import annotations

import contextlib
import re
import time
from typing import TYPE_CHECKING

from sandbox.owners import OWNED, claim_alive, owner_alive

if TYPE_CHECKING:
    from pathlib import Path

LEGACY_CGROUP = re.compile(r"^call-[0-9a-f]{12}$")  # 0.1's names, which carry no owner
RMDIR_WAIT_S = 5.0


def _dead_owner(name: str) -> bool:
    match = OWNED.match(name)
    return match is not None and not owner_alive(int(match["pid"]), int(match["start"]))


class Swept:
    """What a sweep removed, by kind, and what it had to keep."""

    def __init__(self) -> None:
        self.cgroups: list[str] = []
        self.copies: list[str] = []
        self.scratch: list[str] = []
        self.reviews: list[str] = []  # review-changes/<session> of sessions that no longer exist
        self.recovered: list[str] = []  # changesets kept from a killed executor's private copy
        self.kept: list[str] = []  # a dead executor's, but could not be removed (why)


def sweep(*, legacy_cgroups: bool = False) -> Swept:
    """Remove what executors that are no longer running left behind.

    ``legacy_cgroups`` also removes empty cgroups named by 0.1 (``call-<12 hex>``), whose owner
    cannot be told: only when the caller knows no 0.1 executor still runs.
    """
    swept = sweep_dead_executors(legacy_cgroups=legacy_cgroups)
    _sweep_sessions(swept, keep=None, cutoff=None)
    return swept


def sweep_sessions(*, keep: str | None = None, max_age_s: float | None = None) -> Swept:
    """Remove the scratch and review-changes directories of sessions that no longer exist.

    A session exists while the executor its scratch dir's ``<id>.owner`` names runs. An unclaimed
    directory (a 0.1 session's, or one opening this instant) goes only once untouched for
    ``max_age_s`` (never when None), and ``keep``'s never by age.
    """
    swept = Swept()
    _sweep_sessions(swept, keep=keep, cutoff=None if max_age_s is None else time.time() - max_age_s)
    return swept


def _sweep_cgroups(swept: Swept, legacy: bool) -> None:
    from sandbox.backends import cgroups

    bases = {h.base for h in cgroups.hierarchies().values() if isinstance(h, cgroups.Hierarchy)}
    for base in sorted(bases):
        with contextlib.suppress(OSError):
            for entry in sorted(base.iterdir()):
                if entry.is_dir() and (_dead_owner(entry.name) or legacy and LEGACY_CGROUP.match(entry.name)):
                    _remove_cgroup(entry, swept)


def _remove_cgroup(path: Path, swept: Swept) -> None:
    """Kill what still runs in a dead executor's cgroup, then remove it (retrying EBUSY meanwhile)."""
    from sandbox.backends import cgroups, confine

    group = cgroups.CallCgroup([path])
    for pause in confine.removal_steps(group, RMDIR_WAIT_S):
        time.sleep(pause)
    if group.paths:
        swept.kept.append(f"{path}: still busy after {RMDIR_WAIT_S:g} s")
    else:
        swept.cgroups.append(str(path))


def sweep_dead_executors(*, legacy_cgroups: bool = False) -> Swept:
    """Remove the calls' cgroups of executors that are gone, and recover then remove their private
    copies; a session runs it as it opens, so a killed server's work is kept, and its cgroups go,
    at the next one (``sandbox gc``'s :func:`sweep` also removes dead sessions' directories)."""
    swept = Swept()
    _sweep_cgroups(swept, legacy_cgroups)
    _sweep_copies(swept)
    return swept


def _sweep_copies(swept: Swept) -> None:
    from sandbox import changes, datadir, mounts
    from sandbox.errors import SandboxError

    root = datadir.data_dir() / "copies"
    with contextlib.suppress(OSError):
        for entry in sorted(root.iterdir()):
            if not _dead_owner(entry.name) or not entry.is_dir():
                continue
            if entry.name.startswith("copy-"):  # the work of a killed executor: kept before it goes
                try:
                    kept = changes.recover(entry)
                except (SandboxError, OSError) as exc:
                    why = exc.message if isinstance(exc, SandboxError) else str(exc)
                    swept.kept.append(f"{entry}: its work could not be kept as a changeset ({why}); left in place")
                    continue
                if kept is not None:
                    swept.recovered.append(f"{kept.id} ({kept.workspace}, {len(kept.entries)} changes)")
            problem = mounts.remove_private_tree(entry)
            if problem:
                swept.kept.append(f"{entry}: {problem}")
            else:
                swept.copies.append(str(entry))
    for baseline in _listing(datadir.data_dir() / "baselines", "*.json"):  # a copy gone, its baselines left
        name = baseline.name.removesuffix(".json")
        if _dead_owner(name) and not (root / name).exists():
            with contextlib.suppress(OSError):
                baseline.unlink()


def _sweep_sessions(swept: Swept, *, keep: str | None, cutoff: float | None) -> None:
    from sandbox import datadir

    data = datadir.data_dir()
    # Review snapshots first: they are judged by the scratch dir's claim, which goes with it.
    for found, root in ((swept.reviews, data / "review-changes"), (swept.scratch, data / "scratch")):
        for entry in _listing(root):
            if _session_ended(data / "scratch" / entry.name, entry, keep, cutoff):
                _remove_session_dir(entry, found, swept)
    for marker in _listing(data / "scratch", "*.owner"):  # a dead executor's claim on a directory gone
        target = marker.with_name(marker.name.removesuffix(".owner"))
        if not target.exists() and claim_alive(target) is False:
            with contextlib.suppress(OSError):
                marker.unlink()


def _listing(root: Path, pattern: str = "*") -> list[Path]:
    try:
        return sorted(root.glob(pattern))
    except OSError:
        return []


def _session_ended(scratch: Path, entry: Path, keep: str | None, cutoff: float | None) -> bool:
    """Whether ``entry`` (a directory named by its session) belongs to a session that no longer exists."""
    if not entry.is_dir() or entry.is_symlink():  # a claim file, or not ours to walk into
        return False
    alive = claim_alive(scratch)
    if alive is not None:
        return not alive
    try:  # unclaimed: by age
        return entry.name != keep and cutoff is not None and entry.stat().st_mtime < cutoff
    except OSError:  # gone meanwhile
        return False


def _remove_session_dir(entry: Path, found: list[str], swept: Swept) -> None:
    from sandbox import mounts

    problem = mounts.remove_private_tree(entry)
    if problem:
        swept.kept.append(f"{entry}: {problem}")
    else:
        found.append(str(entry))
