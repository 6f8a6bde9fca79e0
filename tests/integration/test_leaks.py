"""Nothing leaks: aborted calls leave no process, cgroup, copy, scratch dir or mount, and what a
killed executor left behind is swept by ``sandbox.leftovers.sweep`` (never a live executor's)."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import anyio
import psutil
import pytest

from sandbox import exec as executor
from sandbox import leftovers, owners
from sandbox.backends import base, cgroups
from tests.conftest import backend_or_skip, make_profile, survivors

pytestmark = [pytest.mark.bwrap, pytest.mark.anyio]
SANDBOX = str(Path(sys.executable).with_name("sandbox"))


@pytest.fixture(autouse=True)
def _need_bwrap() -> None:
    backend_or_skip("bwrap")


def call_cgroups(owner: str) -> list[Path]:
    """The call cgroups the executor ``owner`` (``<pid>-<starttime>``) has on this host."""
    bases = {h.base for h in cgroups.hierarchies().values() if isinstance(h, cgroups.Hierarchy)}
    return [entry for b in bases for entry in b.glob(f"call-{owner}-*")]


def mounts_under(path: Path) -> list[str]:
    with open("/proc/self/mountinfo", encoding="utf-8") as fh:
        return [line for line in fh if str(path) in line]


async def _aborted_call(jail: base.Jail, marker: str, delay: float, cancel: bool) -> None:
    argv = ["/bin/sh", "-c", f"(setsid sleep {marker} &); trap '' TERM; sleep {marker} & echo x; wait"]
    abort = anyio.Event()
    with anyio.move_on_after(delay if cancel else 60):
        async with anyio.create_task_group() as tg:
            if not cancel:
                tg.start_soon(_set_after, abort, delay)
            await executor.run(jail, argv, abort=abort, timeout=30)
            tg.cancel_scope.cancel()


async def _set_after(event: anyio.Event, delay: float) -> None:
    await anyio.sleep(delay)
    event.set()


LIFECYCLES = pytest.mark.parametrize("lifecycle", ["call", "session"])  # bwrap per call, and the warm jail


@pytest.mark.slow
@pytest.mark.timeout(300)
@LIFECYCLES
async def test_300_aborted_calls_leave_nothing(workspace: Path, data_dir: Path, marker: str, lifecycle: str) -> None:
    backend = base.get("bwrap")
    rng = random.Random(9)
    for i in range(150):
        # Half with a private copy (as `sandbox run --mount copy`), two calls per jail (its cgroups
        # reused); aborted by the abort event or by cancellation, at any moment from the spawn on.
        overrides: dict[str, object] = {
            "mount.strategy": "copy" if i % 2 else "rw",
            "timeouts.kill_grace_s": 0.05,
            "bwrap.lifecycle": lifecycle,
        }
        prof = make_profile("default", **overrides)
        async with await backend.open_jail(workspace, prof) as jail:
            await _aborted_call(jail, marker, rng.uniform(0, 0.05), cancel=i % 3 == 0)
            await _aborted_call(jail, marker, rng.uniform(0, 0.05), cancel=i % 3 == 1)
    assert survivors(marker) == []
    assert call_cgroups(owners.owner_tag()) == []
    assert list((data_dir / "copies").iterdir()) == []
    assert not (data_dir / "scratch").exists() or list((data_dir / "scratch").iterdir()) == []
    assert mounts_under(data_dir) == []


@LIFECYCLES
async def test_a_session_that_ends_leaves_no_scratch_dir(
    workspace: Path, data_dir: Path, marker: str, lifecycle: str
) -> None:
    from sandbox.session import Sandbox

    for _ in range(5):
        with anyio.move_on_after(0.5):
            prof = make_profile(**{"bwrap.lifecycle": lifecycle})
            async with Sandbox.open(workspace, profile=prof, mode="auto") as s:
                await s.call("Bash", {"command": f"sleep {marker}"})
    assert survivors(marker) == []
    assert [p for p in (data_dir / "scratch").iterdir() if not p.name.endswith(".owner")] == []
    assert call_cgroups(owners.owner_tag()) == []


async def test_a_server_whose_client_closes_stdin_mid_call_leaves_no_process_nor_cgroup(
    workspace: Path, marker: str
) -> None:
    """An agent ends ``sandbox serve`` by closing its stdin, here with a call in flight: the server
    kills what its sessions started and removes its calls' cgroups before it exits by itself."""
    from tests.rpc_client import Client

    proc = await anyio.open_process([SANDBOX, "serve"], env=dict(os.environ))
    try:
        client = Client(proc)
        owner = f"{proc.pid}-{owners.start_time(proc.pid)}"
        opened = await client.call("session.open", {"workspace": str(workspace), "mode": "auto", "backend": "bwrap"})
        sid = opened["result"]["session_id"]
        ran = await client.call("tool.call", {"session_id": sid, "tool": "Bash", "args": {"command": "true"}})
        assert ran["result"]["ok"], ran
        if any(isinstance(h, cgroups.Hierarchy) for h in cgroups.hierarchies().values()):  # (none: a user on v1)
            assert call_cgroups(owner), "the warm jail's call cgroups were expected while it runs"
        command = f"(setsid sleep {marker} &); trap '' TERM; sleep {marker}"
        args = {"session_id": sid, "tool": "Bash", "args": {"command": command}}
        await client.send({"jsonrpc": "2.0", "id": "in-flight", "method": "tool.call", "params": args})
        await anyio.to_thread.run_sync(_wait_for, lambda: len(survivors(marker)) == 2)
        assert proc.stdin is not None
        await proc.stdin.aclose()
        with anyio.fail_after(30):
            assert await proc.wait() == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        await proc.aclose()
    assert survivors(marker) == []
    assert call_cgroups(owner) == []


