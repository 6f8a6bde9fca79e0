"""The executor, a session and ``sandbox serve`` over the fake backend: the protocol on any host.

What a backend enforces is tested against the real ones (tests/integration, parametrised over
bwrap and docker). What is tested here is everything above a backend: bounded capture, timeout
and abort in ``exec.run``; the five boundaries of a session; the JSON-RPC server's messages.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any

import anyio
import pytest

from sandbox import exec as executor
from sandbox import leftovers, owners
from sandbox.backends.fake import Call, FakeBackend, FakeJail, Kill, Script, Step
from sandbox.session import Sandbox, sweep_scratch
from tests.unit import fake_support
from tests.unit.fake_support import Client, only_process, open_fake

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path

pytestmark = pytest.mark.anyio


# -- exec.run over a fake jail --------------------------------------------------------------------


@pytest.fixture
async def jail(workspace: Path) -> AsyncIterator[FakeJail]:
    flood: list[Step] = [("stdout", b"H" * 600)]
    flood += [("stdout", b"m" * 1000)] * 1000
    flood += [("stdout", b"T" * 100), ("stderr", b"e\n")]
    daemon = Script([("stdout", b"forked\n")], leaves_running=True)
    fake = FakeBackend(scripts={"flood": Script(flood), "daemon": daemon})
    opened = await open_fake(fake, workspace)
    yield opened
    await opened.aclose()


async def test_capture_keeps_head_and_tail_with_a_marker(jail: FakeJail) -> None:
    seen: list[bytes] = []
    result = await executor.run(jail, ["flood"], capture_bytes=1024, on_stdout=seen.append)
    total = 600 + 1_000_000 + 100
    assert (result.stdout_bytes, result.stdout_truncated) == (total, True) and len(b"".join(seen)) == total
    assert result.stdout.startswith("H" * 512) and result.stdout.endswith("T" * 100)
    assert f"bytes omitted; {total} bytes in all" in result.stdout and len(result.stdout) < 1024 + 100
    assert (result.stderr, result.stderr_bytes, result.stderr_truncated) == ("e\n", 2, False)
    assert (result.backend, result.exit_code, result.timed_out) == ("fake", 0, False)


async def test_a_leftover_of_a_normal_exit_is_killed_at_once(jail: FakeJail) -> None:
    result = await executor.run(jail, ["daemon"])
    proc = only_process(jail)
    assert (result.exit_code, result.stdout, result.kill_ms) == (0, "forked\n", None) and proc.child_pid
    assert proc.kills == [Kill(0, (proc.child_pid,))] and proc.running_pids() == [] and proc.released


async def test_timeout_kills_the_tree_and_says_so(jail: FakeJail) -> None:
    result = await executor.run(jail, ["sleep", "30"], timeout=1)
    assert result.timed_out and not result.aborted and 1000 <= result.duration_ms < 5000
    assert only_process(jail).running_pids() == [] and only_process(jail).kills


async def test_abort_kills_the_tree_and_says_so(jail: FakeJail) -> None:
    abort = anyio.Event()
    async with anyio.create_task_group() as tg:
        tg.start_soon(_set_after, abort, 0.1)
        result = await executor.run(jail, ["sleep", "30"], abort=abort)
    assert result.aborted and not result.timed_out and result.duration_ms < 5000
    assert only_process(jail).running_pids() == []


# -- a session: the five boundaries ----------------------------------------------------------------


@pytest.fixture
async def session(fake: FakeBackend, workspace: Path) -> AsyncIterator[Sandbox]:  # noqa: ARG001 - scripts the shared fake
    async with Sandbox.open(workspace, profile="default", backend="fake", mode="auto") as s:
        yield s


def processes(session: Sandbox) -> list[Call]:
    assert isinstance(session.jail, FakeJail)
    return [p.call for p in session.jail.processes]


async def test_bash_streams_apart_and_reports_failure(session: Sandbox) -> None:
    out: list[bytes] = []
    err: list[bytes] = []
    result = await session.call(
        "Bash",
        {"command": "echo to-out; echo to-err >&2; echo $SANDBOX_SCRATCH_DIR; exit 4"},
        on_stdout=out.append,
        on_stderr=err.append,
    )
    assert (result.ok, result.error_code, result.root) == (False, "TOOL_FAILED", "workspace")
    assert b"".join(out).decode().splitlines() == ["to-out", str(session.scratch)]
    assert b"".join(err) == b"to-err\n"
    assert result.content == f"to-out\n{session.scratch}\n[stderr]\nto-err\n[exit code 4]"
    details = result.details
    assert (details["exit_code"], details["backend"], details["mount"], details["stderr"]) == (
        4,
        "fake",
        "rw",
        "to-err\n",
    )


async def test_a_successful_call_has_the_result_shape(session: Sandbox) -> None:
    result = await session.call("Bash", {"command": "echo hi"}, tool_call_id="c1")
    assert result.model_dump().keys() == {"ok", "content", "error_code", "details", "root", "review"}
    assert (result.ok, result.error_code, result.content, result.review) == (True, None, "hi", None)
    assert [r["tool_call_id"] for r in session.audit.rows()] == ["c1"]


async def test_unknown_tool_and_bad_arguments_run_nothing(session: Sandbox) -> None:
    unknown = await session.call("rm_everything", {"path": "/"})
    bad = await session.call("Bash", {"command": 5})
    too_long = await session.call("Bash", {"command": "echo", "timeout": 10**9})
    assert [r.error_code for r in (unknown, bad, too_long)] == ["TOOL_DENIED", "INVALID_ARGUMENT", "INVALID_ARGUMENT"]
    assert processes(session) == []
    assert [r["error_code"] for r in session.audit.rows()] == ["TOOL_DENIED", "INVALID_ARGUMENT", "INVALID_ARGUMENT"]


async def test_policy_denial_runs_nothing(session: Sandbox) -> None:
    denied = await session.call("Bash", {"command": "rm -rf /"})
    assert (denied.ok, denied.error_code) == (False, "TOOL_DENIED") and processes(session) == []


async def test_a_session_that_fails_to_open_leaves_nothing(
    fake: FakeBackend, workspace: Path, data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The jail is open and the scratch directory made when the session itself fails (here the
    audit log cannot be opened: a full disk): the jail is closed and the directory removed."""

    def full_disk(*_args: object, **_kwargs: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Sandbox, "__init__", full_disk)
    opened = len(fake.jails)
    with pytest.raises(OSError, match="No space left"):
        await Sandbox.create(workspace, profile="default", backend="fake", session_id="s-full-disk")
    assert len(fake.jails) == opened + 1
    assert fake.jails[-1]._closed
    assert not (data_dir / "scratch" / "s-full-disk").exists()


