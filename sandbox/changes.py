"""Kept changesets: what a copy or overlay run changed, kept under an id until applied or discarded.

When a ``copy`` or ``overlay`` run ends with changes, :func:`keep` copies the changed entries out
of the private tree into the data directory, ``changes/<id>/``, before the jail's close removes
that tree::

    changes/ch-0123456789ab/
        manifest.json   id, workspace, created, source, profile, backend, state, and per entry the
                        change (status, kind, modes, target, flags), the SHA-256 of the content as
                        kept, the host entry's Stamp recorded at copy-in, and whether it is applied
        tree/<path>     the content of each added or modified file, 0600, ours

Only the changed files are copied, never the whole private tree: a changeset is usually a few
files of a large workspace, an overlay's merged view is a mount point that cannot be moved, and a
copy of our own (rather than a hard link) gives the store inodes no jail uid owns or can still
write. A directory, symlink or deletion needs no content: the manifest says it all.

Nothing leaves the store unreviewed. :meth:`Kept.diff` shows each file against the host file as
it is *now*; :meth:`Kept.apply` re-hashes the kept content first and refuses with CONFLICT if a
byte differs from the manifest, then hands the entries to :meth:`sandbox.mounts.CopyTree.apply`
over the kept tree with the manifest's host Stamps, so the guard is the very one a live copy
uses: a host entry changed since copy-in is refused. Flagged entries (git hooks, git config,
dotfiles, new executables…) need consent: they are applied only when named in ``only`` or with
``include_flagged``, and are otherwise reported as held back.

A repository's ``.git`` entries are one group (:mod:`sandbox.mounts.gitreview`), applied all together or
not at all: naming ``.git`` or any entry of it in ``only`` names the whole group; without
consent the group is held back whole, as one ``held_back`` item (``"group": "git"``), when its
summary found anything risky (a hook, a risky config key, an entry that is none of git's data
files), and is otherwise applied with the rest, its ``git-config`` flag notwithstanding. The
summary is computed from the kept files when the changeset is kept, and stored in the manifest.

An environment directory (the profile's ``mount.environment``, :mod:`sandbox.mounts.envdirs`: ``.venv``,
``node_modules``…) is a group too: without consent it is held back whole, one ``held_back`` item
(``"group": "environment"``, its one-line summary); naming the directory in ``only`` names all of
its entries, and ``include_environment`` consents to every such directory (their flagged entries
included: they are counted in the summary the reviewer saw). The profile's list is kept in the
manifest, so a later ``apply`` judges by the rule the run had.

On Windows (the winjob backend) the store works the same: the lock is a byte lock on a
``.lock-<id>`` file beside the changeset (``msvcrt.locking``), and a file is read after an
``lstat`` has refused a symlink or reparse point on its way (Windows has no ``O_NOFOLLOW``).

A kept changeset stays until it is discarded, until :data:`APPLIED_RETENTION_S` (a day) after it
was wholly applied (its content is then on the host: a 14,000-file install need not keep 90 MB
for two weeks), or :data:`RETENTION_S` (14 days) after it was kept: the store sweeps itself on
each use. The store is capped (``limits.kept_changes``): a keep that would pass the cap first
prunes applied changesets, then the oldest kept ones, and says so (:attr:`Kept.pruned`); it is
refused only when that is not enough. ``sandbox changes prune`` and ``discard --all`` do it by
hand (:func:`prune`, :func:`discard_all`). A keep interrupted half-way leaves a
``.partial-<pid>-<starttime>-<hex>`` directory, swept once its executor is gone.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import stat
import sys
import time
import uuid
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

import anyio
import anyio.to_thread

from sandbox import datadir, diffbound, owners, textsafe
from sandbox.errors import Conflict, InvalidArgument, ToolFailed, map_errors
from sandbox.mounts import (
    WINDOWS,
    ApplyReport,
    Change,
    Changeset,
    CopyTree,
    OverlayTree,
    Stamp,
    apply_order,
    envdirs,
    gitreview,
    journal,
    needs_consent,
    open_unfollowed,
    sha256_file,
    with_contents,
)
from sandbox.mounts.gitreview import GitSummary
from sandbox.threads import off_loop

if sys.platform != "win32":
    import fcntl

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator, Sequence

    from sandbox.vocabulary import ChangesetSource, ChangesetState

RETENTION_S = 14 * 24 * 3600
"""How long a kept changeset stays, applied or not, unless discarded first."""
APPLIED_RETENTION_S = 24 * 3600
"""How long a wholly applied changeset stays after its apply (a day to look back at it)."""
STORE_LIMIT = 2 * 2**30  # limits.kept_changes' default, for callers without a profile
ID = re.compile(r"^ch-[0-9a-f]{12}$")
PARTIAL = re.compile(r"^\.partial-(?P<pid>\d+)-(?P<start>\d+)-[0-9a-f]+$")
MANIFEST = "manifest.json"
FORMAT = 1
_CHUNK = 1 << 20
_DIFF_MAX = 1 << 20  # larger files are summarised, not diffed
DIFF_DEADLINE_S = 5.0  # the time one review's diffs may take together; later files are summed up
DIFF_THREADS = anyio.CapacityLimiter(1)


@dataclass
class Entry:
    """One change as kept: the change, the host entry it must still find, whether it is applied."""

    change: Change
    host: Stamp | None = None
    applied: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {**self.change.to_dict(), "host": self.host.to_dict() if self.host else None, "applied": self.applied}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Entry:
        values = dict(data)
        host = values.pop("host", None)
        applied = bool(values.pop("applied", False))
        return cls(Change.from_dict(values), Stamp.from_dict(host) if host else None, applied)


@dataclass
class Kept:
    """A changeset kept in the store; :func:`load` gives it, :func:`keep` makes it."""

    id: str
    workspace: Path
    created: datetime
    source: ChangesetSource
    profile: str
    backend: str
    entries: list[Entry] = field(default_factory=list)
    state: ChangesetState = "kept"
    untracked: list[str] = field(default_factory=list)  # excluded from the copy (mount.exclude)
    git: GitSummary | None = None  # the .git internals summarised, for a repository workspace
    environment: list[str] = field(default_factory=list)  # the profile's mount.environment (sandbox.mounts.envdirs)
    pruned: list[Pruned] = field(default_factory=list)  # what its keep removed to fit the cap (not kept)

    @property
    def path(self) -> Path:
        return store() / self.id

    @property
    def changeset(self) -> Changeset:
        return Changeset([e.change for e in self.entries], untracked=list(self.untracked))

    def summary(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "workspace": str(self.workspace),
            "created": self.created.isoformat(timespec="seconds"),
            "source": self.source,
            "profile": self.profile,
            "backend": self.backend,
            "state": self.state,
            "counts": {**self.changeset.summary(), "applied": sum(e.applied for e in self.entries)},
            "untracked": list(self.untracked),
            "environment": list(self.environment),
        }

    def to_dict(self) -> dict[str, Any]:
        git = self.git.to_dict() if self.git is not None else None
        return {"format": FORMAT, **self.summary(), "git": git, "changes": [e.to_dict() for e in self.entries]}

    def git_lines(self) -> list[str]:
        """The git summary as review lines (none when the workspace is no repository)."""
        return textsafe.printable_lines(self.git.lines()) if self.git is not None else []  # names are data

    def diff(self, only: Iterable[str] | None = None, *, exact: bool = False) -> str:
        """Each entry against the host as it is now: a unified diff for text, a summary otherwise.

        A repository's ``.git`` entries are left out unless named: :meth:`git_lines` sums them up.
        ``exact``: ``only`` lists entries (a review chose them), a directory not naming its contents.
        """
        group = self._git_group() if only is None else set()
        # One deadline for the whole review: a file past it, or past the size bounds, is summed up.
        deadline = time.monotonic() + DIFF_DEADLINE_S
        picked = set(only) if exact and only is not None else None
        entries = self._select(only) if picked is None else [e for e in self.entries if e.change.path in picked]
        chosen = (entry for entry in entries if entry.change.path not in group)
        return "".join(_entry_diff(self, entry, deadline) for entry in chosen)

    async def diff_off_loop(self, only: Iterable[str] | None = None) -> str:
        """:meth:`diff` in a worker thread, one review at a time in this process: a flood of reviews
        queues for :data:`DIFF_THREADS` instead of taking every worker thread (and core) the
        server's other sessions need."""
        return await anyio.to_thread.run_sync(self.diff, only, limiter=DIFF_THREADS)

    async def apply(
        self, only: Iterable[str] | None = None, *, include_flagged: bool = False, include_environment: bool = False
    ) -> ApplyReport:
        """Apply the pending entries (or those named in ``only``) that are unflagged or consented.

        Flagged entries are applied only when named in ``only`` or with ``include_flagged``;
        otherwise they are in the report's ``held_back``. An environment directory (``.venv``…)
        is applied only when named (``only``: the directory names all of it) or with
        ``include_environment``, its flagged entries then included; otherwise it is one
        ``held_back`` item. Raises CONFLICT, applying nothing, when the kept content no longer
        has the hash the manifest recorded.
        """
        with _exclusive(self.path):
            await off_loop(self._reload)
            named = self._with_environment(self._with_group(_normalised(only)))
            chosen, report = self._choose(named, include_flagged, include_environment)
            await off_loop(self._verify, chosen)
            chosen = await off_loop(self._unsplit, chosen, report)
            consented = Changeset([e.change for e in chosen])  # _choose held back what needs consent
            done = await self._tree().apply(consented, include_flagged=True)
            await off_loop(self._record, done)
        report.applied += done.applied
        report.conflicts += done.conflicts
        report.skipped += done.skipped
        return report

    def discard(self) -> None:
        """Remove the kept changeset (its content and its manifest)."""
        with _exclusive(self.path):
            _remove(self.path)

    def _select(self, only: Iterable[str] | None) -> list[Entry]:
        named = _normalised(only)
        if named is None:
            return list(self.entries)
        named = with_contents(named, (e.change.path for e in self.entries))  # a directory: all of it
        unknown = named - {e.change.path for e in self.entries}
        if unknown:
            raise InvalidArgument(f"not in changeset {self.id}: {', '.join(sorted(unknown))}", paths=sorted(unknown))
        return [e for e in self.entries if e.change.path in named]

    def _git_group(self) -> set[str]:
        """The ``.git`` entries, one consent group, when the workspace is a repository (else none)."""
        if self.git is None:
            return set()
        return {e.change.path for e in self.entries if gitreview.in_git(e.change.path)}

    def _with_group(self, named: set[str] | None) -> set[str] | None:
        """Naming a directory names every entry below it (:func:`~sandbox.mounts.with_contents`), and
        naming ``.git`` or any entry of the git group names the whole group: it is never split."""
        if named is not None:
            named = with_contents(named, (e.change.path for e in self.entries))
        group = self._git_group()
        if named is None or not group or not any(p == gitreview.GIT or p in group for p in named):
            return named
        return (named - {gitreview.GIT}) | group

    def _choose(
        self, named: set[str] | None, include_flagged: bool, include_environment: bool = False
    ) -> tuple[list[Entry], ApplyReport]:
        report = ApplyReport()
        chosen = []
        group = self._git_group()
        held_group = bool(group) and named is None and not include_flagged and self._git_risky()
        env_of = self._environment_of()
        held_env: dict[str, list[Entry]] = {}
        for entry in self._select(named):
            change = entry.change
            env = env_of.get(change.path)
            if env is not None and named is None and not include_environment:
                if not entry.applied:  # environment, not work: applied only when asked
                    held_env.setdefault(env, []).append(entry)
                continue
            if change.path in group:
                if held_group and not entry.applied:
                    continue
                if not entry.applied:
                    chosen.append(entry)
                continue
            if entry.applied:
                if named is not None:
                    report.skipped.append({"path": change.path, "reason": "already applied"})
            elif needs_consent(change, named, include_flagged or env is not None):
                report.held_back.append({"path": change.path, "flags": list(change.flags)})
            else:
                chosen.append(entry)
        if held_group and any(not e.applied for e in self.entries if e.change.path in group):
            report.held_back.append(self._group_held_back(group))
        report.held_back += [_environment_held_back(root, held) for root, held in sorted(held_env.items())]
        return chosen, report

    def _environment_of(self) -> dict[str, str]:
        """Each entry in an environment directory (:mod:`sandbox.mounts.envdirs`), with that directory."""
        found = envdirs.groups((e.change.path for e in self.entries), self.environment)
        return {path: root for root, paths in found.items() for path in paths}

    def _with_environment(self, named: set[str] | None) -> set[str] | None:
        """Naming an environment directory names every entry in it: its content, not the empty directory."""
        if named is None:
            return None
        found = envdirs.groups((e.change.path for e in self.entries), self.environment)
        return named.union(*(paths for root, paths in found.items() if root in named))

    def environment_summaries(self) -> list[envdirs.EnvSummary]:
        """One summary per environment directory of this changeset, by path."""
        found = envdirs.groups((e.change.path for e in self.entries), self.environment)
        by_path = {e.change.path: e.change for e in self.entries}
        return [envdirs.summarise((by_path[p] for p in paths), root) for root, paths in sorted(found.items())]

    def _unsplit(self, chosen: list[Entry], report: ApplyReport) -> list[Entry]:
        """Leave the git group out when the host changed any of its entries (it ran git meanwhile).

        The apply guards each entry and would apply the rest: a repository half ours, half the
        host's. Guarding the group first keeps it whole; the apply guards every entry again.
        """
        group = self._git_group()
        picked = [e.change for e in chosen if e.change.path in group and e.change.applicable]
        if not picked:
            return chosen

        plan = journal.Plan(self._tree())
        for change in sorted(picked, key=apply_order):
            plan.add(change)
        if not plan.report.conflicts:
            return chosen
        report.conflicts += plan.report.conflicts
        reason = f"not applied: {len(plan.report.conflicts)} of its entries changed on the host since copy-in"
        report.conflicts.append({"path": gitreview.GIT, "reason": f"the git group is {reason}"})
        return [e for e in chosen if e.change.path not in group]

    def _git_risky(self) -> bool:
        return self.git is not None and bool(self.git.risky)

    def _group_held_back(self, group: set[str]) -> dict[str, Any]:
        flags = sorted({f for e in self.entries if e.change.path in group for f in e.change.flags})
        risky = self.git.risky if self.git is not None else []
        return {"path": gitreview.GIT, "flags": flags, "group": gitreview.GROUP, "entries": len(group), "risky": risky}

    def _verify(self, chosen: list[Entry]) -> None:
        """What is applied is exactly what was kept (and shown): every byte, by its hash."""
        for entry in chosen:
            change = entry.change
            if _has_content(change) and change.applicable:
                try:
                    digest = sha256_file(self.path / "tree" / change.path)
                except OSError as exc:
                    raise Conflict(f"the kept content of {change.path} is unreadable: {exc.strerror}") from exc
                if digest != change.sha256:
                    raise Conflict(
                        f"the kept content of {change.path} changed since it was kept; nothing applied",
                        path=change.path,
                        changeset=self.id,
                    )

    def _tree(self) -> CopyTree:
        """A copy tree whose private root is the kept tree and whose host Stamps are the manifest's."""
        tree = CopyTree(self.workspace, self.path / "tree")
        tree.host = {e.change.path: e.host for e in self.entries if e.host is not None}
        return tree

    def _reload(self) -> None:
        fresh = _read(self.id)
        self.entries, self.state = fresh.entries, fresh.state

    def _record(self, done: ApplyReport) -> None:
        applied = set(done.applied)
        for entry in self.entries:
            entry.applied = entry.applied or entry.change.path in applied
        pending = [e for e in self.entries if e.change.applicable and not e.applied]
        if not pending:
            self.state = "applied"
        elif len(pending) < sum(e.change.applicable for e in self.entries):
            self.state = "partial"
        _write_manifest(self.path, self)


