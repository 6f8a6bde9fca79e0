"""Session snapshots: a session's whole file state by id, kept in the data directory (issue 39).

A snapshot is a directory of the store: ``layer/`` (the session's delta over its workspace,
:mod:`sandbox.mounts.layers`), ``scratch/`` (a copy of the session's scratch directory) and
``manifest.json`` (the workspace by path, device and inode; the lineage; the settings later calls
depend on; the delta's deleted and replaced paths with each path's host stamp). Nothing in it is a
process: restoring or forking starts a new jail over the files. Made in a ``.partial`` directory
and renamed whole, so a killed executor leaves no half snapshot that a restore could take.

Not to be confused with the per-file **review snapshots** of Write and Edit
(:mod:`sandbox.review`), which one file's rollback undoes.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sandbox import datadir
from sandbox.errors import Conflict, InvalidArgument, map_errors
from sandbox.mounts import layers
from sandbox.mounts.stamps import sha256_file

if TYPE_CHECKING:
    from collections.abc import Callable

    from sandbox.mounts.trees import CopyTree

ID = re.compile(r"^snap-[0-9a-f]{16}$")
MANIFEST = "manifest.json"
PARTIAL = ".partial"
RETENTION_S = 7 * 24 * 3600  # after the snapshot was last taken, restored or forked from


def store() -> Path:
    return datadir.subdir("snapshots")


@dataclass
class Snapshot:
    """One snapshot's manifest; ``path`` its directory in the store."""

    id: str
    workspace: str
    device: int
    inode: int
    lineage: str  # the session that began the line: restores stay in it
    session_id: str
    created: float
    kind: str  # "layers" (an overlay's upper directory) or "scan" (a copy's scan)
    backend: str
    mount: str
    parent: str | None
    settings: dict[str, Any]
    delta: layers.Delta
    scratch_bytes: int = 0
    took_ms: float = 0.0
    path: Path = field(default_factory=Path)

    @property
    def layer(self) -> Path:
        return self.path / "layer"

    @property
    def scratch(self) -> Path:
        return self.path / "scratch"

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "workspace": self.workspace,
            "device": self.device,
            "inode": self.inode,
            "lineage": self.lineage,
            "session_id": self.session_id,
            "created": self.created,
            "kind": self.kind,
            "backend": self.backend,
            "mount": self.mount,
            "parent": self.parent,
            "settings": self.settings,
            "delta": self.delta.to_dict(),
            "scratch_bytes": self.scratch_bytes,
            "took_ms": self.took_ms,
        }

    def describe(self) -> dict[str, Any]:
        """What ``sandbox snapshot list`` and ``show`` print (``show`` adds the paths)."""
        data = {k: v for k, v in self.to_dict().items() if k not in ("delta", "device", "inode")}
        return {
            **data,
            "changed": len(self.delta.present),
            "deleted": len(self.delta.deleted) + len(self.delta.replaced),
            "bytes": self.delta.bytes + self.scratch_bytes,
        }

    def check_workspace(self, workspace: Path) -> None:
        """INVALID_ARGUMENT unless ``workspace`` is the directory this snapshot was taken of."""
        st = os.stat(workspace)
        same = os.path.realpath(workspace) == self.workspace and (st.st_dev, st.st_ino) == (self.device, self.inode)
        if not same:
            raise InvalidArgument(
                f"snapshot {self.id} belongs to the workspace {self.workspace}, not {workspace}",
                snapshot_id=self.id,
                workspace=str(workspace),
            )

    def check_host(self, workspace: Path, *, force: bool = False) -> list[str]:
        """CONFLICT when the host changed a path of the snapshot since the session found it (a restore
        would hide the host's edit); with ``force`` the paths are returned for the apply to refuse."""
        changed = layers.host_changed(workspace, self.delta)
        if changed and not force:
            shown = ", ".join(changed[:10]) + (f" and {len(changed) - 10} more" if len(changed) > 10 else "")
            raise Conflict(
                f"the host changed {shown} since snapshot {self.id} was taken; restoring would hide the host's "
                "edit (force restores it all the same and leaves the conflict to the apply)",
                snapshot_id=self.id,
                paths=changed,
            )
        return changed

    def touch(self) -> None:
        with contextlib.suppress(OSError):
            os.utime(self.path / MANIFEST)


def read(snapshot_id: str) -> Snapshot:
    """The snapshot ``snapshot_id``; INVALID_ARGUMENT when there is none (or it is not one of ours)."""
    if not ID.match(snapshot_id or ""):
        raise InvalidArgument(f"not a snapshot id: {snapshot_id!r}", snapshot_id=snapshot_id)
    path = store() / snapshot_id
    try:
        data = json.loads((path / MANIFEST).read_text(encoding="utf-8"))
        delta = layers.Delta.from_dict(data.pop("delta"))
        snap = Snapshot(**data, delta=delta, path=path)
    except FileNotFoundError:
        raise InvalidArgument(f"no snapshot {snapshot_id}", snapshot_id=snapshot_id) from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise InvalidArgument(f"snapshot {snapshot_id} is unreadable: {exc}", snapshot_id=snapshot_id) from exc
    for rel in (*delta.deleted, *delta.replaced, *delta.present, *delta.host):
        layers.check_path(rel)
    return snap


def listing(workspace: Path | None = None) -> list[Snapshot]:
    """Every snapshot (of ``workspace`` only, when given), oldest first."""
    sweep()
    found = []
    with map_errors("cannot read the snapshot store"):
        names = sorted(p.name for p in store().iterdir() if ID.match(p.name))
    for name in names:
        with contextlib.suppress(InvalidArgument):
            found.append(read(name))
    if workspace is not None:
        wanted = os.path.realpath(workspace)
        found = [s for s in found if s.workspace == wanted]
    return sorted(found, key=lambda s: s.created)


