"""An apply SIGKILLed anywhere, then recovered: the workspace is exactly the old tree or the new one.

No jail is needed: a :class:`CopyTree` over temporary directories is applied by a child process
that the journal's test hook (``SANDBOX_JOURNAL_CRASH_AFTER=N``) kills after its N-th durable
operation, N drawn at random over the whole apply; the parent then recovers the workspace and
compares every entry's kind, mode and content hash (or link target) with both trees.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

import anyio
import pytest

from sandbox.mounts import CopyTree, journal, walk

if TYPE_CHECKING:
    from pathlib import Path

TRIALS = 100
CHILD = """
import json, sys
from pathlib import Path
from sandbox.mounts import journal
from sandbox.mounts import Change, Changeset, CopyTree, walk

ws, root, listing = map(Path, sys.argv[1:4])
tree = CopyTree(ws, root)
tree.host = dict(walk(ws))
changes = Changeset([Change.from_dict(c) for c in json.loads(listing.read_text())])
report = tree._apply(changes, None, True)  # every change consented: the test is of the journal
print(json.dumps({"ops": journal._hook.count, "report": report.to_dict()}))
"""
Snapshot = dict[str, tuple[str, int, str]]


def snapshot(root: Path) -> Snapshot:
    """Every entry: kind, mode and the SHA-256 of its content (a symlink: its target)."""
    found: Snapshot = {}
    for rel, st in walk(root):
        path = root / rel
        if st.kind == "file":
            found[rel] = ("file", st.mode, hashlib.sha256(path.read_bytes()).hexdigest())
        else:
            found[rel] = (st.kind, st.mode, st.target or "")
    return found


def old_tree(root: Path) -> None:
    for d in range(6):
        (root / f"d{d}").mkdir(parents=True)
        for f in range(40):
            (root / f"d{d}" / f"f{f:03d}.txt").write_text(f"old {d}/{f}\n" * (f % 7 + 1))
    (root / "gone" / "deep").mkdir(parents=True)
    for f in range(10):
        (root / "gone" / f"g{f}.txt").write_text(f"gone {f}\n")
        (root / "gone" / "deep" / f"g{f}.txt").write_text(f"deep {f}\n")
    (root / "was-file").write_text("becomes a directory\n")
    (root / "was-dir").mkdir()
    (root / "was-dir" / "inner.txt").write_text("its directory becomes a file\n")
    (root / "link").symlink_to("d0/f000.txt")
    (root / "tool.sh").write_text("#!/bin/sh\necho old\n")
    (root / "tool.sh").chmod(0o755)


def edit(root: Path) -> None:
    """What a jail might do: modify, re-mode, delete, add files, directories and symlinks."""
    for d in range(6):
        for f in range(0, 40, 3):
            (root / f"d{d}" / f"f{f:03d}.txt").write_text(f"new {d}/{f}\n")
        for f in range(1, 40, 7):
            (root / f"d{d}" / f"f{f:03d}.txt").unlink()
        for f in range(40, 55):
            (root / f"d{d}" / f"f{f:03d}.txt").write_text(f"added {d}/{f}\n")
    (root / "d1" / "f002.txt").chmod(0o600)
    (root / "d2").chmod(0o750)
    shutil.rmtree(root / "gone")
    (root / "fresh" / "sub").mkdir(parents=True)
    for f in range(20):
        (root / "fresh" / f"n{f}.txt").write_text(f"fresh {f}\n")
        (root / "fresh" / "sub" / f"n{f}.txt").write_text(f"fresh sub {f}\n")
    (root / "fresh" / "sub").chmod(0o700)
    (root / "fresh" / "up").symlink_to("../d3/f000.txt")
    (root / "was-file").unlink()
    (root / "was-file").mkdir()
    (root / "was-file" / "now.txt").write_text("inside\n")
    shutil.rmtree(root / "was-dir")
    (root / "was-dir").write_text("now a file\n")
    (root / "link").unlink()
    (root / "link").symlink_to("d4/f000.txt")
    (root / "tool.sh").write_text("#!/bin/sh\necho new\n")


def leftovers(ws: Path) -> list[str]:
    """Hidden staged or backup names in the workspace, and this workspace's journal (or its temp)."""
    hidden = [rel for rel, _ in walk(ws) if ".sandbox-" in rel]
    path = journal.journal_path(ws)
    return hidden + [p.name for p in path.parent.iterdir() if path.name in p.name]


class Case:
    def __init__(self, base: Path, data: Path) -> None:
        self.base, self.data = base, data
        self.old_root = base / "old"
        self.listing = base / "changes.json"

    async def build(self) -> None:
        self.old_root.mkdir()
        old_tree(self.old_root)
        (self.base / "copies").mkdir()
        tree = await CopyTree.prepare(self.old_root, self.base / "copies")
        edit(tree.root)
        changes = await tree.changes()
        self.listing.write_text(json.dumps(changes.to_list()))
        self.root = tree.root
        self.old, self.new = snapshot(self.old_root), snapshot(tree.root)
        assert len(changes.changes) > 250

    def run(self, name: str, crash_after: int) -> tuple[subprocess.CompletedProcess[str], Path]:
        ws = self.base / name
        shutil.copytree(self.old_root, ws, symlinks=True)
        env = {**os.environ, journal.CRASH_ENV: str(crash_after)}
        argv = [sys.executable, "-c", CHILD, str(ws), str(self.root), str(self.listing)]
        return subprocess.run(argv, env=env, capture_output=True, text=True, check=False, timeout=60), ws


@pytest.fixture
def case(tmp_path: Path, data_dir: Path) -> Case:
    made = Case(tmp_path, data_dir)
    anyio.run(made.build)
    return made


@pytest.mark.slow
def test_an_uninterrupted_apply_gives_the_new_tree(case: Case) -> None:
    done, ws = case.run("whole", 0)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["report"]["conflicts"] == [] and out["report"]["skipped"] == []
    assert snapshot(ws) == case.new
    assert (case.new["d2"][1], case.new["fresh/sub"][1], case.new["d1/f002.txt"][1]) == (0o750, 0o700, 0o600)
    assert leftovers(ws) == []


@pytest.mark.slow
def test_an_apply_killed_anywhere_recovers_to_the_old_or_the_new_tree(case: Case) -> None:
    done, _ = case.run("count", 0)
    ops = json.loads(done.stdout)["ops"]
    seed = int(os.environ.get("SANDBOX_TEST_SEED", time.time_ns()))  # a failure names it: rerun with it
    rng = random.Random(seed)
    points = [1, 2, ops - 1, ops, *(rng.randint(1, ops) for _ in range(TRIALS - 4))]

    def trial(index: int) -> tuple[int, str, str]:
        done, ws = case.run(f"t{index}", points[index])
        assert done.returncode == -signal.SIGKILL, (seed, points[index], done.stderr)
        report = journal.recover(ws)
        state = snapshot(ws)
        outcome = "new" if state == case.new else "old" if state == case.old else "MIXED"
        assert outcome != "MIXED", (seed, points[index], report, sorted(set(state.items()) ^ set(case.new.items()))[:6])
        assert leftovers(ws) == [], (seed, points[index])
        shutil.rmtree(ws)
        return points[index], outcome, report.action

    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(trial, range(TRIALS)))
    assert {(outcome, action) for _, outcome, action in results} >= {("old", "rolled-back"), ("new", "rolled-forward")}