def held_back_line(held: dict[str, Any]) -> str:
    """A held-back entry as a review line; the git group with why it was held back whole."""
    flags = f"[{', '.join(held['flags'])}]"
    if held.get("group") is None:
        return f"{textsafe.printable(held['path'])} {flags}"
    if held["group"] == envdirs.GROUP:
        return textsafe.printable(held["summary"])
    return f"{held['path']} (the git group, {held['entries']} entries) {flags}: {'; '.join(held['risky'])}"


# -- the store ----------------------------------------------------------------------------------


def _environment_held_back(root: str, held: list[Entry]) -> dict[str, Any]:
    """An environment directory held back whole, as one item: its summary says how to ask for it."""
    flags = sorted({f for e in held for f in e.change.flags})
    line = envdirs.summarise((e.change for e in held), root).line()
    return {"path": root, "flags": flags, "group": envdirs.GROUP, "entries": len(held), "summary": line}


def store() -> Path:
    return datadir.subdir("changes")


async def keep(
    tree: CopyTree,
    changeset: Changeset,
    *,
    source: ChangesetSource,
    profile: str,
    backend: str,
    limit: int = STORE_LIMIT,
    environment: Sequence[str] = (),
    giving_up: bool = False,
) -> Kept:
    """Keep ``changeset`` (read from ``tree``, still present) under a new id; returns it.

    ``giving_up``: the caller removes ``tree`` right after, nothing running in it (``sandbox
    run``): its files are moved into the store instead of copied (a file with other links is
    still copied), so a keep costs a rename per file, not a copy.

    ``limit`` bounds every kept changeset's content together (``limits.kept_changes``): a keep
    that would pass it is refused whole with TOOL_FAILED (``errno`` ENOSPC), and nothing is kept.
    """
    return await off_loop(_keep, tree, changeset, source, profile, backend, limit, tuple(environment), giving_up)


