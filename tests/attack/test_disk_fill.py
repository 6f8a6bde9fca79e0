"""Attack class: fill the host's disk through a call's writable areas (issue 31, category 11).

A hostile command writes without end into what the jail may write on the host: the workspace
in ``rw``, the private copy (``copy``), the overlay's upper dir (``overlay``), the session's
scratch directory. ``RLIMIT_FSIZE`` caps one file, not many; no quota or mount caps them for an
ordinary user. The disk guard (:mod:`sandbox.diskguard`) must stop the call with TOOL_FAILED
(``errno`` ENOSPC) before the filesystem is full (the guard acting, not the kernel), and the
session must go on working. Each runs on both backends, warm and per call.

The host disk is never at risk. The root attacks fill a small tmpfs the test mounts, holding the
workspace and the data directory (copies, overlays, scratch), to the guard's reserve: the guard,
not the kernel, must end them. The attacks for any user (no mount) set their bound a little below
the real disk's free space and stop their writer at 256 MiB whatever happens; other writers of
that disk meanwhile make it act sooner (a big delete by others could hide some of the write).
"""

from __future__ import annotations

import os
import subprocess
from typing import TYPE_CHECKING

import pytest

from sandbox.backends import seccomp
from sandbox.session import Sandbox
from tests.attack.conftest import mode_profile
from tests.conftest import backend_or_skip, own_like_a_checkout

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from sandbox.backends import base
    from sandbox.tools.run import ToolResult

pytestmark = pytest.mark.anyio