def take(
    tree: CopyTree,
    scratch: Path | None,
    *,
    lineage: str,
    session_id: str,
    backend: str,
    mount: str,
    parent: str | None,
    settings: dict[str, Any],
    caps: tuple[int, int],
    leave_out: Callable[[str], bool] = lambda _rel: False,
) -> Snapshot:
    """Snapshot ``tree`` (and ``scratch``) into the store, without the paths ``leave_out`` names (the
    seal's); CONFLICT past a cap, nothing kept then."""
    started = time.monotonic()
    workspace = Path(os.path.realpath(tree.workspace))
    most, most_bytes = caps
    every = listing()
    mine = [s for s in every if s.workspace == str(workspace)]
    if len(mine) >= most:
        oldest = ", ".join(s.id for s in mine[:3])
        raise Conflict(
            f"the workspace already has {len(mine)} snapshots (limits.snapshots = {most}); discard some first "
            f"(sandbox snapshot discard ID; the oldest: {oldest})",
            cap="limits.snapshots",
            snapshots=[s.id for s in mine],
        )
    snapshot_id = f"snap-{uuid.uuid4().hex[:16]}"
    final = store() / snapshot_id
    partial = store() / f"{PARTIAL}-{snapshot_id}"
    try:
        partial.mkdir(mode=0o700)
        delta = layers.capture(tree, partial / "layer", leave_out)
        scratch_bytes = _copy_scratch(scratch, partial / "scratch")
        used = sum(s.delta.bytes + s.scratch_bytes for s in every)
        if used + delta.bytes + scratch_bytes > most_bytes:
            raise Conflict(
                f"the snapshots would hold {used + delta.bytes + scratch_bytes} bytes, past limits.snapshot_bytes "
                f"({most_bytes}); discard some first (sandbox snapshot discard ID)",
                cap="limits.snapshot_bytes",
                snapshots=[s.id for s in mine],
            )
        st = os.stat(workspace)
        snap = Snapshot(
            snapshot_id,
            str(workspace),
            st.st_dev,
            st.st_ino,
            lineage,
            session_id,
            time.time(),
            layers.kind(tree),
            backend,
            mount,
            parent,
            settings,
            delta,
            scratch_bytes,
            path=final,
        )
        snap.took_ms = round((time.monotonic() - started) * 1000, 3)
        with map_errors("cannot write the snapshot's manifest"):
            (partial / MANIFEST).write_text(json.dumps(snap.to_dict()), encoding="utf-8")
            os.rename(partial, final)
    except BaseException:
        _remove(partial)
        raise
    return snap


def _copy_scratch(scratch: Path | None, dest: Path) -> int:
    """The scratch directory's files, copied (never followed); their bytes."""
    dest.mkdir(mode=0o700)
    if scratch is None or not scratch.is_dir():
        return 0
    with map_errors("cannot snapshot the scratch directory"):
        shutil.copytree(scratch, dest, symlinks=True, dirs_exist_ok=True)
    return sum(p.stat().st_size for p in dest.rglob("*") if p.is_file() and not p.is_symlink())


def restore_scratch(snap: Snapshot, scratch: Path) -> None:
    """Make ``scratch`` hold what the snapshot's scratch held (and nothing else)."""
    with map_errors("cannot restore the scratch directory"):
        for entry in list(scratch.iterdir()):
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
        shutil.copytree(snap.scratch, scratch, symlinks=True, dirs_exist_ok=True)
        if os.geteuid() == 0:  # the scratch directory is the jail user's (a container's uid): so is what it holds
            owner = scratch.stat()
            for root, dirs, files in os.walk(scratch):
                for name in (*dirs, *files):
                    os.chown(os.path.join(root, name), owner.st_uid, owner.st_gid, follow_symlinks=False)


def discard(snapshot_id: str) -> Snapshot:
    snap = read(snapshot_id)
    _remove(snap.path)
    return snap


def diff(a: str, b: str) -> list[dict[str, Any]]:
    """How snapshot ``b``'s view differs from ``a``'s: each path either holds differently, with what
    it is in each (``host``: the workspace's own, ``deleted``, ``file sha256:…``, ``symlink -> …``, ``dir``)."""
    first, second = read(a), read(b)
    if first.workspace != second.workspace:
        raise InvalidArgument(f"{a} and {b} are snapshots of different workspaces", workspace=first.workspace)
    out = []
    for rel in sorted({*first.delta.paths(), *second.delta.paths()}):
        x, y = _state(first, rel), _state(second, rel)
        if x != y:
            out.append({"path": rel, "a": x, "b": y})
    return out


def _state(snap: Snapshot, rel: str) -> str:
    if rel in snap.delta.present:
        path = snap.layer / rel
        if path.is_symlink():
            return f"symlink -> {os.readlink(path)}"
        return f"file sha256:{sha256_file(path)}"
    if rel in snap.delta.deleted:
        return "deleted"
    if rel in snap.delta.replaced:
        return "dir (replaced)"
    for parent in snap.delta.deleted:
        if rel.startswith(f"{parent}/"):
            return "deleted"
    return "host"


def sweep(now: float | None = None) -> list[str]:
    """Remove snapshots unused for :data:`RETENTION_S` and what interrupted snapshots left."""
    now = time.time() if now is None else now
    removed = []
    try:
        entries = list(store().iterdir())
    except OSError:
        return []
    for entry in entries:
        try:
            stale = now - (entry / MANIFEST).stat().st_mtime > RETENTION_S
        except OSError:
            stale = entry.name.startswith(PARTIAL) and now - entry.stat().st_mtime > 3600
        if stale:
            _remove(entry)
            removed.append(entry.name)
    return removed


def _remove(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