def recover(root: Path) -> Kept | None:
    """Keep the work in ``root``, the private copy of an executor that is gone (killed), as a
    changeset of source ``recovered``; ``None`` when there is none to keep (no baseline was saved:
    no jail ran on it; nothing changed; another sweeper holds it). The copy is left for the caller
    to remove. Its files are moved, as ``sandbox run`` does: nothing runs in it any more."""
    if WINDOWS:
        return None
    baseline = CopyTree.baseline_file(root)
    try:
        fd = os.open(baseline, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # one sweeper at a time (gc, a session opening)
        except BlockingIOError:
            return None
        tree = CopyTree.recovered(root)
        if tree is None or not root.is_dir() or not os.path.exists(baseline):
            return None  # removed by a sweeper that held it before us
        changeset = tree._untracked_out(tree._changes())
        if not changeset.changes:
            return None
        env = tree.environment
        return _keep(tree, changeset, "recovered", "(unknown)", "(unknown)", STORE_LIMIT, env, giving_up=True)
    finally:
        os.close(fd)


def load(changeset_id: str) -> Kept:
    """The kept changeset ``changeset_id``; INVALID_ARGUMENT when there is none."""
    sweep()
    return _read(changeset_id)


def listing(workspace: Path | None = None) -> list[Kept]:
    """Every kept changeset (of ``workspace`` only, when given), oldest first."""
    sweep()
    found = []
    with map_errors("cannot read the changeset store"):
        names = sorted(p.name for p in store().iterdir() if ID.match(p.name))
    for name in names:
        with contextlib.suppress(InvalidArgument):
            found.append(_read(name))
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
    return [entry.name for entry in entries if _expired(entry, now) and _remove_unless_busy(entry)]


def _expired(entry: Path, now: float) -> bool:
    if (partial := PARTIAL.match(entry.name)) is not None:
        return not owners.owner_alive(int(partial["pid"]), int(partial["start"]))
    if not ID.match(entry.name):
        return False
    try:
        kept = _read(entry.name)
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


def _remove_unless_busy(path: Path) -> bool:
    try:
        with _exclusive(path):
            _remove(path)
    except (Conflict, InvalidArgument, OSError):
        return False
    return True


def _remove(path: Path) -> None:
    for dirpath, _dirs, _files in os.walk(path):
        with contextlib.suppress(OSError):
            os.chmod(dirpath, 0o700)
    shutil.rmtree(path, ignore_errors=True)


@dataclass(frozen=True)
class Pruned:
    """A changeset the store removed, and why (``applied``, ``older than N days``, ``store full``)."""

    id: str
    state: ChangesetState
    created: datetime
    bytes: int
    why: str

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "created": self.created.isoformat(timespec="seconds")}


