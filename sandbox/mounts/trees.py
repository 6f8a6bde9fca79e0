"""The private trees a jail writes to instead of the workspace: a copy, or an overlay.

:class:`CopyTree` copies the workspace in (``cp -a --reflink``, or Python's copy on Windows),
reports what the jail did (:meth:`CopyTree.changes`) and brings approved changes back as one unit
through the journal (:mod:`sandbox.mounts.journal`), or the Windows planner
(:mod:`sandbox.mounts.winapply`); :class:`OverlayTree` mounts an overlay instead of copying.
Their baselines are written to the data directory, so a killed executor's work can be recovered.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import anyio

from sandbox import datadir
from sandbox.errors import Conflict, InvalidArgument, ToolFailed, map_errors
from sandbox.mounts import applyplan, envdirs, journal, winapply
from sandbox.threads import off_loop

if TYPE_CHECKING:
    from collections.abc import Iterable

    from sandbox.vocabulary import ChangeStatus as Status
    from sandbox.vocabulary import EntryKind as Kind
from sandbox.mounts.changeset import ApplyReport, Change, Changeset, selected
from sandbox.mounts.flags import change_flags, windows_unsafe
from sandbox.mounts.hostfs import (
    baseline_file,
    copy_attributes,
    copy_tree_windows,
    is_opaque,
    is_whiteout,
    mount_point,
    private_tree_name,
    remove_private_tree,
    run_command,
)
from sandbox.mounts.links import judge_link
from sandbox.mounts.stamps import WINDOWS, Stamp, same_content, sha256_file, under, untracked_paths, walk

_T = TypeVar("_T", bound="CopyTree")


class CopyTree:
    """A private copy of a workspace that a jail writes to instead of the workspace.

    Its baselines (the workspace's and the copy's stamps as copied in) are also written to the data
    directory (:meth:`baseline_file`, outside the copy: no jail reaches it), so the work of an executor that
    was killed can still be read as a changeset (:meth:`recovered`, ``sandbox gc``)."""

    recoverable = True  # a copy whose tree here is what the jail wrote (not a remote engine's)
    snapshots = True  # its tree here is the jail's view: a session snapshot reads it (sandbox.snapshots)

    def __init__(self, workspace: Path, root: Path, exclude: Iterable[str] = ()) -> None:
        self.workspace = workspace
        self.root = root
        self.exclude = tuple(exclude)
        self.untracked: list[str] = []  # the excluded paths found: the jail binds them read-only
        self.host: dict[str, Stamp] = {}
        self.copy: dict[str, Stamp] = {}
        self.bytes_copied = 0
        self.environment_cache = False  # seed environment directories from sandbox.mounts.envdirs' cache
        self.seeded: list[str] = []  # the directories seeded: not in the baseline (the host has none)
        self.environment: tuple[str, ...] = ()  # the profile's mount.environment, for a recovered changeset
        self.pinned: set[str] = set()  # host stamps taken from a snapshot (adopt_host): never re-read

    @classmethod
    async def prepare(
        cls,
        workspace: Path,
        parent: Path | None = None,
        exclude: Iterable[str] = (),
        *,
        environment_cache: bool = False,
        environment: Iterable[str] = (),
    ) -> CopyTree:
        base = parent or datadir.subdir("copies")
        tree = cls(workspace, base / private_tree_name("copy"), exclude)
        tree.environment_cache = environment_cache
        tree.environment = tuple(environment)
        return await _set_up(tree, "_copy_in")

    def _copy_in(self) -> None:
        with map_errors(f"cannot copy the workspace {self.workspace}"):
            self.untracked = untracked_paths(self.workspace, self.exclude)
            self.host = dict(walk(self.workspace, set(self.untracked)))
            self.root.mkdir(mode=0o700)
            result = self._copy_level("", set(self.untracked))
            if result:
                raise ToolFailed(f"copying the workspace failed: {result}", workspace=str(self.workspace))
            os.chmod(self.root, 0o700)  # cp -a gave it the workspace's mode: the private tree stays ours
            self.copy = dict(walk(self.root))
            self.bytes_copied = sum(s.size for s in self.copy.values() if s.kind == "file")
            if self.environment_cache:  # after the baseline: what is seeded is added, as the host sees it
                self.seeded = envdirs.seed(self.workspace, self.root)
            self._save_baseline()

    @staticmethod
    def baseline_file(root: Path) -> Path:
        """Where the baselines of the copy ``root`` are kept (:func:`~sandbox.mounts.hostfs.baseline_file`)."""
        return baseline_file(root)

    def _save_baseline(self) -> None:
        if not self.recoverable:
            return
        data = {
            "workspace": str(self.workspace),
            "exclude": list(self.exclude),
            "untracked": self.untracked,
            "seeded": self.seeded,
            "environment": list(self.environment),
            "host": {rel: st.values() for rel, st in self.host.items()},
            "copy": {rel: st.values() for rel, st in self.copy.items()},
        }
        path = self.baseline_file(self.root)
        temp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}")
        temp.write_text(json.dumps(data), encoding="utf-8")
        os.replace(temp, path)

    @classmethod
    def recovered(cls, root: Path) -> CopyTree | None:
        """The copy at ``root`` with its saved baselines; ``None`` when there are none."""
        try:
            data = json.loads(cls.baseline_file(root).read_text(encoding="utf-8"))
            tree = cls(Path(data["workspace"]), root, data["exclude"])
            tree.untracked, tree.seeded = list(data["untracked"]), list(data["seeded"])
            tree.environment = tuple(data["environment"])
            tree.host = {rel: Stamp(*values) for rel, values in data["host"].items()}
            tree.copy = {rel: Stamp(*values) for rel, values in data["copy"].items()}
        except (OSError, ValueError, KeyError, TypeError):
            return None
        return tree

    def _copy_level(self, rel: str, untracked: set[str]) -> str:
        """Copy ``rel``'s entries; ``""`` when done, else why not.

        cp -a keeps modes, times, symlinks (unfollowed) and hardlinks; --reflink makes the copy
        O(1) per file on filesystems that share extents. Only a directory holding an untracked
        path is copied entry by entry, and the untracked path itself becomes an empty mount point
        (made now, so the changeset's baseline has it and the jail's bind creates nothing).
        """
        source, target = self.workspace / rel, self.root / rel
        if WINDOWS:  # no cp there; and no bind for an untracked path: winjob copies them all
            copy_tree_windows(source, target)
            return ""
        if not untracked:
            return run_command(["cp", "-a", "--reflink=auto", f"{source}/.", str(target)])
        whole: list[str] = []
        for entry in sorted(os.scandir(source), key=lambda e: e.name):
            path = f"{rel}/{entry.name}" if rel else entry.name
            if path in untracked:
                mount_point(entry, target / entry.name)
            elif any(u.startswith(f"{path}/") for u in untracked):
                (target / entry.name).mkdir(mode=0o700)
                inner = {u for u in untracked if u.startswith(f"{path}/")}
                if failed := self._copy_level(path, inner):
                    return failed
            else:
                whole.append(entry.path)
        failed = run_command(["cp", "-a", "--reflink=auto", "--", *whole, str(target)]) if whole else ""
        copy_attributes(source, target)
        return failed

    def hand_to(self, uid: int, gid: int) -> None:
        """Give the private copy to the jail's uid (we are root, it is not) and re-baseline.

        chown moves every entry's ctime, so the snapshot the changeset compares against is taken
        again afterwards: the chown is ours, not the jail's.
        """
        if os.geteuid() != 0 or (self.root.stat().st_uid, self.root.stat().st_gid) == (uid, gid):
            return
        with map_errors("cannot hand the private copy to the jail's user"):
            os.chown(self.root, uid, gid)
            for rel, _stamp in walk(self.root):
                os.chown(self.root / rel, uid, gid, follow_symlinks=False)
            self.copy = {rel: st for rel, st in walk(self.root) if not under(rel, self.seeded)}
            self._save_baseline()

    async def changes(self) -> Changeset:
        return self._untracked_out(await off_loop(self._changes))

    def _untracked_out(self, changeset: Changeset) -> Changeset:
        """No change under an untracked path is the jail's to report (their mount points included)."""
        changeset.changes = [c for c in changeset.changes if not under(c.path, self.untracked)]
        changeset.untracked = list(self.untracked)
        return changeset

    def _changes(self) -> Changeset:
        with map_errors("cannot read the private copy"):
            now = dict(walk(self.root))
        result = Changeset()
        for rel in sorted(set(now) | set(self.copy)):
            change = self._compare(rel, self.copy.get(rel), now.get(rel))
            if change is not None:
                result.changes.append(change)
        return result

    def _compare(self, rel: str, before: Stamp | None, after: Stamp | None) -> Change | None:
        if before is not None and after is not None and before.same_version(after):
            return None
        if WINDOWS and (unsafe := windows_unsafe(rel, before, after)) is not None:
            return unsafe
        if after is None:
            assert before is not None
            return self._change(rel, "deleted", before.kind, before, None)
        if before is None or before.kind != after.kind:
            return self._change(rel, "added" if before is None else "modified", after.kind, before, after)
        if after.kind == "dir" and after.mode == before.mode:
            return None
        if after.kind == "symlink" and after.target == before.target:
            return None
        if (
            after.kind == "file"
            and after.mode == before.mode
            and after.size == before.size
            and same_content(self.root / rel, self.workspace / rel)
        ):
            return None
        return self._change(rel, "modified", after.kind, before, after)

    def _change(self, rel: str, status: Status, kind: Kind, before: Stamp | None, after: Stamp | None) -> Change:
        flags = change_flags(rel, kind, before, after, self.workspace)
        change = Change(rel, status, kind, flags, before.mode if before else None, after.mode if after else None)
        if after is not None:
            change.size = after.size
            change.target = after.target
            if kind == "file":
                with contextlib.suppress(OSError):
                    change.sha256 = sha256_file(self.root / rel)
        if after is not None and after.kind == "symlink" and after.target is not None:
            self._judge_link(change, after.target)
        if "special-file" in flags:
            change.applicable, change.reason = False, "FIFOs, sockets and devices never leave the jail"
        elif "symlink-outside" in flags:
            change.applicable, change.reason = False, "the symlink points outside the workspace"
        return change

    def _judge_link(self, change: Change, target: str) -> None:
        """The link judged again in the private tree's view, through the tree's own links as the jail
        left them (the host's view is :func:`mode_flags`'s): outside in either view is outside, and
        a system link in both may name a file this host lacks (an image's), which the review says."""
        verdict, missing = judge_link(change.path, target, self.workspace, self.root)
        if verdict == "outside" or "symlink-outside" in change.flags:
            change.flags[:] = [f for f in change.flags if f != "system-link"]
            if "symlink-outside" not in change.flags:
                change.flags.append("symlink-outside")
        elif verdict == "system" and "system-link" not in change.flags:
            change.flags.append("system-link")
        if "system-link" in change.flags and missing:
            change.note = f"points to {missing}, which this host does not have"

    async def apply(
        self, changeset: Changeset, paths: Iterable[str] | None = None, *, include_flagged: bool = False
    ) -> ApplyReport:
        named = set(paths) if paths is not None else None
        return await off_loop(self._apply, changeset, named, include_flagged)

    def _apply(self, changeset: Changeset, only: set[str] | None, include_flagged: bool) -> ApplyReport:
        """Guard every change, then apply those that pass as one unit through a journal.

        A flagged change is held back unless named in ``only`` or ``include_flagged`` (consent).
        An interrupted apply to this workspace is recovered first. See :mod:`sandbox.mounts.journal`.
        """
        if WINDOWS:
            return winapply.apply(self, changeset, only, include_flagged)

        with journal.locked(self.workspace):
            journal.recover_locked(self.workspace)
            plan = applyplan.Plan(self)
            for change in selected(changeset, only, include_flagged, plan.report):
                plan.add(change)
            kept_back = journal.execute(self.workspace, plan.steps)
        report = plan.report
        lost = {p["path"] for p in kept_back}
        report.applied += [p for step in plan.steps for p in step.paths if p not in lost]
        report.conflicts += kept_back
        return report

    def guard_stamp(self, change: Change, current: Stamp | None) -> None:
        """:meth:`_guard` once the host entry is read: ``current`` (``None``: absent) against copy-in."""
        original = self.host.get(change.path)
        if original is None:
            if current is not None and not (change.kind == "dir" and current.kind == "dir"):
                raise Conflict("the host created this path since copy-in")
            return
        if current is None or current.kind != original.kind:
            raise Conflict("the host entry changed since copy-in")
        if original.kind == "dir":
            # A directory's times move whenever an entry in it does (our own applies included).
            if (current.dev, current.ino) != (original.dev, original.ino):
                raise Conflict("the host directory was replaced since copy-in")
            return
        if not original.same_version(current) or current.mtime_ns != original.mtime_ns:
            raise Conflict("the host file changed since copy-in")

    def adopt_host(self, stamps: dict[str, list[Any] | None]) -> None:
        """The host as a snapshot's session found these paths (``None``: absent), for the apply's
        guard of a tree started from that snapshot: a host edit since is a conflict, as in the session."""
        for rel, values in stamps.items():
            if values is None:
                self.host.pop(rel, None)
            else:
                self.host[rel] = Stamp(*values)
        self.pinned.update(stamps)
        self._save_baseline()

    def remove(self) -> None:
        remove_private_tree(self.root)


