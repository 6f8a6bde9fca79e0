"""The warm bubblewrap jail (``[bwrap] lifecycle = "session"``): one bwrap, the agent as its PID 1.

What it must keep of a fresh jail per call (each call in its own cgroup before it runs, nothing
outliving its call, floods and bombs contained) and the attacks on the agent itself: signals,
ptrace, ``/proc/1``, its socket, tampering with what commands inherit, many requests at once,
and its death mid-call (a structured error, then a new jail).
"""

from __future__ import annotations

import os
import resource
import signal
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

import anyio
import pytest

from sandbox import exec as executor
from sandbox.backends import base, bwrap_spare, bwrap_warm, cgroups, confine
from sandbox.errors import BackendUnavailable
from tests.conftest import backend_or_skip, make_profile, survivors

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Coroutine, Sequence

pytestmark = [pytest.mark.anyio, pytest.mark.bwrap]


def _has_cgroups() -> bool:
    return any(isinstance(h, cgroups.Hierarchy) for h in cgroups.hierarchies().values())


NEEDS_CGROUPS = pytest.mark.skipif(
    not _has_cgroups(), reason="no cgroup for calls here (an ordinary user without delegation)"
)


@pytest.fixture
async def jail(workspace: Path) -> AsyncIterator[bwrap_warm.WarmBwrapJail]:
    backend = backend_or_skip("bwrap")
    opened = await backend.open_jail(workspace, make_profile(**{"bwrap.lifecycle": "session"}))
    assert isinstance(opened, bwrap_warm.WarmBwrapJail)
    try:
        yield opened
    finally:
        await opened.aclose()


def _agent_pid(jail: bwrap_warm.WarmBwrapJail) -> int:
    assert jail._agent is not None
    return jail._agent.tree.root_pid


async def _failing_while(
    attack: Coroutine[None, None, None], call: Coroutine[None, None, object]
) -> BackendUnavailable:
    """The structured error of ``call`` while ``attack`` runs beside it."""
    caught: list[BackendUnavailable] = []

    async def run_call() -> None:
        try:
            await call
        except BackendUnavailable as exc:
            caught.append(exc)

    async with anyio.create_task_group() as tg:
        tg.start_soon(_awaited, attack)
        await run_call()
    assert caught, "the call did not fail"
    return caught[0]


async def _awaited(coro: Coroutine[None, None, None]) -> None:
    await coro


async def _sh(jail: base.Jail, script: str, **kwargs: object) -> executor.ExecResult:
    return await executor.run(jail, ["/bin/sh", "-c", script], **kwargs)  # type: ignore[arg-type]


async def test_calls_share_one_jail_and_what_it_keeps(jail: bwrap_warm.WarmBwrapJail) -> None:
    first = _agent_pid(jail)
    wrote = await _sh(jail, "echo kept > /tmp/state; export GONE=1; echo $$")
    read = await _sh(jail, "cat /tmp/state; echo ${GONE:-unset}; cat /proc/1/comm")
    assert wrote.exit_code == 0 and read.exit_code == 0, (wrote, read)
    # What the warm jail gives up: /tmp survives between calls; the environment does not.
    assert read.stdout.split() == ["kept", "unset", os.path.basename(jail.python)]  # the verified real file
    assert _agent_pid(jail) == first


async def test_the_command_gets_no_fd_of_the_agent(jail: bwrap_warm.WarmBwrapJail) -> None:
    result = await _sh(jail, "ls /proc/self/fd")
    # 0, 1, 2 and ls's own directory fd: neither the agent's socket nor the hold socket.
    assert result.exit_code == 0 and result.stdout.split() == ["0", "1", "2", "3"], result


@NEEDS_CGROUPS
async def test_each_call_runs_in_its_own_cgroup_from_its_first_instruction(jail: bwrap_warm.WarmBwrapJail) -> None:
    seen = [(await _sh(jail, "cat /proc/self/cgroup")).stdout for _ in range(2)]
    agent = Path(f"/proc/{_agent_pid(jail)}/cgroup").read_text(encoding="ascii")
    for text in seen:
        assert "call-" in text, text  # placed before exec: the shell's first read already shows it
        assert "call-" not in agent


