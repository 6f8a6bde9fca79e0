"""Session snapshots, restore and fork (issue 39), end to end on real jails.

A session over a 50,000-file workspace writes, snapshots, forks into four; each fork edits
differently and one restores; every view is read back through the jail, the host workspace stays
untouched until an apply, and the four changesets apply on their own, the overlaps refused as
conflicts. On bubblewrap (``overlay``: root; ``copy``: every user) and Docker (``copy``).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from sandbox import mounts, snapshots
from sandbox.errors import Conflict, InvalidArgument, ToolDenied
from sandbox.policy.approvals import ApprovalRequest, CallbackApprover
from sandbox.session import Sandbox
from tests.conftest import backend_or_skip, make_profile, own_like_a_checkout

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

pytestmark = pytest.mark.anyio

CASES = [
    pytest.param(("bwrap", "overlay"), marks=[pytest.mark.bwrap, pytest.mark.root], id="bwrap-overlay"),
    pytest.param(("bwrap", "copy"), marks=pytest.mark.bwrap, id="bwrap-copy"),
    pytest.param(("docker", "copy"), marks=pytest.mark.docker, id="docker-copy"),
]


@pytest.fixture(params=CASES)
def case(request: pytest.FixtureRequest) -> tuple[str, str]:
    backend, mount = request.param
    backend_or_skip(backend)
    if mount == "overlay" and (why := mounts.overlay_support()) is not None:
        pytest.skip(f"overlay mounts unavailable here: {why}")
    return backend, mount


def fill(ws: Path, files: int) -> None:
    """``files`` small files in directories of 1,000 (``d000/f00000``), and a README."""
    for d in range(files // 1000):
        folder = ws / f"d{d:03d}"
        folder.mkdir()
        for f in range(1000):
            (folder / f"f{d * 1000 + f:05d}").write_text(f"{d * 1000 + f}\n")
    (ws / "README.md").write_text("# project\n")


def host_digest(ws: Path) -> str:
    """Every path of the host workspace with its bytes: what no session may change before an apply."""
    digest = hashlib.sha256()
    for root, dirs, files in sorted(os.walk(ws)):
        dirs.sort()
        for name in sorted(files):
            path = Path(root, name)
            digest.update(str(path.relative_to(ws)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def profile_for(backend: str, mount: str) -> Any:
    return make_profile("default", backend=backend, **{"mount.strategy": mount})


@pytest.fixture
async def session(tmp_path: Path, case: tuple[str, str]) -> AsyncIterator[Sandbox]:
    backend, mount = case
    ws = tmp_path / "ws"
    ws.mkdir()
    fill(ws, 1000)
    own_like_a_checkout(ws, backend)
    async with Sandbox.open(ws, profile=profile_for(backend, mount), mode="auto") as box:
        yield box


async def bash(box: Sandbox, command: str) -> str:
    result = await box.call("Bash", {"command": command})
    assert result.ok, result.content
    return result.content


@pytest.mark.slow
@pytest.mark.timeout(600)
async def test_a_50000_file_session_snapshots_forks_into_four_restores_and_applies_apart(
    tmp_path: Path, case: tuple[str, str]
) -> None:
    backend, mount = case
    ws = tmp_path / "ws"
    ws.mkdir()
    fill(ws, 50_000)
    own_like_a_checkout(ws, backend)
    before = host_digest(ws)
    async with Sandbox.open(ws, profile=profile_for(backend, mount), mode="auto") as box:
        await bash(
            box,
            "echo base > d000/f00000 && rm d001/f01001 && rm -r d002 && mkdir d002 && echo fresh > d002/only "
            "&& mkdir -p new/deep && echo added > new/deep/file && ln -s ../README.md new/link "
            "&& echo note > $SANDBOX_SCRATCH_DIR/note",
        )
        snap_id = await box.snapshot()
        snap = snapshots.read(snap_id)
        assert snap.kind == ("layers" if mount == "overlay" else "scan")
        assert snap.lineage == box.session_id
        await bash(box, "echo now > d000/f00000")  # after the snapshot: the forks start from now
        forks = await box.fork(4)
        try:
            assert len({f.session_id for f in forks}) == 4
            for i, fork in enumerate(forks):
                assert fork.lineage == box.session_id
                seen = await bash(
                    fork,
                    "cat d000/f00000 d002/only new/deep/file new/link $SANDBOX_SCRATCH_DIR/note; "
                    "test -e d001/f01001 || echo gone; test -e d002/f02002 || echo replaced; ls d002 | wc -l",
                )
                assert seen.split() == ["now", "fresh", "added", "#", "project", "note", "gone", "replaced", "1"]
                await bash(fork, f"echo fork{i} > d003/f03003 && echo mine > fork{i}.txt")
            for i, fork in enumerate(forks):  # each sees its own writes, never another's
                seen = await bash(fork, "cat d003/f03003; ls fork*.txt")
                assert seen.split() == [f"fork{i}", f"fork{i}.txt"]
            # fork 1 goes further, then back to the snapshot
            await bash(forks[1], "rm -r d004 && echo gone-too > README.md")
            restored = await forks[1].restore(snap_id)
            assert restored["snapshot_id"] == snap_id
            seen = await bash(forks[1], "cat d000/f00000 README.md; ls d004 | wc -l")
            assert seen.split() == ["base", "#", "project", "1000"]
            assert await bash(forks[1], "ls fork1.txt 2>/dev/null; echo end") == "end"
            assert host_digest(ws) == before  # nothing reached the host yet
            # the changesets: each its fork's own, against the original workspace
            sets = [await fork.changes() for fork in forks]
            paths = [{c.path for c in s.changes} for s in sets]
            for i in (0, 2, 3):
                assert {"d000/f00000", "d001/f01001", "d002/only", "new/deep/file", f"fork{i}.txt"} <= paths[i]
                assert not {f"fork{j}.txt" for j in range(4) if j != i} & paths[i]
            assert "fork1.txt" not in paths[1] and "d003/f03003" not in paths[1]
            first = await forks[0].jail.apply(sets[0])
            assert not first.conflicts, first
            assert (ws / "fork0.txt").read_text() == "mine\n" and (ws / "d003/f03003").read_text() == "fork0\n"
            second = await forks[2].jail.apply(sets[2])
            conflicted = {c["path"] for c in second.conflicts}
            assert "d003/f03003" in conflicted  # fork 0 changed it on the host since
            assert "d000/f00000" in conflicted
            assert "fork2.txt" in second.applied  # what does not overlap still applies
            assert (ws / "d003/f03003").read_text() == "fork0\n"
        finally:
            for fork in forks:
                await fork.aclose()


async def test_a_restore_brings_back_the_view_scratch_and_modes_and_drops_what_came_after(session: Sandbox) -> None:
    await bash(session, "echo one > README.md && echo kept > $SANDBOX_SCRATCH_DIR/s")
    session.configure(mode="accept-edits")
    snap_id = await session.snapshot()
    session.configure(mode="auto")
    await bash(session, "echo two > README.md && touch later && echo other > $SANDBOX_SCRATCH_DIR/s")
    await session.restore(snap_id)
    assert session.state.mode == "accept-edits"
    session.configure(mode="auto")
    assert (await bash(session, "cat README.md $SANDBOX_SCRATCH_DIR/s; ls later 2>/dev/null; echo end")).split() == [
        "one",
        "kept",
        "end",
    ]
    assert [c.path for c in (await session.changes()).changes] == ["README.md"]
    rows = [
        r for r in session.audit.rows() if r["session_id"] == session.session_id and r["tool"].startswith("session.")
    ]
    assert [r["tool"] for r in rows] == ["session.snapshot", "session.restore"]
    assert all(r["ok"] for r in rows)


async def test_a_restore_of_what_the_host_changed_since_is_a_conflict_and_restores_nothing(session: Sandbox) -> None:
    await bash(session, "echo mine > README.md")
    snap_id = await session.snapshot()
    await bash(session, "echo later > d000/f00001")
    (session.workspace / "README.md").write_text("the host's edit\n")
    with pytest.raises(Conflict) as caught:
        await session.restore(snap_id)
    assert caught.value.data["paths"] == ["README.md"]
    assert (await bash(session, "cat d000/f00001")) == "later"  # nothing was restored
    forced = await session.restore(snap_id, force=True)
    assert forced["host_changed"] == ["README.md"]
    changeset = await session.changes()
    report = await session.jail.apply(changeset)
    assert {c["path"] for c in report.conflicts} == {"README.md"}  # the apply still refuses it
    assert (session.workspace / "README.md").read_text() == "the host's edit\n"


async def test_snapshots_are_refused_for_rw_and_ro_with_the_reason(tmp_path: Path, case: tuple[str, str]) -> None:
    backend, _ = case
    ws = tmp_path / "ws"
    ws.mkdir()
    own_like_a_checkout(ws, backend)
    for mount in ("rw", "ro"):
        async with Sandbox.open(ws, profile=profile_for(backend, mount), mode="auto") as box:
            with pytest.raises(InvalidArgument, match="copy' or 'overlay"):
                await box.snapshot()


@pytest.mark.parametrize("answer", ["deny", "allow-once"])
async def test_a_restore_in_ask_is_put_to_the_user_and_a_refusal_restores_nothing(
    tmp_path: Path, case: tuple[str, str], answer: str
) -> None:
    backend, mount = case
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "README.md").write_text("# project\n")
    own_like_a_checkout(ws, backend)
    asked: list[ApprovalRequest] = []

    def user(request: ApprovalRequest) -> str:
        asked.append(request)
        return answer

    async with Sandbox.open(
        ws, profile=profile_for(backend, mount), mode="auto", approver=CallbackApprover(user)
    ) as box:
        await bash(box, "echo one > README.md")
        snap_id = await box.snapshot()
        await bash(box, "echo two > README.md")
        box.configure(mode="ask")
        if answer == "deny":
            with pytest.raises(ToolDenied):
                await box.restore(snap_id)
        else:
            await box.restore(snap_id)
        assert [(r.tool, r.operation) for r in asked] == [("session.restore", "write")]
        box.configure(mode="auto")
        assert (await bash(box, "cat README.md")) == ("two" if answer == "deny" else "one")
        rows = [r for r in box.audit.rows() if r["session_id"] == box.session_id and r["tool"] == "session.restore"]
        assert [(r["prompted"], r["decided_by"], r["ok"]) for r in rows] == [(1, "user", int(answer != "deny"))]
