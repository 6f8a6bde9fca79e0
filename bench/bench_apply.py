"""The price of an all-or-nothing apply: 3,000 changed files, per-file apply against the journal.

A workspace of ``BENCH_APPLY_FILES`` (3,000) files in 30 directories is copied in, and the private
copy gets 3,000 changes: 2,000 files modified, 500 deleted, 500 added (10 new directories). The
same changeset is then applied to fresh copies of the workspace by the per-file apply the
project had before the journal (kept below: the parts this workload uses) and by
:meth:`sandbox.mounts.CopyTree.apply` (guard all, stage, journal, commit, rename), alternating
rounds so the noise of a shared machine falls on both alike. Both fsync every file they write;
the journal adds its staging pass, two journal writes and the directory fsyncs.

Usage: ``python bench/bench_apply.py [--rounds N]``; prints the medians and the after/before
ratio. Timings are reported, never turned into a failure.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import stat
import statistics
import tempfile
import time
import uuid
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

import anyio

from sandbox.errors import Conflict
from sandbox.mounts import _CHUNK, _SPECIAL_BITS, ApplyReport, Changeset, CopyTree, _open_parent, _owner_for, walk

if TYPE_CHECKING:
    from sandbox.mounts import Change

FILES = int(os.environ.get("BENCH_APPLY_FILES", "3000"))
PER_DIR = 100


def say(text: str) -> None:
    print(text, flush=True)


# -- the apply as it was before the journal (sandbox/mounts.py at 6d2e579) ----------------------


def old_apply(tree: CopyTree, changeset: Changeset) -> ApplyReport:
    report = ApplyReport()
    ordered = sorted(changeset.changes, key=_old_order)
    for change in ordered:
        if not change.applicable:
            report.skipped.append({"path": change.path, "reason": change.reason})
            continue
        try:
            _old_apply_one(tree, change)
        except Conflict as exc:
            report.conflicts.append({"path": change.path, "reason": exc.message})
        except OSError as exc:
            report.skipped.append({"path": change.path, "reason": f"{exc.strerror or exc}"})
        else:
            report.applied.append(change.path)
    return report


def _old_order(change: Change) -> tuple[int, int, str]:
    depth = change.path.count("/")
    if change.status == "deleted":
        return (1, -depth, change.path)
    return (0, depth, change.path)


def _old_apply_one(tree: CopyTree, change: Change) -> None:
    parts = PurePosixPath(change.path).parts
    with _open_parent(tree.workspace, parts[:-1], create=change.status != "deleted") as pfd:
        tree._guard(change, pfd, parts[-1])
        if change.status == "deleted":
            if change.kind == "dir":
                os.rmdir(parts[-1], dir_fd=pfd)
            else:
                os.unlink(parts[-1], dir_fd=pfd)
        elif change.kind == "dir":
            _old_ensure_dir(pfd, parts[-1], (change.mode_after or 0o755) & ~_SPECIAL_BITS)
        else:
            _old_replace_file(pfd, parts[-1], tree.root / change.path, (change.mode_after or 0o644) & ~_SPECIAL_BITS)


def _old_replace_file(pfd: int, name: str, source: Path, mode: int) -> None:
    tmp = f".{name}.sandbox-{uuid.uuid4().hex[:8]}"
    src = os.open(source, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(src).st_mode):
            raise OSError(0, "the changed entry is no longer a regular file")
        dst = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=pfd)
        try:
            while chunk := os.read(src, _CHUNK):
                os.write(dst, chunk)
            owner = _owner_for(pfd, name)
            if owner is not None:
                os.fchown(dst, *owner)
            os.fchmod(dst, mode)
            os.fsync(dst)
        finally:
            os.close(dst)
        os.rename(tmp, name, src_dir_fd=pfd, dst_dir_fd=pfd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=pfd)
        raise
    finally:
        os.close(src)


def _old_ensure_dir(pfd: int, name: str, mode: int) -> None:
    with contextlib.suppress(FileExistsError):
        os.mkdir(name, mode, dir_fd=pfd)
    os.chmod(name, mode, dir_fd=pfd, follow_symlinks=False)


# -- the workload ---------------------------------------------------------------------------------


def make_workspace(root: Path) -> None:
    for index in range(FILES):
        path = root / f"d{index // PER_DIR:03d}" / f"f{index:05d}.txt"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"file {index}\n" * 20)


def edit(root: Path) -> None:
    """2/3 of the files modified, 1/6 deleted, as many added in new directories: FILES changes."""
    for index in range(FILES):
        path = root / f"d{index // PER_DIR:03d}" / f"f{index:05d}.txt"
        if index % 6 == 0:
            path.unlink()
        elif index % 6 != 1:
            path.write_text(f"changed {index}\n" * 20)
    for index in range(FILES // 6):
        path = root / f"new{index % 10}" / f"n{index:05d}.txt"
        path.parent.mkdir(exist_ok=True)
        path.write_text(f"added {index}\n")


async def prepare(base: Path) -> tuple[Path, CopyTree, Changeset]:
    original = base / "original"
    make_workspace(original)
    (base / "copies").mkdir()
    tree = await CopyTree.prepare(original, base / "copies")
    edit(tree.root)
    return original, tree, await tree.changes()


def timed(base: Path, original: Path, tree: CopyTree, changes: Changeset, journalled: bool, n: int) -> float:
    workspace = base / f"ws-{n}"
    shutil.copytree(original, workspace, symlinks=True)
    applying = CopyTree(workspace, tree.root)
    applying.host = dict(walk(workspace))
    os.sync()
    start = time.perf_counter()
    report = applying._apply(changes, None, False) if journalled else old_apply(applying, changes)
    elapsed = time.perf_counter() - start
    if report.conflicts or report.skipped or len(report.applied) != len(changes.changes):
        raise SystemExit(f"the apply did not apply everything: {report.conflicts[:3]} {report.skipped[:3]}")
    shutil.rmtree(workspace)
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="sandbox-bench-apply-") as tmp:
        base = Path(tmp)
        os.environ.setdefault("SANDBOX_DATA_DIR", str(base / "data"))
        original, tree, changes = anyio.run(prepare, base)
        say(f"{len(changes.changes)} changes ({changes.summary()}), {args.rounds} rounds each, alternating")
        before: list[float] = []
        after: list[float] = []
        for n in range(args.rounds):
            before.append(timed(base, original, tree, changes, False, 2 * n))
            after.append(timed(base, original, tree, changes, True, 2 * n + 1))
        b, a = statistics.median(before), statistics.median(after)
        say(f"per-file apply (before): median {b * 1000:8.1f} ms   rounds {[round(x * 1000) for x in before]}")
        say(f"journalled apply (after): median {a * 1000:8.1f} ms   rounds {[round(x * 1000) for x in after]}")
        say(f"ratio after/before: {a / b:.2f}")


if __name__ == "__main__":
    main()
