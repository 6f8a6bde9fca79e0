"""Session snapshots and forks under attack (issue 39), on every backend x lifecycle x private mount.

* **Forks are apart.** A fork reads neither another fork's writes at the workspace's path nor
  another fork's private tree, nor the snapshot store, by the host paths.
* **A snapshot belongs to its workspace and its line.** Restoring it, or opening a session from
  it, in another workspace (another directory, or the same path made anew) is refused, and so is a
  restore by a session of another line.
* **No resurrection.** A restore or a fork over a path the host changed, deleted or made since is a
  conflict, and nothing is restored.
* **What the host put since is not followed.** A link the host put where a directory of the
  snapshot was fails the fork; the directory it points to is untouched.
* **No secret, no link followed, no bomb.** A snapshot holds no masked secret (the host's, or one
  a call wrote under a secret's name), keeps a link as a link, is refused past its byte cap with
  nothing kept, and is refused while a call runs. A session opened from a snapshot under a
  profile that masks more masks what the snapshot put there too.

A backend without session snapshots refuses them (checked once, in the first test), and the other
tests skip there saying so.
"""

from __future__ import annotations

import os
import shutil
from typing import TYPE_CHECKING

import anyio
import pytest

from sandbox import exec as executor
from sandbox import snapshots
from sandbox.errors import Conflict, InvalidArgument
from sandbox.session import Sandbox
from tests.attack.conftest import mode_profile
from tests.conftest import own_like_a_checkout

if TYPE_CHECKING:
    from pathlib import Path

    from sandbox import profile as profiles
    from sandbox.backends import base

pytestmark = pytest.mark.anyio

SECRET = "s3cr3t-value-never-in-a-snapshot"


def profile(backend: base.Backend, mode: str, **overrides: object) -> profiles.Profile:
    return mode_profile(mode, backend=backend.name, **overrides)


def needs_snapshots(backend: base.Backend) -> None:
    if not backend.snapshots:
        pytest.skip(f"the {backend.name} backend has no session snapshots (its refusal is checked on its own)")


async def in_jail(box: Sandbox, script: str) -> str:
    """``script`` run in the session's jail directly: what the jail allows, past the permission layer."""
    result = await executor.run(box.jail, ["bash", "-c", script], timeout=60)
    return result.stdout + result.stderr


async def bash(box: Sandbox, command: str) -> str:
    result = await box.call("Bash", {"command": command})
    assert result.ok, result.content
    return result.content


async def test_a_backend_without_snapshots_refuses_them_and_others_take_them(
    backend: base.Backend, workspace: Path, private_mode: str
) -> None:
    async with Sandbox.open(workspace, profile=profile(backend, private_mode), mode="auto") as box:
        if not backend.snapshots:
            with pytest.raises(InvalidArgument, match="bwrap or docker"):
                await box.snapshot()
            return
        assert snapshots.read(await box.snapshot()).workspace == os.path.realpath(workspace)


async def test_a_fork_reads_no_other_forks_writes_nor_their_trees(
    backend: base.Backend, workspace: Path, private_mode: str
) -> None:
    needs_snapshots(backend)
    async with Sandbox.open(workspace, profile=profile(backend, private_mode), mode="auto") as box:
        first, second = await box.fork(2)
        try:
            await bash(first, f"echo {SECRET} > mine.txt && mkdir -p deep && echo {SECRET} > deep/x")
            assert first.jail.tree is not None
            tree = first.jail.tree
            places = [str(tree.root), str(tree.root.parent), str(snapshots.store())]
            probe = "; ".join(f"cat {p}/mine.txt {p}/upper/mine.txt 2>/dev/null; ls {p} 2>/dev/null" for p in places)
            seen = await in_jail(second, f"cd {second.workspace}; cat mine.txt deep/x 2>/dev/null; {probe}; echo end")
            assert SECRET not in seen and "mine.txt" not in seen, seen
            assert seen.strip().endswith("end")
            assert {c.path for c in (await second.changes()).changes}.isdisjoint({"mine.txt", "deep", "deep/x"})
        finally:
            await first.aclose()
            await second.aclose()


async def test_a_snapshot_is_refused_in_another_workspace_and_in_another_line(
    backend: base.Backend, workspace: Path, private_mode: str, tmp_path: Path
) -> None:
    needs_snapshots(backend)
    other = tmp_path / "other"
    other.mkdir()
    (other / "README.md").write_text("# other\n")
    own_like_a_checkout(other, backend.name)
    prof = profile(backend, private_mode)
    async with Sandbox.open(workspace, profile=prof, mode="auto") as box:
        await bash(box, "echo changed > README.md")
        snap_id = await box.snapshot()
    async with Sandbox.open(other, profile=prof, mode="auto") as elsewhere:
        with pytest.raises(InvalidArgument, match="belongs to the workspace"):
            await elsewhere.restore(snap_id)
    with pytest.raises(InvalidArgument, match="belongs to the workspace"):
        await Sandbox.from_snapshot(other, snap_id, profile=prof, mode="auto")
    async with Sandbox.open(workspace, profile=prof, mode="auto") as stranger:  # same workspace, another line
        with pytest.raises(InvalidArgument, match="another line"):
            await stranger.restore(snap_id)
        assert (await bash(stranger, "cat README.md")) == "# sample"
    moved = tmp_path / "moved"
    workspace.rename(moved)  # the same path made anew: another directory
    shutil.copytree(moved, workspace, symlinks=True)
    own_like_a_checkout(workspace, backend.name)
    with pytest.raises(InvalidArgument, match="belongs to the workspace"):
        await Sandbox.from_snapshot(workspace, snap_id, profile=prof, mode="auto")