def prune(*, all_applied: bool = False, older_than_days: float | None = None, now: float | None = None) -> list[Pruned]:
    """What :func:`sweep` removes, every applied changeset too (``all_applied``) and every one kept
    more than ``older_than_days`` ago; what was removed. One being applied is left alone."""
    now = time.time() if now is None else now
    pruned = []
    for kept in _all():
        why = _prune_reason(kept, now, all_applied, older_than_days)
        found = _pruned(kept, why) if why is not None else None  # its size, before it goes
        if found is not None and _remove_unless_busy(kept.path):
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
    return [kept.id for kept in listing(workspace) if _remove_unless_busy(kept.path)]


def _all() -> list[Kept]:
    """Every readable kept changeset, oldest first, without sweeping."""
    found = []
    with contextlib.suppress(OSError):
        for name in sorted(p.name for p in store().iterdir() if ID.match(p.name)):
            with contextlib.suppress(InvalidArgument):
                found.append(_read(name))
    return sorted(found, key=lambda k: k.created)


def _pruned(kept: Kept, why: str) -> Pruned:
    return Pruned(kept.id, kept.state, kept.created, datadir.tree_bytes(kept.path), why)


# -- keeping --------------------------------------------------------------------------------------


def _keep(
    tree: CopyTree,
    changeset: Changeset,
    source: ChangesetSource,
    profile: str,
    backend: str,
    limit: int,
    environment: tuple[str, ...] = (),
    giving_up: bool = False,
) -> Kept:
    sweep()
    budget = _Budget.of_store(limit, changeset)
    changeset_id = f"ch-{uuid.uuid4().hex[:12]}"
    partial = store() / f".partial-{owners.owner_tag()}-{changeset_id[3:]}"
    created = datetime.now(UTC)
    with map_errors(f"cannot keep the changeset in {store()}"):
        partial.mkdir(mode=0o700)
        try:
            (partial / "tree").mkdir(mode=0o700)
            with _SourceDirs(tree, giving_up=giving_up) as sources:
                entries = [_keep_entry(sources, partial / "tree", change, budget) for change in changeset.changes]
            git = gitreview.summarise(tree.workspace, partial / "tree", [e.change for e in entries])
            kept = Kept(
                changeset_id,
                tree.workspace,
                created,
                source,
                profile,
                backend,
                entries,
                untracked=changeset.untracked,
                git=git,
                environment=list(environment),
                pruned=budget.pruned,
            )
            _write_manifest(partial, kept)
            os.rename(partial, store() / changeset_id)
        except BaseException:
            _remove(partial)
            raise
    return kept