async def _placed_spare(jail: bwrap_warm.WarmBwrapJail) -> tuple[bwrap_spare.Spare, int]:
    spare = jail._spare
    assert spare is not None, "no spare was asked for after the call"
    await anyio.to_thread.run_sync(spare.placed.wait, 10)
    assert spare.pid is not None, "the spare was not placed"
    return spare, spare.pid


@NEEDS_CGROUPS
async def test_the_next_calls_process_waits_placed_while_the_jail_is_idle(jail: bwrap_warm.WarmBwrapJail) -> None:
    await _sh(jail, "true")
    _spare, pid = await _placed_spare(jail)
    # Forked ahead of its call, already in a call cgroup with the profile's rlimits, running nothing.
    assert "call-" in Path(f"/proc/{pid}/cgroup").read_text(encoding="ascii")
    nofile = jail.profile.limits.nofile
    if nofile is not None:
        assert resource.prlimit(pid, resource.RLIMIT_NOFILE) == (nofile, nofile)
    status = Path(f"/proc/{pid}/status").read_text(encoding="ascii")
    ns_pid = next(line for line in status.splitlines() if line.startswith("NSpid:")).split()[-1]
    result = await _sh(jail, "echo $$; cat /proc/self/cgroup")
    # The call *is* the spare: the shell's pid in the jail is the spare's.
    assert result.stdout.split()[0] == ns_pid, (result, ns_pid)
    assert not confine.alive(pid)


async def test_a_spare_that_died_before_its_call_does_not_fail_the_call(jail: bwrap_warm.WarmBwrapJail) -> None:
    await _sh(jail, "true")
    _spare, pid = await _placed_spare(jail)
    first = _agent_pid(jail)
    os.kill(pid, signal.SIGKILL)  # from outside: nothing inside may run while a spare waits
    while confine.alive(pid):
        await anyio.sleep(0.01)
    result = await _sh(jail, "echo fine")
    assert result.exit_code == 0 and result.stdout == "fine\n", result
    assert _agent_pid(jail) == first  # forked and held the usual way, in the same jail


def _recorded(
    jail: bwrap_warm.WarmBwrapJail, monkeypatch: pytest.MonkeyPatch, delay: float = 0
) -> list[dict[str, object]]:
    """The requests the host sends the agent from now on (each after ``delay`` seconds)."""
    assert jail._agent is not None
    link = jail._agent.link
    sent: list[dict[str, object]] = []
    send = link.send

    def recording(message: dict[str, object], fds: Sequence[int] = ()) -> None:
        sent.append(message)
        if delay and message.get("op") == "run":
            time.sleep(delay)  # the loop waits too: what the jail does meanwhile, it does on its own
        send(message, fds)

    monkeypatch.setattr(link, "send", recording)
    return sent


async def test_a_command_goes_to_the_spare_straight_from_the_host(
    jail: bwrap_warm.WarmBwrapJail, monkeypatch: pytest.MonkeyPatch
) -> None:
    await _sh(jail, "true")
    _spare, pid = await _placed_spare(jail)
    sent = _recorded(jail, monkeypatch)
    result = await _sh(jail, "echo out; echo err >&2; exit 3")
    assert (result.exit_code, result.stdout, result.stderr) == (3, "out\n", "err\n"), result
    # The agent only learnt which spare became which call: no argv, no pipe ends passed through it.
    assert [m for m in sent if m.get("op") == "run"] == [{"op": "run", "id": sent[0]["id"], "spare": "direct"}]
    assert not confine.alive(pid)


async def test_a_spare_that_dies_at_its_hand_over_fails_the_call_structured(
    jail: bwrap_warm.WarmBwrapJail, monkeypatch: pytest.MonkeyPatch
) -> None:
    await _sh(jail, "true")
    _spare, pid = await _placed_spare(jail)
    os.kill(pid, signal.SIGKILL)
    while confine.alive(pid):
        await anyio.sleep(0.01)
    monkeypatch.setattr(confine, "alive", lambda _pid: True)  # as if it died just after the host looked
    with pytest.raises(BackendUnavailable, match="spare is gone"):
        await _sh(jail, "echo never")
    monkeypatch.undo()
    result = await _sh(jail, "echo next")
    assert (result.exit_code, result.stdout) == (0, "next\n"), result