MiB = 2**20
RESERVE = 2**30  # what the guard keeps free: the real default; the slack a writer at tmpfs speed
# fills between two looks and the kill (224 MiB was too little on a loaded CI host: filled once)
DISK = RESERVE + 32 * MiB  # the test's filesystem (memory, but only what is written: about 32 MiB)
TOO_MUCH = (DISK // MiB) + 64  # MiB: what a fill asks for; more than the disk: unguarded, the kernel stops it
BOUNDED = 256 * MiB  # what a writer on the real disk takes at most, if nothing stopped it
FILL = "dd if=/dev/zero of={target}/big bs=1M count={count} 2>&1; echo wrote"


@pytest.fixture
def small_disk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A small tmpfs holding the data directory; the test puts its workspace there too."""
    disk = tmp_path / "disk"
    disk.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={DISK},mode=0755", "tmpfs", str(disk)], capture_output=True, text=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs to fill: {done.stderr.strip()}")
    try:
        (disk / "data").mkdir(mode=0o700)
        monkeypatch.setenv("SANDBOX_DATA_DIR", str(disk / "data"))
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)
        seccomp.filter_path.cache_clear()  # it kept its program in that data directory: gone now


def _workspace(disk: Path, backend: base.Backend) -> Path:
    ws = disk / "ws"
    ws.mkdir()
    (ws / "README.md").write_text("# sample\n")
    own_like_a_checkout(ws, backend.name)
    return ws


def _free(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def _assert_guarded(result: ToolResult, bound: str, limit: int) -> None:
    """The guard's structured error, not the kernel's ENOSPC seen by dd."""
    assert not result.ok, result
    assert result.error_code == "TOOL_FAILED", result
    assert result.details.get("errno") == "ENOSPC", result
    assert result.details["bound"] == bound, result.details
    assert result.details["limit"] == limit, result.details
    assert bound in result.content


async def _fill_then_recover(box: Sandbox, target: str) -> ToolResult:
    """Fill ``target`` until stopped; then a call in the same session cleans up (the session survives)."""
    filled = await box.call("Bash", {"command": FILL.format(target=target, count=TOO_MUCH)})
    after = await box.call("Bash", {"command": f"rm -f {target}/big; echo ok"})
    assert (after.ok, after.content.strip()) == (True, "ok"), after
    return filled


@pytest.mark.root
async def test_a_call_filling_the_workspace_stops_at_the_reserve(
    backend: base.Backend, small_disk: Path, writable_mode: str
) -> None:
    ws = _workspace(small_disk, backend)
    prof = mode_profile(writable_mode, backend=backend.name, **{"limits.disk_reserve": RESERVE})
    box = await Sandbox.create(ws, profile=prof, mode="auto")
    try:
        filled = await box.call("Bash", {"command": FILL.format(target=".", count=TOO_MUCH)})
        left = _free(small_disk)
        after = await box.call("Bash", {"command": "rm -f big; echo ok"})
        assert (after.ok, after.content.strip()) == (True, "ok"), after
    finally:
        await box.aclose()
    _assert_guarded(filled, "limits.disk_reserve", RESERVE)
    assert 0 < filled.details["free"] < RESERVE
    assert left > 0  # the guard acted before the kernel had to
    assert not (ws / "big").exists()


@pytest.mark.root
async def test_a_call_filling_the_scratch_dir_stops_at_the_reserve(backend: base.Backend, small_disk: Path) -> None:
    ws = _workspace(small_disk, backend)
    prof = mode_profile("ro", backend=backend.name, **{"limits.disk_reserve": RESERVE})
    box = await Sandbox.create(ws, profile=prof, mode="auto")
    try:
        filled = await _fill_then_recover(box, '"$SANDBOX_SCRATCH_DIR"')
    finally:
        await box.aclose()
    _assert_guarded(filled, "limits.disk_reserve", RESERVE)
    assert filled.details["path"].startswith(str(small_disk / "data"))


async def _bounded_fill(backend: base.Backend, workspace: Path, mode: str, limit: str, value: int) -> ToolResult:
    """A writer bounded at BOUNDED under ``limit = value``; then the session still works (and cleans up)."""
    prof = mode_profile(mode, backend=backend.name, **{limit: value})
    box = await Sandbox.create(workspace, profile=prof, mode="auto")
    try:
        filled = await box.call("Bash", {"command": FILL.format(target=".", count=BOUNDED // MiB)})
        after = await box.call("Bash", {"command": "rm -f big; echo ok"})
        assert (after.ok, after.content.strip()) == (True, "ok"), after
    finally:
        await box.aclose()
    return filled


async def test_the_reserve_holds_without_a_mount_too(
    backend: base.Backend, workspace: Path, writable_mode: str
) -> None:
    """Any user: a reserve 32 MiB below the free space now, on the real disk, and a writer bounded
    at BOUNDED (the disk is never at risk). Others freeing space on that disk meanwhile could hide
    the call's writes: the bound sits far below what the writer would take."""
    reserve = _free(workspace) - 32 * MiB
    filled = await _bounded_fill(backend, workspace, writable_mode, "limits.disk_reserve", reserve)
    _assert_guarded(filled, "limits.disk_reserve", reserve)


async def test_a_call_writing_past_disk_write_is_stopped(
    backend: base.Backend, workspace: Path, writable_mode: str
) -> None:
    bound = 16 * MiB  # the writer stops at BOUNDED whatever happens: the host disk is never at risk
    filled = await _bounded_fill(backend, workspace, writable_mode, "limits.disk_write", bound)
    _assert_guarded(filled, "limits.disk_write", bound)
    assert filled.details["used"] > bound


@pytest.mark.docker
async def test_a_remote_engines_scratch_tmpfs_is_capped(workspace: Path) -> None:
    """A remote engine's scratch directory is a tmpfs of its memory: ``limits.tmp_size`` caps it too."""
    backend_or_skip("docker")
    own_like_a_checkout(workspace)
    prof = mode_profile("copy", backend="docker", **{"docker.remote": True, "limits.tmp_size": "1MiB"})
    box = await Sandbox.create(workspace, profile=prof, mode="auto")
    try:
        filled = await box.call("Bash", {"command": FILL.format(target='"$SANDBOX_SCRATCH_DIR"', count=4)})
    finally:
        await box.aclose()
    assert "No space left on device" in filled.content, filled