@dataclass
class _Budget:
    """What the store may still take of one keep, so the data directory never fills past ``limit``."""

    limit: int
    used: int
    left: int

    pruned: list[Pruned] = field(default_factory=list)

    @classmethod
    def of_store(cls, limit: int, changeset: Changeset) -> _Budget:
        needed = sum(c.size or 0 for c in changeset.changes if _has_content(c) and c.applicable)
        pruned = _make_room(limit, needed) if needed <= limit else []
        used = _store_bytes()
        budget = cls(limit, used, limit - used, pruned)
        budget.take(needed)
        budget.left = limit - used  # the copy takes it again, byte by byte, as it writes
        return budget

    def take(self, size: int) -> None:
        if size > self.left:
            raise ToolFailed(
                f"the changeset is not kept: with it, kept changesets would pass limits.kept_changes "
                f"({self.limit} bytes; {self.used} already kept). Apply or discard kept changesets "
                "(sandbox changes), or raise the limit",
                errno="ENOSPC",
                limit=self.limit,
                used=self.used,
                needed=size,
                bound="limits.kept_changes",
            )
        self.left -= size


def _store_bytes() -> int:
    """The bytes of every file in the store: kept changesets and keeps under way."""
    return datadir.tree_bytes(store())


def _make_room(limit: int, needed: int) -> list[Pruned]:
    """Prune until ``needed`` more bytes fit under ``limit``: applied changesets first, then the
    oldest kept ones (a new changeset is worth more than one two weeks old nobody looked at)."""
    used = _store_bytes()
    pruned: list[Pruned] = []
    if used + needed <= limit:
        return pruned
    ranked = sorted(_all(), key=lambda k: (k.state != "applied", k.created))
    for kept in ranked:
        found = _pruned(
            kept, "applied; the store was full" if kept.state == "applied" else "oldest; the store was full"
        )
        if _remove_unless_busy(kept.path):
            pruned.append(found)
            used -= found.bytes
        if used + needed <= limit:
            break
    return pruned


