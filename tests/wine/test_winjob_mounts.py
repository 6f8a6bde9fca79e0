"""The winjob backend's mounts on Windows: ``copy`` (changeset and guarded apply, paths read by
Windows' rules, attacked), ``rw``, and ``ro`` (refused under Wine, which enforces no ACL)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

import anyio
import pytest

from sandbox import exec as executor
from sandbox.backends import base, winjob, winjob_job
from sandbox.errors import GuaranteeUnavailable
from sandbox.mounts import Change, Changeset, verbatim

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from sandbox.backends.base import Jail
    from sandbox.profile import Profile

pytestmark = pytest.mark.anyio
UNDER_WINE = winjob_job.wine_version() is not None
CMD = os.environ.get("COMSPEC", "cmd.exe")


@pytest.fixture
async def copy_jail(workspace: Path, profile: Profile) -> AsyncIterator[Jail]:
    (workspace / "a.txt").write_bytes(b"one\r\n")
    (workspace / "sub").mkdir()
    (workspace / "sub" / "b.txt").write_bytes(b"bee")
    (workspace / "README.md").write_bytes(b"# readme\n")
    copied = profile.with_overrides(**{"mount.strategy": "copy"})
    async with await base.get("winjob").open_jail(workspace, copied) as jail:
        yield jail


async def cmd(jail: Jail, line: str) -> executor.ExecResult:
    result = await executor.run(jail, [CMD, "/d", "/c", line])
    assert result.exit_code == 0, result
    return result


def make_verbatim(root: Path, names: list[str]) -> list[str]:
    """Files made by their \\\\?\\ names (as a jail can); the names this filesystem took."""
    made = []
    for name in names:
        try:
            with open(verbatim(f"{root}\\{name}"), "wb") as fh:
                fh.write(b"x")
        except OSError:
            continue  # this filesystem refuses the name outright: nothing to apply
        made.append(name)
    return made


def listing(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*"))


async def test_copy_writes_land_in_the_copy_until_applied(copy_jail: Jail, workspace: Path) -> None:
    assert isinstance(copy_jail, winjob.WinJobJail) and copy_jail.tree is not None
    copy_root = copy_jail.tree.root
    result = await cmd(copy_jail, "cd")
    assert Path(result.stdout.strip()) == copy_root  # commands work in the copy
    for line in ("echo new>c.txt", "echo two>>a.txt", "del sub\\b.txt"):  # one each: cmd keeps a space before &
        await cmd(copy_jail, line)
    assert listing(workspace) == ["README.md", "a.txt", "sub", "sub/b.txt"]  # the host untouched
    changes = await copy_jail.changes()
    assert changes is not None
    assert {(c.path, c.status) for c in changes.changes} == {
        ("a.txt", "modified"),
        ("c.txt", "added"),
        ("sub/b.txt", "deleted"),
    }
    report = await copy_jail.apply(changes)
    assert sorted(report.applied) == ["a.txt", "c.txt", "sub/b.txt"] and not report.conflicts
    assert listing(workspace) == ["README.md", "a.txt", "c.txt", "sub"]
    assert (workspace / "a.txt").read_bytes() == b"one\r\ntwo\r\n"
    assert not [p for p in workspace.iterdir() if p.name.startswith(".sandbox-apply-")]  # staging removed


async def test_copy_is_removed_on_close(workspace: Path, profile: Profile) -> None:
    jail = await base.get("winjob").open_jail(workspace, profile.with_overrides(**{"mount.strategy": "copy"}))
    assert jail.tree is not None
    root = jail.tree.root
    await cmd(jail, "echo x>f.txt")
    assert (root / "f.txt").exists()
    await jail.aclose()
    assert not root.exists()


async def test_host_change_since_copy_in_is_a_conflict(copy_jail: Jail, workspace: Path) -> None:
    await cmd(copy_jail, "echo jail>a.txt")
    await cmd(copy_jail, "echo jail>README.md")
    (workspace / "a.txt").write_bytes(b"the user's own edit\r\n")  # after copy-in, before apply
    changes = await copy_jail.changes()
    assert changes is not None
    report = await copy_jail.apply(changes)
    assert [c["path"] for c in report.conflicts] == ["a.txt"] and report.applied == ["README.md"]
    assert (workspace / "a.txt").read_bytes() == b"the user's own edit\r\n"  # the host's kept
    assert (workspace / "README.md").read_bytes() == b"jail\r\n"


async def test_names_windows_reads_otherwise_are_refused(copy_jail: Jail, workspace: Path) -> None:
    """A jail can make, with the \\\\?\\ prefix, names the Win32 layer would read as another file or a
    device: the apply refuses each (attack), and writes nothing for them."""
    assert copy_jail.tree is not None
    made = await anyio.to_thread.run_sync(make_verbatim, copy_jail.tree.root, ["evil.", "evil ", "NUL.txt", "con"])
    assert made, "the filesystem took none of the names: nothing attacked"
    changes = await copy_jail.changes()
    assert changes is not None
    found = {c.path for c in changes.changes}
    assert set(made) <= found, (made, found)
    refusals = {c.path: c.reason for c in changes.changes if not c.applicable}
    report = await copy_jail.apply(changes)
    refused = {c["path"]: c["reason"] for c in report.skipped + report.conflicts}
    assert not report.applied, report
    for name in made:
        assert name in refused and name in refusals, (name, report)
        assert "trailing dot or space" in refused[name] or "reserved device name" in refused[name]
    assert listing(workspace) == ["README.md", "a.txt", "sub", "sub/b.txt"]


async def test_crafted_paths_cannot_leave_the_workspace(copy_jail: Jail, workspace: Path) -> None:
    """A changeset is data (a kept manifest can be edited): its paths are read by Windows' rules."""
    assert copy_jail.tree is not None
    (copy_jail.tree.root / "payload.txt").write_bytes(b"payload")
    outside = workspace.parent / "outside.txt"
    paths = [
        "..\\outside.txt",
        "sub\\..\\..\\outside.txt",
        "C:outside.txt",
        f"{workspace.parent}\\outside.txt",
        "a.txt:hidden",
        "sub/b.txt::$DATA",
        "sub/../../outside.txt",
    ]
    crafted = Changeset([Change(p, "added", "file", size=7) for p in paths])
    report = await copy_jail.apply(crafted)
    assert not report.applied and sorted(c["path"] for c in report.conflicts) == sorted(paths)
    assert not outside.exists()
    assert listing(workspace) == ["README.md", "a.txt", "sub", "sub/b.txt"]