async def _set_up(tree: _T, step: str) -> _T:
    """Run a tree's (blocking) setup in a thread; on any failure leave nothing behind."""
    try:
        await off_loop(getattr(tree, step))
    except BaseException:
        with anyio.CancelScope(shield=True):
            await off_loop(tree.remove)
        raise
    return tree


def _is_whiteout(path: Path, stamp: Stamp) -> bool:
    return stamp.kind == "special" and is_whiteout(path)


def overlay_support() -> str | None:
    """``None`` when this host can mount an overlay for a jail, else why not."""
    if os.geteuid() != 0:
        return "mounting an overlay needs root here (or bubblewrap >= 0.9 with --overlay)"
    try:
        with open("/proc/filesystems", encoding="utf-8") as fh:
            if not any(line.split()[-1:] == ["overlay"] for line in fh):
                return "the kernel has no overlay filesystem"
    except OSError as exc:
        return f"cannot read /proc/filesystems: {exc.strerror}"
    if shutil.which("mount") is None or shutil.which("umount") is None:
        return "mount(8) is not installed"
    return None


class OverlayTree(CopyTree):
    """A copy-on-write view of the workspace: the jail writes to an upper dir, setup is O(1).

    The merged view is mounted at ``root`` (so ``apply`` reads changed files from it as from a
    copy); the changeset is read from the upper dir, whose whiteouts are deletions. The host
    workspace is the live lower layer, so the apply guard is the host file's fingerprint when
    the changeset was computed: a file the host changes after review is refused with CONFLICT.
    """

    recoverable = False  # its changes are an upper directory's, read against the mounted view

    def __init__(self, workspace: Path, base: Path) -> None:
        super().__init__(workspace, base / "merged")
        self.base = base
        self.upper = base / "upper"
        self.mounted = False

    @classmethod
    async def prepare(
        cls,
        workspace: Path,
        parent: Path | None = None,
        exclude: Iterable[str] = (),
        *,
        environment_cache: bool = False,
        environment: Iterable[str] = (),
    ) -> OverlayTree:
        del environment_cache, environment  # copies only: an overlay's upper dir is its changeset, never recovered
        reason = overlay_support()
        if reason:
            raise InvalidArgument(f"overlay mount unavailable: {reason}")
        if any(c in str(workspace) for c in ",:\\"):
            raise InvalidArgument(f"overlay cannot mount a workspace whose path has ',' ':' or '\\': {workspace}")
        base = (parent or datadir.subdir("copies")) / private_tree_name("overlay")
        tree = cls(workspace, base)
        # The merged view shows the host's entries already: they only need binding read-only.
        tree.untracked = await off_loop(untracked_paths, workspace, exclude)
        return await _set_up(tree, "_mount")

    def _mount(self) -> None:
        with map_errors("cannot prepare the overlay"):
            for sub in ("upper", "work", "merged"):
                (self.base / sub).mkdir(parents=True, mode=0o700)
            opts = f"lowerdir={self.workspace},upperdir={self.upper},workdir={self.base / 'work'}"
            error = run_command(["mount", "-t", "overlay", "overlay", "-o", opts, str(self.root)])
            if error:
                raise ToolFailed(f"mounting the overlay failed: {error}", workspace=str(self.workspace))
            self.mounted = True

    def _changes(self) -> Changeset:
        found: dict[str, Change] = {}
        with map_errors("cannot read the overlay's upper layer"):
            for rel, up in walk(self.upper, set(self.untracked)):
                for change in self._overlay_changes(rel, up):
                    found[change.path] = change
        for rel in found:
            self._remember_host(rel)
        return Changeset([found[rel] for rel in sorted(found)])

    def _overlay_changes(self, rel: str, up: Stamp) -> list[Change]:
        try:
            before: Stamp | None = Stamp.of(self.workspace / rel)
        except FileNotFoundError:
            before = None
        if _is_whiteout(self.upper / rel, up):
            if before is None:
                return []
            return [*self._host_descendants_gone(rel), self._change(rel, "deleted", before.kind, before, None)]
        after = Stamp.of(self.root / rel)
        changes = []
        if before is None:
            changes.append(self._change(rel, "added", after.kind, None, after))
        elif (change := self._compare(rel, before, after)) is not None:
            changes.append(change)
        if up.kind == "dir" and before is not None and before.kind == "dir" and is_opaque(self.upper / rel):
            changes += self._host_descendants_gone(rel)
        return changes

    def _host_descendants_gone(self, rel: str) -> list[Change]:
        """A deleted or replaced (opaque) directory hides all of the host's entries below it."""
        gone = []
        host_dir = self.workspace / rel
        if not host_dir.is_dir() or host_dir.is_symlink():
            return []
        for sub, stamp in walk(host_dir):
            path = f"{rel}/{sub}"
            if not os.path.lexists(self.root / path):
                gone.append(self._change(path, "deleted", stamp.kind, stamp, None))
        return gone

    def _remember_host(self, rel: str) -> None:
        if rel in self.pinned:  # as the snapshot's session found it: a host edit since is a conflict
            return
        with contextlib.suppress(OSError):
            self.host[rel] = Stamp.of(self.workspace / rel)

    def remove(self) -> None:
        self.mounted = False
        remove_private_tree(self.base)