async def test_a_command_that_ends_before_the_agent_hears_of_it_is_reported_all_the_same(
    jail: bwrap_warm.WarmBwrapJail, monkeypatch: pytest.MonkeyPatch
) -> None:
    await _sh(jail, "true")
    await _placed_spare(jail)
    _recorded(jail, monkeypatch, delay=0.5)  # the spare runs and exits long before the agent's word
    result = await _sh(jail, "echo early; exit 7")
    assert (result.exit_code, result.stdout) == (7, "early\n"), result
    await _placed_spare(jail)
    result = await _sh(jail, "kill -9 $$")
    assert result.exit_code == 128 + signal.SIGKILL, result
    assert (await _sh(jail, "echo next")).stdout == "next\n"


async def test_a_spare_that_wakes_after_the_agent_let_go_of_it_still_takes_its_call(
    jail: bwrap_warm.WarmBwrapJail,
) -> None:
    # The agent closes its end of the spare's link when it hears of the call: a spare slow to wake
    # finds that end *and* its call ready, and must take the call, not give up.
    await _sh(jail, "true")
    _spare, pid = await _placed_spare(jail)
    os.kill(pid, signal.SIGSTOP)
    results: list[executor.ExecResult] = []

    async def call() -> None:
        results.append(await _sh(jail, "echo woke; exit 5"))

    async with anyio.create_task_group() as tg:
        tg.start_soon(call)
        await anyio.sleep(0.5)  # the host handed it the call, the agent took note and let go
        assert not results
        os.kill(pid, signal.SIGCONT)
    assert (results[0].exit_code, results[0].stdout) == (5, "woke\n"), results


async def test_the_spares_thread_ends_with_the_jail(workspace: Path) -> None:
    backend = backend_or_skip("bwrap")
    opened = await backend.open_jail(workspace, make_profile(**{"bwrap.lifecycle": "session"}))
    await _sh(opened, "true")
    assert any(t.name == "bwrap-placer" for t in threading.enumerate())
    await opened.aclose()
    with anyio.fail_after(5):
        while any(t.name == "bwrap-placer" for t in threading.enumerate()):
            await anyio.sleep(0.01)


async def test_no_process_of_a_call_meets_the_spare(jail: bwrap_warm.WarmBwrapJail) -> None:
    # While a call runs there is no spare (it is that call); the next is forked only after the sweep.
    await _sh(jail, "true")
    await _placed_spare(jail)
    listing = "for p in /proc/[0-9]*; do read c < $p/comm && echo $c; done"  # builtins only: no fork
    result = await _sh(jail, listing)
    assert sorted(result.stdout.split()) == sorted([os.path.basename(jail.python), "sh"]), result


async def test_agent_survives_signals_and_refuses_ptrace_and_proc(jail: bwrap_warm.WarmBwrapJail) -> None:
    first = _agent_pid(jail)
    attack = (
        "for s in KILL STOP TERM INT HUP QUIT USR1 SEGV; do kill -$s 1; done; "
        "for f in mem environ fd/3 fd/4 maps; do cat /proc/1/$f >/dev/null 2>&1 && echo READ $f; done; "
        "for n in 0 1 2 3 4 5 6 7; do (echo junk > /proc/1/fd/$n) 2>/dev/null && echo WROTE $n; done; "
        "python3 -c 'import ctypes; print(\"ptrace\", ctypes.CDLL(None).ptrace(16, 1, 0, 0))'; "
        "grep -E '^(State|TracerPid)' /proc/1/status"
    )
    result = await _sh(jail, attack)
    assert "READ" not in result.stdout and "WROTE" not in result.stdout, result
    assert "ptrace -1" in result.stdout, result
    assert "TracerPid:\t0" in result.stdout and "(stopped)" not in result.stdout, result
    after = await _sh(jail, "echo alive")
    assert after.stdout == "alive\n" and _agent_pid(jail) == first