def _keep_entry(sources: _SourceDirs, kept_root: Path, change: Change, budget: _Budget) -> Entry:
    entry = Entry(replace(change, flags=list(change.flags)), sources.host.get(change.path))
    if not (_has_content(change) and change.applicable):
        return entry
    try:
        digest = _copy_out(sources, kept_root, change.path, budget)
    except (OSError, Conflict) as exc:
        reason = exc.message if isinstance(exc, Conflict) else exc.strerror or str(exc)
        entry.change.applicable, entry.change.reason = False, f"could not be kept: {reason}"
        return entry
    if change.sha256 is not None and digest != change.sha256:
        raise Conflict(f"{change.path} changed in the private tree after its changeset was read", path=change.path)
    entry.change.sha256 = digest
    return entry


def _copy_out(sources: _SourceDirs, kept_root: Path, rel: str, budget: _Budget) -> str:
    """Copy the private tree's file ``rel`` (no link followed) to ``kept_root/rel``; its hash."""
    parts = PurePosixPath(rel).parts
    target = kept_root.joinpath(*parts)
    target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    digest = hashlib.sha256()
    taken = sources.take(parts, target)
    if taken is not None:
        return _hash(taken, digest, budget)
    src = sources.open(parts)
    try:
        if not stat.S_ISREG(os.fstat(src).st_mode):
            raise OSError(0, "no longer a regular file")
        dst = os.open(target, _new_file_flags(), 0o600)
        try:
            while chunk := os.read(src, _CHUNK):
                budget.take(len(chunk))  # the file may have grown since its changeset was read
                digest.update(chunk)
                os.write(dst, chunk)
        finally:
            os.close(dst)
    finally:
        os.close(src)
    return digest.hexdigest()


def _hash(fd: int, digest: Any, budget: _Budget) -> str:
    """The SHA-256 of the file open as ``fd`` (closed here), counted against the store's budget."""
    try:
        while chunk := os.read(fd, _CHUNK):
            budget.take(len(chunk))
            digest.update(chunk)
    finally:
        os.close(fd)
    return str(digest.hexdigest())