@pytest.mark.usefixtures("fake")
async def test_unattended_confirmation_is_a_denial(workspace: Path) -> None:
    async with Sandbox.open(workspace, profile="default", backend="fake", mode="ask") as s:
        denied = await s.call("Bash", {"command": "touch made.txt"})
        assert (denied.ok, denied.error_code) == (False, "TOOL_DENIED") and processes(s) == []


async def test_timeout_is_reported_and_the_tree_killed(session: Sandbox) -> None:
    result = await session.call("Bash", {"command": "echo started; sleep 30", "timeout": 1})
    assert (result.ok, result.error_code) == (False, "TIMEOUT") and result.details["timed_out"]
    assert "started" in result.content and "timed out after 1 s" in result.content
    assert isinstance(session.jail, FakeJail)
    killed = only_process(session.jail)
    assert killed.kills and killed.running_pids() == []


async def test_abort_is_reported_and_the_tree_killed(session: Sandbox) -> None:
    abort = anyio.Event()
    async with anyio.create_task_group() as tg:
        tg.start_soon(_set_after, abort, 0.1)
        result = await session.call("Bash", {"command": "sleep 30"}, abort=abort)
    assert (result.ok, result.error_code) == (False, "ABORTED")
    assert isinstance(session.jail, FakeJail)
    assert only_process(session.jail).running_pids() == []


async def test_file_tools_fail_plainly_unless_scripted(fake: FakeBackend, session: Sandbox) -> None:
    unscripted = await session.call("Read", {"path": "README.md"})
    assert (unscripted.ok, unscripted.error_code) == (False, "TOOL_FAILED") and "file tools" in unscripted.content

    def runner(call: Call) -> Script:
        request = call.request()
        return Script.reply({"ok": True, "content": f"read {request['path']}", "resolved": request["path"]})

    fake.handler = runner
    read = await session.call("Read", {"path": "README.md"})
    assert (read.ok, read.content) == (True, f"read {session.workspace / 'README.md'}")


async def test_bash_is_told_the_scratch_dir_under_both_names(session: Sandbox) -> None:
    result = await session.call("Bash", {"command": "echo $PI_SCRATCH_DIR; echo $SANDBOX_SCRATCH_DIR"})
    assert (result.ok, result.content) == (True, f"{session.scratch}\n{session.scratch}")


# -- what ended sessions left: swept as a session opens --------------------------------------------


def _session_leftovers(data_dir: Path, sid: str, owner: str | None, *, age_days: float = 0) -> list[Path]:
    """A session's scratch and review-changes directories, claimed by ``owner`` (a pid-starttime tag)."""
    dirs = [data_dir / "scratch" / sid, data_dir / "review-changes" / sid]
    (dirs[0]).mkdir(parents=True)
    (dirs[0] / "notes.txt").write_text("x")
    (dirs[1] / "snap1").mkdir(parents=True)
    (dirs[1] / "snap1" / "before").write_text("the user's previous file")
    if owner is not None:
        (data_dir / "scratch" / f"{sid}.owner").write_text(owner + "\n")
    stamp = time.time() - age_days * 86400
    for path in dirs:
        os.utime(path, (stamp, stamp))
    return dirs


def _dead_owner() -> str:
    start = owners.start_time(os.getpid())
    assert start is not None
    return f"{os.getpid()}-{start + 1}"  # this pid, another start time: a process that is gone