async def test_tampering_with_what_commands_inherit_retires_the_jail(jail: bwrap_warm.WarmBwrapJail) -> None:
    first = _agent_pid(jail)
    tamper = await _sh(jail, "prlimit --pid 1 --nofile=16:16 && echo done")
    assert tamper.exit_code == 0 and "done" in tamper.stdout, tamper
    after = await _sh(jail, "ulimit -n")
    assert after.exit_code == 0 and after.stdout.strip() != "16"
    assert _agent_pid(jail) != first  # a new jail: the spoilt agent retired


async def test_many_requests_at_once_run_one_by_one(jail: bwrap_warm.WarmBwrapJail) -> None:
    results: list[executor.ExecResult] = []

    async def one(i: int) -> None:
        results.append(await _sh(jail, f"echo {i}"))

    async with anyio.create_task_group() as tg:
        for i in range(30):
            tg.start_soon(one, i)
    assert sorted(int(r.stdout) for r in results) == list(range(30))
    assert all(r.exit_code == 0 for r in results)


async def test_timeout_kills_every_process_of_the_call_and_keeps_the_jail(
    jail: bwrap_warm.WarmBwrapJail, marker: str
) -> None:
    first = _agent_pid(jail)
    tree = (
        f"trap '' TERM; setsid sh -c 'trap \"\" TERM; sleep {marker}' & ( (sleep {marker} &) & ); "
        f"nohup sleep {marker} >/dev/null 2>&1 & sleep {marker}"
    )
    result = await _sh(jail, tree, timeout=1)
    assert result.timed_out
    assert survivors(marker) == []
    assert (await _sh(jail, "echo ok")).stdout == "ok\n" and _agent_pid(jail) == first


async def test_a_background_process_dies_with_its_call(jail: bwrap_warm.WarmBwrapJail, marker: str) -> None:
    result = await _sh(jail, f"(setsid sleep {marker} &) ; echo started")
    assert result.stdout == "started\n"
    assert survivors(marker) == []


async def test_flood_and_fork_bomb_stay_in_their_call(workspace: Path, marker: str) -> None:
    backend = backend_or_skip("bwrap")
    prof = make_profile(**{"bwrap.lifecycle": "session", "limits.pids": 64, "limits.capture_bytes": 4096})
    async with await backend.open_jail(workspace, prof) as jail:
        flood = await _sh(jail, "head -c 200000000 /dev/zero")
        assert flood.exit_code == 0 and flood.stdout_bytes == 200_000_000 and flood.stdout_truncated
        bomb = await _sh(jail, f": {marker}; bomb() {{ bomb | bomb & }}; bomb; sleep 2; echo alive", timeout=5)
        assert bomb.exit_code is not None or bomb.timed_out
        assert survivors(marker) == []
        assert (await _sh(jail, "echo ok")).stdout == "ok\n"


async def test_an_agent_killed_mid_call_fails_the_call_and_is_replaced(
    jail: bwrap_warm.WarmBwrapJail, marker: str
) -> None:
    first = _agent_pid(jail)

    async def kill_agent() -> None:
        while not survivors(marker):
            await anyio.sleep(0.02)
        os.kill(first, signal.SIGKILL)  # from outside the namespace: PID 1 is not immune to this

    error = await _failing_while(kill_agent(), _sh(jail, f"sleep {marker}", timeout=30))
    assert "agent died" in error.message and "next call gets a new jail" in error.message
    assert survivors(marker) == []
    after = await _sh(jail, "echo again")
    assert after.stdout == "again\n" and _agent_pid(jail) != first


async def test_an_agent_that_does_not_answer_a_kill_is_killed_by_the_kernel(
    jail: bwrap_warm.WarmBwrapJail, marker: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bwrap_warm, "KILL_WAIT_S", 0.5)
    first = _agent_pid(jail)

    async def stop_agent() -> None:
        while not survivors(marker):
            await anyio.sleep(0.02)
        os.kill(first, signal.SIGSTOP)  # wedged: it will never sweep nor answer

    call = _sh(jail, f"trap '' TERM; setsid sleep {marker} & sleep {marker}", timeout=1)
    error = await _failing_while(stop_agent(), call)
    assert "did not answer" in error.message
    assert survivors(marker) == []
    after = await _sh(jail, "echo fresh")
    assert after.stdout == "fresh\n" and _agent_pid(jail) != first