class _SourceDirs:
    """The private tree's files, each opened without following a link at any component (POSIX: a
    directory fd at a time). The directory fds along the last file's path are kept for the next
    (a changeset lists a directory's files together): a keep of 2,000 files in a deep ``.venv``
    opens each directory once, not each component of each file's path again.

    ``giving_up``: the tree is removed right after the keep (``sandbox run``: its call is over, its
    tree killed): a file is moved into the store rather than copied (:meth:`take`)."""

    def __init__(self, tree: CopyTree, *, giving_up: bool = False) -> None:
        self.root, self.host = tree.root, tree.host
        self.giving_up = giving_up and not WINDOWS and not isinstance(tree, OverlayTree)
        self._names: list[str] = []
        self._fds: list[int] = []

    def take(self, parts: tuple[str, ...], target: Path) -> int | None:
        """Move the file ``parts`` to ``target`` in the store and return an fd of it there (ours,
        ``0600``); ``None`` when it must be copied instead: the tree is kept, the file has other
        links (one of them could still change it), another filesystem, or not ours to make private."""
        if not self.giving_up:
            return None
        pfd = self._parent(parts[:-1])
        try:
            st = os.stat(parts[-1], dir_fd=pfd, follow_symlinks=False)
            if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
                return None
            if st.st_uid != os.geteuid() and os.geteuid() != 0:
                return None  # not ours to make private (a rootless engine's subordinate uid)
            os.rename(parts[-1], target, src_dir_fd=pfd)
        except OSError:
            return None  # EXDEV, a vanished file: the copy says what is wrong
        fd = os.open(target, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
                raise OSError(0, "it gained another link while it was kept")
            if st.st_uid != os.geteuid():
                os.fchown(fd, os.geteuid(), os.getegid())  # root: a Docker jail's file becomes ours
            os.fchmod(fd, 0o600)
        except OSError:
            os.close(fd)
            raise
        return fd

    def open(self, parts: tuple[str, ...]) -> int:
        """An fd of the file ``parts``, read-only."""
        if WINDOWS:
            return _open_windows_source(self.root, parts)
        return os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=self._parent(parts[:-1]))

    def _parent(self, parts: tuple[str, ...]) -> int:
        if not self._fds:
            self._fds.append(os.open(self.root, datadir.DIR_FLAGS))
        common = 0
        while common < min(len(parts), len(self._names)) and parts[common] == self._names[common]:
            common += 1
        for fd in self._fds[common + 1 :]:
            os.close(fd)
        del self._fds[common + 1 :], self._names[common:]
        for part in parts[common:]:
            try:
                fd = os.open(part, datadir.DIR_FLAGS, dir_fd=self._fds[-1])
            except OSError as exc:
                raise Conflict(f"parent {part!r} is not a directory inside the private tree") from exc
            self._fds.append(fd)
            self._names.append(part)
        return self._fds[-1]

    def __enter__(self) -> _SourceDirs:
        return self

    def __exit__(self, *exc: object) -> None:
        for fd in self._fds:
            os.close(fd)
        self._fds.clear()
        self._names.clear()


def _open_windows_source(root: Path, parts: tuple[str, ...]) -> int:
    path = root
    for part in parts[:-1]:
        path = path / part
        st = os.lstat(path)
        if not stat.S_ISDIR(st.st_mode) or getattr(st, "st_file_attributes", 0) & 0x400:
            raise Conflict(f"parent {part!r} is not a directory inside the private tree")
    return open_unfollowed(path / parts[-1])


def _new_file_flags() -> int:
    if WINDOWS:
        return os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)
    return os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def _has_content(change: Change) -> bool:
    return change.kind == "file" and change.status != "deleted"


# -- the manifest and its lock ----------------------------------------------------------------------


def _read(changeset_id: str) -> Kept:
    if not ID.match(changeset_id):
        raise InvalidArgument(f"not a changeset id: {changeset_id!r} (ch- and 12 hex digits)")
    try:
        data = json.loads((store() / changeset_id / MANIFEST).read_text(encoding="utf-8"))
        return _from_manifest(data)
    except FileNotFoundError:
        raise InvalidArgument(f"no kept changeset {changeset_id}", changeset=changeset_id) from None
    except (OSError, ValueError, TypeError, KeyError) as exc:
        raise InvalidArgument(f"the manifest of {changeset_id} is unreadable: {exc}", changeset=changeset_id) from exc


def _from_manifest(data: dict[str, Any]) -> Kept:
    if data.get("format") != FORMAT:
        raise ValueError(f"unknown manifest format {data.get('format')!r}")
    return Kept(
        data["id"],
        Path(data["workspace"]),
        datetime.fromisoformat(data["created"]),
        data["source"],
        data["profile"],
        data["backend"],
        [Entry.from_dict(e) for e in data["changes"]],
        data["state"],
        list(data.get("untracked", [])),
        GitSummary.from_dict(data["git"]) if data.get("git") else None,
        list(data.get("environment", [])),
    )