def _wait_for(check: object, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.05)


def _sigkill_a_copy_run(workspace: Path, marker: str) -> str:
    """Start ``sandbox run --mount copy``, SIGKILL it mid-call; its owner tag."""
    # The sleep's argument is computed in the jail: the marker must not match our own command line.
    killed = subprocess.Popen(
        [
            SANDBOX,
            "run",
            "--mount",
            "copy",
            "--workspace",
            str(workspace),
            "--",
            "sh",
            "-c",
            f"sleep $(({int(marker) - 1} + 1))",
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    _wait_for(lambda: survivors(marker))
    dead_tag = f"{killed.pid}-{owners.start_time(killed.pid)}"
    killed.send_signal(signal.SIGKILL)
    killed.wait()
    _wait_for(lambda: not survivors(marker))  # bwrap dies with its parent, the namespace with it
    return dead_tag


async def test_sweep_removes_what_a_killed_executor_left_and_never_a_live_ones(
    workspace: Path, data_dir: Path, marker: str
) -> None:
    (workspace / "big.bin").write_bytes(os.urandom(1 << 20))
    dead_tag = await anyio.to_thread.run_sync(_sigkill_a_copy_run, workspace, marker)
    copies = list((data_dir / "copies").glob(f"copy-{dead_tag}-*"))
    assert len(copies) == 1 and (copies[0] / "big.bin").exists(), (dead_tag, list((data_dir / "copies").iterdir()))
    left_cgroups = call_cgroups(dead_tag)
    # A scratch dir of the dead executor, and one of ours (live).
    scratch = data_dir / "scratch"
    scratch.mkdir()
    for sid, tag in (("dead-session", dead_tag), ("live-session", owners.owner_tag())):
        (scratch / sid).mkdir()
        (scratch / sid / "notes.txt").write_text("x")
        (scratch / f"{sid}.owner").write_text(tag + "\n")

    async with await base.get("bwrap").open_jail(workspace, make_profile(**{"mount.strategy": "copy"})) as live:
        proc = await live.spawn(["sleep", marker])
        live_cgroups = call_cgroups(owners.owner_tag())
        swept = await anyio.to_thread.run_sync(leftovers.sweep)
        assert swept.copies == [str(copies[0])] and not copies[0].exists()
        # (Other dead executors' cgroups on this host may be swept too: only ours are checked.)
        assert set(map(str, left_cgroups)) <= set(swept.cgroups) and call_cgroups(dead_tag) == []
        assert swept.scratch == [str(scratch / "dead-session")] and not (scratch / "dead-session").exists()
        assert not [k for k in swept.kept if dead_tag in k or str(data_dir) in k]
        # The live executor's copy, cgroups, scratch dir and call are untouched.
        assert live.tree is not None and (live.tree.root / "big.bin").exists()
        assert call_cgroups(owners.owner_tag()) == live_cgroups
        assert (scratch / "live-session" / "notes.txt").exists()
        # The spawn returns once the jail started the command, not once it has exec'd `sleep`.
        await anyio.to_thread.run_sync(_wait_for, lambda: survivors(marker))
        assert proc.running_pids()
        await proc.kill_tree(0)
        proc.release()
    assert survivors(marker) == []


def test_owner_tags_tell_a_dead_owner_from_a_reused_pid() -> None:
    me = psutil.Process()
    start = owners.start_time(me.pid)
    assert start is not None and owners.owner_tag() == f"{me.pid}-{start}"
    assert owners.owner_alive(me.pid, start)
    assert not owners.owner_alive(me.pid, start + 1)  # same pid, another process
    dead = subprocess.Popen(["true"])
    dead_start = owners.start_time(dead.pid)
    assert dead_start is not None
    dead.wait()
    assert not owners.owner_alive(dead.pid, dead_start)


def _dead_tag() -> str:
    gone = subprocess.Popen(["true"])
    tag = f"{gone.pid}-{owners.start_time(gone.pid)}"
    gone.wait()
    return tag


@pytest.mark.root
async def test_sweep_unmounts_a_dead_executors_overlay_and_spares_the_workspace(
    workspace: Path, data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sandbox.mounts import OverlayTree, overlay_support

    if overlay_support():
        pytest.skip(f"no overlay here: {overlay_support()}")
    dead = _dead_tag()
    with monkeypatch.context() as patch:
        patch.setattr(owners, "owner_tag", lambda: dead)  # as if a killed executor had mounted it
        tree = await OverlayTree.prepare(workspace)
    assert mounts_under(data_dir) and (tree.root / "README.md").exists()
    swept = await anyio.to_thread.run_sync(leftovers.sweep)
    assert swept.copies == [str(tree.base)] and not tree.base.exists()
    assert mounts_under(data_dir) == []
    assert (workspace / "README.md").read_text() == "# sample\n" and (workspace / "src" / "app.py").exists()