async def test_closing_the_jail_ends_its_agent_and_everything_in_it(workspace: Path, marker: str) -> None:
    backend = backend_or_skip("bwrap")
    jail = await backend.open_jail(workspace, make_profile(**{"bwrap.lifecycle": "session"}))
    assert isinstance(jail, bwrap_warm.WarmBwrapJail)
    pid = _agent_pid(jail)
    with anyio.move_on_after(0.5):
        await _sh(jail, f"setsid sleep {marker} & sleep {marker}")
    await jail.aclose()
    assert survivors(marker) == []
    stat = Path(f"/proc/{pid}/stat")
    assert not stat.exists() or stat.read_text().rpartition(")")[2].split()[0] == "Z"


async def test_file_tools_are_served_by_the_agent_itself_and_resolve_again(
    jail: bwrap_warm.WarmBwrapJail, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sandbox.tools.run import run_in_jail

    sent = _recorded(jail, monkeypatch)
    spare, _pid = await _placed_spare(jail)
    (workspace / "notes.txt").write_text("one\ntwo\n")
    read = await run_in_jail(jail, {"op": "read", "path": str(workspace / "notes.txt")})
    assert read["ok"] and "two" in read["content"], read
    runs = [m for m in sent if m.get("op") == "run"]
    assert [(m.get("py"), "inline" in m) for m in runs] == [("runner", True)]
    assert jail._spare is spare, "the agent served the Read itself: the spare stays the next call"
    # The approved path is resolved again in the jail: a symlink planted since is refused.
    (workspace / "swapped").symlink_to(workspace / "notes.txt")
    moved = await run_in_jail(jail, {"op": "write", "path": str(workspace / "swapped"), "content": "x"})
    assert (moved["ok"], moved["error_code"]) == (False, "TOOL_DENIED"), moved
    assert (workspace / "notes.txt").read_text() == "one\ntwo\n"
    listed = await run_in_jail(jail, {"op": "ls", "path": str(workspace)})
    assert listed["ok"] and "notes.txt" in listed["content"]
    wrote = await run_in_jail(jail, {"op": "write", "path": str(workspace / "new" / "f.txt"), "content": "hi"})
    assert wrote["ok"] and (workspace / "new" / "f.txt").read_text() == "hi", wrote
    assert jail._spare is spare
    # Glob and Grep walk trees of any size: a fork of the agent (the spare) in the call's cgroup runs them.
    found = await run_in_jail(jail, {"op": "glob", "path": str(workspace), "pattern": "**/*.txt"})
    assert found["ok"] and str(workspace / "new" / "f.txt") in found["details"]["paths"], found
    assert jail._spare is not spare


async def _served_by_a_fork(jail: bwrap_warm.WarmBwrapJail, request: dict[str, object]) -> dict[str, object]:
    """``request``'s reply, checking that the agent declined it and the spare (the call's own process) ran it."""
    from sandbox.tools.run import run_in_jail

    spare, _pid = await _placed_spare(jail)
    with anyio.fail_after(30):
        reply = await run_in_jail(jail, request)
    assert jail._spare is not spare, f"the agent served {request['op']} itself"
    return dict(reply)


async def test_what_the_agent_must_not_hold_or_open_goes_to_the_calls_own_process(
    jail: bwrap_warm.WarmBwrapJail, workspace: Path
) -> None:
    """The agent is outside the call's cgroup: it declines what could make it big, slow or someone else.

    A file past its bound (it could be any size: Read's memory would be the agent's), a directory
    of many thousand names, a large Write, and paths under /proc (/proc/self is the agent), /sys
    and /dev all go to the spare, placed in the call's cgroup; the replies are the same.
    """
    big = workspace / "big.txt"
    big.write_bytes(b"line\n" * (300 * 1024))  # 1.5 MiB
    read = await _served_by_a_fork(jail, {"op": "read", "path": str(big), "limit": 3})
    assert read["ok"] and read["details"]["lines"] == 300 * 1024, read  # type: ignore[index]
    raw = await _served_by_a_fork(jail, {"op": "read", "path": str(big), "raw": True})
    assert raw["ok"] and raw["details"]["size"] == big.stat().st_size  # type: ignore[index]
    many = workspace / "many"
    many.mkdir()
    for index in range(5000):
        (many / f"f{index}").touch()
    listed = await _served_by_a_fork(jail, {"op": "ls", "path": str(many)})
    assert listed["ok"] and listed["details"]["count"] == 5000, listed  # type: ignore[index]
    edited = await _served_by_a_fork(
        jail, {"op": "edit", "path": str(big), "edits": [{"old_text": "line\nline\n", "new_text": "x"}]}
    )
    assert (edited["ok"], edited["error_code"]) == (False, "TOOL_FAILED"), edited  # matched many times
    content = "y" * (128 * 1024)
    wrote = await _served_by_a_fork(jail, {"op": "write", "path": str(workspace / "w.txt"), "content": content})
    assert wrote["ok"] and (workspace / "w.txt").read_text() == content, wrote
    proc = await _served_by_a_fork(jail, {"op": "read", "path": "/proc/version"})
    assert proc["ok"] and "Linux" in str(proc["content"]), proc


async def test_a_fifo_or_a_broken_request_does_not_hang_or_harm_the_agent(
    jail: bwrap_warm.WarmBwrapJail, workspace: Path
) -> None:
    from sandbox.tools.run import run_in_jail

    first = _agent_pid(jail)
    os.mkfifo(workspace / "pipe")
    with anyio.fail_after(10):  # no writer: an open or a read that blocked would hang the agent
        read = await run_in_jail(jail, {"op": "read", "path": str(workspace / "pipe")})
        wrote = await run_in_jail(jail, {"op": "write", "path": str(workspace / "pipe"), "content": "x"})
    assert (read["ok"], read["error_code"]) == (False, "INVALID_ARGUMENT"), read
    assert (wrote["ok"], wrote["error_code"]) == (False, "INVALID_ARGUMENT"), wrote
    # Not UTF-8: the runner's decode fails unexpectedly; in the agent that is a decline, and the
    # forked runner fails as it always did, structured, its traceback in the reply.
    (workspace / "latin1.txt").write_bytes(b"caf\xe9\n")
    broken = await _served_by_a_fork(
        jail, {"op": "edit", "path": str(workspace / "latin1.txt"), "edits": [{"old_text": "caf", "new_text": "x"}]}
    )
    assert (broken["ok"], broken["error_code"]) == (False, "TOOL_FAILED"), broken
    assert "UnicodeDecodeError" in str(broken["content"])
    assert (workspace / "latin1.txt").read_bytes() == b"caf\xe9\n"
    after = await _sh(jail, "echo fine")
    assert after.stdout == "fine\n" and _agent_pid(jail) == first


async def test_under_a_file_size_limit_the_agent_serves_no_file_tool(workspace: Path) -> None:
    """The agent has none of a call's rlimits: a limit below what it could write keeps every tool forked."""
    from sandbox.tools.run import run_in_jail

    backend = backend_or_skip("bwrap")
    limit = 1024 * 1024
    opened = await backend.open_jail(
        workspace, make_profile(**{"bwrap.lifecycle": "session", "limits.file_size": limit})
    )
    assert isinstance(opened, bwrap_warm.WarmBwrapJail)
    try:
        near = workspace / "near.txt"
        near.write_text("x" * (limit - 10) + "\nend\n")
        grown = await _served_by_a_fork(
            opened, {"op": "edit", "path": str(near), "edits": [{"old_text": "end", "new_text": "end" * 40}]}
        )
        assert (grown["ok"], grown["error_code"]) == (False, "TOOL_FAILED"), grown  # EFBIG, as for a command
        assert near.read_text().endswith("\nend\n")
        read = await run_in_jail(opened, {"op": "read", "path": str(near), "offset": 2})
        assert read["ok"] and "end" in read["content"], read
    finally:
        await opened.aclose()