@pytest.mark.usefixtures("fake")
async def test_opening_a_session_sweeps_what_ended_sessions_left(workspace: Path, data_dir: Path) -> None:
    dead = _session_leftovers(data_dir, "dead", _dead_owner())
    live_old = _session_leftovers(data_dir, "live", owners.owner_tag(), age_days=30)
    unclaimed_old = _session_leftovers(data_dir, "old", None, age_days=8)
    unclaimed_new = _session_leftovers(data_dir, "new", None)
    (data_dir / "scratch" / "vanished.owner").write_text(_dead_owner() + "\n")  # its directory is gone
    async with Sandbox.open(workspace, profile="default", backend="fake", session_id="opening") as s:
        assert s.scratch.is_dir()
    assert not any(path.exists() for path in (*dead, *unclaimed_old))
    assert not (data_dir / "scratch" / "dead.owner").exists()
    assert not (data_dir / "scratch" / "vanished.owner").exists()
    assert all(path.exists() for path in (*live_old, *unclaimed_new))
    assert (data_dir / "scratch" / "live.owner").exists()


def test_gc_sweeps_ended_sessions_by_their_claim_only(data_dir: Path) -> None:
    dead = _session_leftovers(data_dir, "dead", _dead_owner())
    unclaimed_old = _session_leftovers(data_dir, "old", None, age_days=30)
    swept = leftovers.sweep_sessions()  # as `sandbox gc` does, without an age
    assert (swept.scratch, swept.reviews, swept.kept) == ([str(dead[0])], [str(dead[1])], [])
    assert not any(path.exists() for path in dead) and all(path.exists() for path in unclaimed_old)
    assert sweep_scratch(max_age_s=7 * 86400) == ["old"]


# -- sandbox serve over stdio -----------------------------------------------------------------------


@pytest.fixture
async def client() -> AsyncIterator[Client]:
    async with fake_support.serve() as c:
        yield c


async def open_session(client: Client, workspace: Path) -> str:
    reply = await client.call("session.open", {"workspace": str(workspace), "backend": "fake", "mode": "auto"})
    assert reply["result"]["backend"] == "fake", reply
    return str(reply["result"]["session_id"])


async def test_serve_streams_apart_cancels_and_closes(client: Client, workspace: Path) -> None:
    init = await client.call("initialize", {"client": "test"})
    assert init["result"]["protocol"] == 1 and "Bash" in init["result"]["tools"]
    sid = await open_session(client, workspace)
    bash = {"session_id": sid, "tool": "Bash", "tool_call_id": "c1", "args": {"command": "echo out; echo err >&2"}}
    reply = await client.call("tool.call", bash)
    assert reply["result"]["ok"] is True and reply["result"]["content"] == "out\n[stderr]\nerr"
    assert (client.output("c1", "stdout"), client.output("c1", "stderr")) == ("out\n", "err\n")
    cancelled = await _cancelled_call(client, sid)
    assert cancelled["result"]["error_code"] == "ABORTED" and client.output("c2", "stdout") == "started\n"
    closed = await client.call("session.close", {"session_id": sid})
    assert closed["result"] == {"closed": True}
    gone = await client.call("tool.call", {**bash, "tool_call_id": "c3"})
    assert gone["error"]["code"] == -32602 and gone["error"]["data"]["code"] == "INVALID_ARGUMENT"
    assert (await client.call("shutdown", {}))["result"] == {}
    with anyio.fail_after(10):
        await client.proc.wait()


async def test_serve_refuses_bad_calls_with_codes(client: Client, workspace: Path) -> None:
    sid = await open_session(client, workspace)
    unknown = await client.call("tool.call", {"session_id": sid, "tool": "Explode", "args": {}})
    bad = await client.call("tool.call", {"session_id": sid, "tool": "Bash", "args": {"command": 5}})
    denied = await client.call("tool.call", {"session_id": sid, "tool": "Bash", "args": {"command": "rm -rf /"}})
    codes = [r["result"]["error_code"] for r in (unknown, bad, denied)]
    assert codes == ["TOOL_DENIED", "INVALID_ARGUMENT", "TOOL_DENIED"]
    audit = await client.call("audit.query", {"session_id": sid})
    assert [r["error_code"] for r in audit["result"]["records"]] == codes


async def _cancelled_call(client: Client, sid: str) -> dict[str, Any]:
    """A Bash call cancelled by ``$/cancelRequest`` once its first output has arrived."""
    rid = client.next_id + 1

    async def cancel_once_started() -> None:
        while not client.output("c2", "stdout"):
            await anyio.sleep(0.02)
        await client.send({"jsonrpc": "2.0", "method": "$/cancelRequest", "params": {"id": rid}})

    call = {"session_id": sid, "tool": "Bash", "tool_call_id": "c2", "args": {"command": "echo started; sleep 30"}}
    async with anyio.create_task_group() as tg:
        tg.start_soon(cancel_once_started)
        with anyio.fail_after(20):
            reply = await client.call("tool.call", call)
    return reply


async def _set_after(event: anyio.Event, delay: float) -> None:
    await anyio.sleep(delay)
    event.set()