async def test_paths_equal_but_for_case_are_refused(copy_jail: Jail, workspace: Path) -> None:
    """Two changes to one file on Windows (a case-sensitive directory can hold both): neither is applied."""
    crafted = Changeset([Change("Twin.txt", "added", "file"), Change("twin.txt", "added", "file")])
    report = await copy_jail.apply(crafted)
    assert not report.applied and {c["path"] for c in report.conflicts} == {"Twin.txt", "twin.txt"}
    assert "but for case" in report.conflicts[0]["reason"]
    assert not (workspace / "twin.txt").exists()


async def test_a_case_only_rename_is_applied(copy_jail: Jail, workspace: Path) -> None:
    await cmd(copy_jail, "del README.md")
    await cmd(copy_jail, "echo lower>readme.md")
    changes = await copy_jail.changes()
    assert changes is not None
    assert {(c.path, c.status) for c in changes.changes} == {("README.md", "deleted"), ("readme.md", "added")}
    report = await copy_jail.apply(changes)
    assert not report.conflicts, report
    assert "readme.md" in os.listdir(workspace) and "README.md" not in os.listdir(workspace)


async def test_a_new_file_the_host_made_meanwhile_is_kept(copy_jail: Jail, workspace: Path) -> None:
    await cmd(copy_jail, "echo jail>fresh.txt")
    (workspace / "FRESH.TXT").write_bytes(b"host")  # one file on Windows, whatever its case
    changes = await copy_jail.changes()
    assert changes is not None
    report = await copy_jail.apply(changes)
    assert [c["path"] for c in report.conflicts] == ["fresh.txt"] and not report.applied
    assert (workspace / "FRESH.TXT").read_bytes() == b"host"


async def test_rw_writes_the_workspace(workspace: Path, jail: Jail) -> None:
    assert jail.tree is None and jail.mount == "rw"
    await cmd(jail, "echo rw>here.txt")
    assert (workspace / "here.txt").read_bytes() == b"rw\r\n"


async def test_ro_is_refused_where_it_cannot_be_enforced(workspace: Path, profile: Profile) -> None:
    ro = profile.with_overrides(**{"mount.strategy": "ro"})
    if UNDER_WINE:
        with pytest.raises(GuaranteeUnavailable, match="mount 'ro'.*Wine accepts file ACLs"):
            await base.get("winjob").open_jail(workspace, ro)
        report = base.get("winjob").probe()
        assert not report.guarantees["fs-write-confined"] and "Wine" in report.reasons["fs-write-confined"]
        assert report.details["mounts"]["ro"] != "available" and report.details["mounts"]["copy"] == "available"
        assert any(line.startswith("mount ro is refused here: Wine accepts") for line in report.advice)
        return
    async with await base.get("winjob").open_jail(workspace, ro) as jail:  # real Windows: the token's
        result = await executor.run(jail, [CMD, "/d", "/c", "echo x> denied.txt"])
        assert result.exit_code != 0 and not (workspace / "denied.txt").exists()
