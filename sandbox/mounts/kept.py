"""A kept changeset: its entries, its manifest and lock, its review (diffs) and its guarded apply.

See :mod:`sandbox.changes` for the store as a whole; this module is the changeset itself
(:class:`Kept`, :class:`Entry`), where it lives (:func:`store`) and how it is read and written.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import stat
import sys
import time
import uuid
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

import anyio
import anyio.to_thread

from sandbox import datadir, diffbound, textsafe
from sandbox.errors import Conflict, InvalidArgument
from sandbox.mounts import applyplan, envdirs, gitreview
from sandbox.mounts.changeset import ApplyReport, Change, Changeset, apply_order, needs_consent, with_contents
from sandbox.mounts.gitreview import GitSummary
from sandbox.mounts.stamps import WINDOWS, Stamp, open_unfollowed, sha256_file
from sandbox.mounts.trees import CopyTree
from sandbox.threads import off_loop

if sys.platform != "win32":
    import fcntl

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator

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
        with exclusive(self.path):
            await off_loop(self._reload)
            named = self._with_environment(self._with_group(normalised(only)))
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
        with exclusive(self.path):
            remove_tree_dir(self.path)

    def _select(self, only: Iterable[str] | None) -> list[Entry]:
        named = normalised(only)
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
        report.held_back += [environment_held_back(root, held) for root, held in sorted(held_env.items())]
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

        plan = applyplan.Plan(self._tree())
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
            if has_content(change) and change.applicable:
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
        fresh = read_kept(self.id)
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
        write_manifest(self.path, self)


def held_back_line(held: dict[str, Any]) -> str:
    """A held-back entry as a review line; the git group with why it was held back whole."""
    flags = f"[{', '.join(held['flags'])}]"
    if held.get("group") is None:
        return f"{textsafe.printable(held['path'])} {flags}"
    if held["group"] == envdirs.GROUP:
        return textsafe.printable(held["summary"])
    return f"{held['path']} (the git group, {held['entries']} entries) {flags}: {'; '.join(held['risky'])}"


def environment_held_back(root: str, held: list[Entry]) -> dict[str, Any]:
    """An environment directory held back whole, as one item: its summary says how to ask for it."""
    flags = sorted({f for e in held for f in e.change.flags})
    line = envdirs.summarise((e.change for e in held), root).line()
    return {"path": root, "flags": flags, "group": envdirs.GROUP, "entries": len(held), "summary": line}


def store() -> Path:
    return datadir.subdir("changes")


def remove_tree_dir(path: Path) -> None:
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


def has_content(change: Change) -> bool:
    return change.kind == "file" and change.status != "deleted"


def read_kept(changeset_id: str) -> Kept:
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


def write_manifest(directory: Path, kept: Kept) -> None:
    tmp = directory / f".{MANIFEST}.{uuid.uuid4().hex[:8]}"
    with open(tmp, "x", encoding="utf-8") as fh:
        fh.write(json.dumps(kept.to_dict()))  # dumps, not dump: the C encoder (a 14,000-entry manifest)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, directory / MANIFEST)


@contextlib.contextmanager
def exclusive(path: Path) -> Iterator[None]:
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
    """:func:`exclusive` on Windows: a byte lock on ``.lock-<id>`` beside the changeset (a file
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
    return file_diff(change.path, before, after, deadline)


Blob = tuple[int, bytes]
"""A file's size and its first ``_DIFF_MAX + 1`` bytes."""


def file_diff(path: str, before: Blob | None, after: Blob | None, deadline: float | None = None) -> list[str]:
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


def normalised(paths: Iterable[str] | None) -> set[str] | None:
    if paths is None:
        return None
    return {PurePosixPath(p).as_posix().rstrip("/") for p in paths}