def _write_manifest(directory: Path, kept: Kept) -> None:
    tmp = directory / f".{MANIFEST}.{uuid.uuid4().hex[:8]}"
    with open(tmp, "x", encoding="utf-8") as fh:
        fh.write(json.dumps(kept.to_dict()))  # dumps, not dump: the C encoder (a 14,000-entry manifest)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, directory / MANIFEST)


@contextlib.contextmanager
def _exclusive(path: Path) -> Iterator[None]:
    """Hold the changeset's lock, or refuse at once: one apply or discard at a time."""
    if sys.platform == "win32":
        with _exclusive_windows(path):
            yield
        return
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise InvalidArgument(f"no kept changeset {path.name}", changeset=path.name) from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise Conflict(f"{path.name} is being applied or discarded right now", changeset=path.name) from None
        yield
    finally:
        os.close(fd)


@contextlib.contextmanager
def _exclusive_windows(path: Path) -> Iterator[None]:
    """:func:`_exclusive` on Windows: a byte lock on ``.lock-<id>`` beside the changeset (a file
    held open inside it would keep a discard from removing the directory)."""
    if not path.is_dir():
        raise InvalidArgument(f"no kept changeset {path.name}", changeset=path.name)
    lock = path.parent / f".lock-{path.name}"
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        if sys.platform == "win32":
            import msvcrt

            try:
                msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
            except OSError:
                raise Conflict(f"{path.name} is being applied or discarded right now", changeset=path.name) from None
        yield
    finally:
        os.close(fd)
        if not path.exists():
            with contextlib.suppress(OSError):
                lock.unlink()


# -- diffs ----------------------------------------------------------------------------------------


def _entry_diff(kept: Kept, entry: Entry, deadline: float) -> str:
    change = entry.change
    notes = [f"[{', '.join(change.flags)}]"] if change.flags else []
    if entry.applied:
        notes.append("(applied)")
    if not change.applicable:
        notes.append(f"(never applied: {change.reason})")
    lines = [" ".join([change.status, change.path, *notes])]
    if change.mode_before is not None and change.mode_after is not None and change.mode_before != change.mode_after:
        lines.append(f"mode {oct(change.mode_before)} → {oct(change.mode_after)}")
    lines += _body(kept, change, deadline)
    return "\n".join(textsafe.printable_lines(lines)) + "\n"  # a name or a line cannot forge another


def _body(kept: Kept, change: Change, deadline: float) -> list[str]:
    if change.kind == "dir":
        return []
    if change.kind == "symlink":
        note = f" ({change.note})" if change.note else ""  # a system link to a file this host lacks
        return [] if change.status == "deleted" else [f"symlink → {change.target}{note}"]
    if change.kind == "special":
        return ["special file"]
    before = _blob(kept.workspace / change.path)
    after = None if change.status == "deleted" else _blob(kept.path / "tree" / change.path)
    return _file_diff(change.path, before, after, deadline)


Blob = tuple[int, bytes]
"""A file's size and its first ``_DIFF_MAX + 1`` bytes."""


def _file_diff(path: str, before: Blob | None, after: Blob | None, deadline: float | None = None) -> list[str]:
    """The unified diff of one file, or a line that sums it up: binary, or too costly to compare
    (:mod:`sandbox.diffbound`: a jail chooses both sides, and difflib is quadratic at worst)."""
    old, new = _text(before), _text(after)
    if old is None or new is None:
        return [f"binary file, {_size(before)} bytes → {_size(after)} bytes"]
    try:
        diff = diffbound.unified(
            old.splitlines(keepends=True),
            new.splitlines(keepends=True),
            f"a/{path}" if before is not None else "/dev/null",
            f"b/{path}" if after is not None else "/dev/null",
            deadline=deadline,
        )
    except diffbound.TooCostly as exc:
        return [f"text file, {_size(before)} bytes → {_size(after)} bytes: {exc.summary()}"]
    return [line.rstrip("\n") for line in diff]


def _text(blob: Blob | None) -> str | None:
    """The content as text; ``None`` when binary or too large to diff (absent is empty)."""
    if blob is None:
        return ""
    size, data = blob
    if size > _DIFF_MAX or b"\0" in data[:8192]:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _size(blob: Blob | None) -> int:
    return 0 if blob is None else blob[0]


def _blob(path: Path) -> Blob | None:
    """The regular file ``path`` names (its last component not followed); ``None`` when there is none."""
    try:
        fd = open_unfollowed(path) if WINDOWS else os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fd)
        return (st.st_size, fh.read(_DIFF_MAX + 1)) if stat.S_ISREG(st.st_mode) else None


def _normalised(paths: Iterable[str] | None) -> set[str] | None:
    if paths is None:
        return None
    return {PurePosixPath(p).as_posix().rstrip("/") for p in paths}