@pytest.mark.parametrize("host_does", ["edit", "delete", "create"])
async def test_a_restore_never_resurrects_what_the_host_changed_since(
    backend: base.Backend, workspace: Path, private_mode: str, host_does: str
) -> None:
    needs_snapshots(backend)
    target = {"edit": "README.md", "delete": "src/app.py", "create": "new.txt"}[host_does]
    async with Sandbox.open(workspace, profile=profile(backend, private_mode), mode="auto") as box:
        await bash(box, f"mkdir -p src && echo from-the-jail > {target}")
        snap_id = await box.snapshot()
        await bash(box, "echo after > later.txt")
        path = workspace / target
        if host_does == "delete":
            path.unlink()
        else:
            path.write_text("the host's own\n")
        with pytest.raises(Conflict) as caught:
            await box.restore(snap_id)
        assert caught.value.data["paths"] == [target]
        assert (await bash(box, "cat later.txt")) == "after"  # nothing was restored
        with pytest.raises(Conflict):
            await Sandbox.from_snapshot(workspace, snap_id, profile=profile(backend, private_mode), mode="auto")


async def test_a_link_the_host_put_where_a_snapshot_directory_was_is_never_followed(
    backend: base.Backend, workspace: Path, private_mode: str, tmp_path: Path
) -> None:
    needs_snapshots(backend)
    outside = tmp_path / "outside"
    outside.mkdir()
    prof = profile(backend, private_mode)
    async with Sandbox.open(workspace, profile=prof, mode="auto") as box:
        await bash(box, "echo planted > src/new.py")
        snap_id = await box.snapshot()
    shutil.rmtree(workspace / "src")
    (workspace / "src").symlink_to(outside)
    with pytest.raises(Conflict):
        await Sandbox.from_snapshot(workspace, snap_id, profile=prof, mode="auto")
    assert list(outside.iterdir()) == []


async def test_a_snapshot_holds_no_masked_secret_and_keeps_links_as_links(
    backend: base.Backend, workspace: Path, private_mode: str
) -> None:
    needs_snapshots(backend)
    (workspace / ".env").write_text(f"API_KEY={SECRET}\n")
    own_like_a_checkout(workspace, backend.name)
    prof = profile(backend, private_mode)
    async with Sandbox.open(workspace, profile=prof, mode="auto") as box:
        await box.call("Bash", {"command": f"echo {SECRET} > .env; echo {SECRET}-pem > server.pem"})
        await bash(box, "ln -s /etc/shadow leak && ln -s ../README.md src/readme && echo ok > plain.txt")
        snap = snapshots.read(await box.snapshot())
        layer_text = (
            b"".join(p.read_bytes() for p in snap.layer.rglob("*") if p.is_file() and not p.is_symlink())
            + (snap.path / snapshots.MANIFEST).read_bytes()
        )
        assert SECRET.encode() not in layer_text
        assert not {".env", "server.pem"} & set(snap.delta.paths())
        assert (snap.layer / "leak").is_symlink() and os.readlink(snap.layer / "leak") == "/etc/shadow"
        assert "plain.txt" in snap.delta.present
        (fork,) = await box.fork(1)
        try:
            assert SECRET not in await in_jail(fork, f"cd {fork.workspace}; cat .env server.pem 2>/dev/null; echo end")
            changeset = await fork.changes()
            leak = next(c for c in changeset.changes if c.path == "leak")
            assert not leak.applicable and "symlink-outside" in leak.flags
        finally:
            await fork.aclose()
    assert (workspace / ".env").read_text() == f"API_KEY={SECRET}\n"


async def test_a_session_opened_from_a_snapshot_masks_what_its_profile_masks(
    backend: base.Backend, workspace: Path, private_mode: str
) -> None:
    """A snapshot taken where a path was not secret, opened under a profile that masks it: the seed
    is made before the jail exists, so the mask covers what it put. (Made after, its unlink of the
    path dropped the mask: the kernel detaches a mount whose point another namespace unlinks.)"""
    needs_snapshots(backend)
    (workspace / "notes.txt").write_text(f"{SECRET}-host\n")
    own_like_a_checkout(workspace, backend.name)
    async with Sandbox.open(workspace, profile=profile(backend, private_mode), mode="auto") as box:
        await in_jail(box, f"cd {box.workspace}; echo {SECRET}-session > notes.txt")
        snap_id = await box.snapshot()
    masking = profile(backend, private_mode, **{"policy.deny_read": ("notes.txt",)})
    (fork,) = await Sandbox.from_snapshot(workspace, snap_id, profile=masking, mode="auto")
    try:
        seen = await in_jail(fork, f"cd {fork.workspace}; cat notes.txt; echo end")
    finally:
        await fork.aclose()
    assert SECRET not in seen and seen.strip().endswith("end"), seen


async def test_a_snapshot_past_its_byte_cap_or_during_a_call_is_refused_and_keeps_nothing(
    backend: base.Backend, workspace: Path, private_mode: str
) -> None:
    needs_snapshots(backend)
    prof = profile(backend, private_mode, **{"limits.snapshot_bytes": "1MiB"})
    async with Sandbox.open(workspace, profile=prof, mode="auto") as box:
        await bash(box, "head -c 2097152 /dev/zero > big.bin")
        with pytest.raises(Conflict, match="limits.snapshot_bytes"):
            await box.snapshot()
        assert list(snapshots.store().iterdir()) == []
        async with anyio.create_task_group() as tg:
            tg.start_soon(box.call, "Bash", {"command": "sleep 2"})
            await anyio.sleep(0.5)
            with pytest.raises(Conflict, match="in flight"):
                await box.snapshot()
        assert list(snapshots.store().iterdir()) == []
