"""The fake backend itself: scripted streams apart and in order, exit codes, recorded kills."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, get_args

import anyio
import pytest
from anyio.streams.buffered import BufferedByteReceiveStream

from sandbox import exec as executor
from sandbox.backends import AUTO_ORDER, BACKENDS, base
from sandbox.backends.fake import Call, FakeBackend, Kill, Script, Step, default_script
from sandbox.errors import InvalidArgument
from sandbox.vocabulary import Guarantee
from tests.unit.fake_support import fake_profile, only_process, open_fake

if TYPE_CHECKING:
    from anyio.abc import ByteReceiveStream

pytestmark = pytest.mark.anyio

BASH = ("/bin/sh", "-c", 'exec bash -c "$1"', "sandbox-bash")


async def chunks(stream: ByteReceiveStream) -> list[bytes]:
    return [chunk async for chunk in stream]


@pytest.fixture
def fake() -> FakeBackend:
    return FakeBackend()


async def test_streams_arrive_apart_and_in_order(fake: FakeBackend, workspace: Path) -> None:
    steps: list[Step] = [("stdout", b"a"), ("stderr", b"x"), ("stdout", b"b"), 0.05, ("stderr", b"y"), ("stdout", b"c")]
    fake.scripts["run"] = Script(steps, exit_code=3)
    jail = await open_fake(fake, workspace)
    proc = await jail.spawn(["run"])
    got: dict[str, list[bytes]] = {}

    async def collect(name: str, stream: ByteReceiveStream) -> None:
        got[name] = await chunks(stream)

    async with anyio.create_task_group() as tg:
        tg.start_soon(collect, "stdout", proc.stdout)
        tg.start_soon(collect, "stderr", proc.stderr)
    assert got == {"stdout": [b"a", b"b", b"c"], "stderr": [b"x", b"y"]}
    assert await proc.wait() == 3 and proc.running_pids() == []
    await jail.aclose()


async def test_pauses_take_their_time_and_reads_honour_max_bytes(fake: FakeBackend, workspace: Path) -> None:
    fake.scripts["slow"] = Script([0.2, ("stdout", b"abcdef")])
    jail = await open_fake(fake, workspace)
    proc = await jail.spawn(["slow"])
    started = time.monotonic()
    assert proc.running_pids() != []
    assert await proc.stdout.receive(4) == b"abcd" and time.monotonic() - started >= 0.2
    assert await proc.stdout.receive() == b"ef"
    with pytest.raises(anyio.EndOfStream):
        await proc.stdout.receive()
    assert await proc.wait() == 0
    await jail.aclose()


async def test_kill_tree_records_its_grace_and_ends_everything(fake: FakeBackend, workspace: Path) -> None:
    fake.scripts["hang"] = Script.hang([("stdout", b"started\n")])
    jail = await open_fake(fake, workspace)
    await jail.spawn(["hang"])
    proc = only_process(jail)
    assert await proc.stdout.receive() == b"started\n" and proc.running_pids() == [proc.pid]
    await proc.kill_tree(0.25)
    assert proc.kills == [Kill(0.25, (proc.pid,))] and proc.running_pids() == []
    assert await proc.wait() == -15
    assert await chunks(proc.stdout) == [] and await chunks(proc.stderr) == []
    await jail.aclose()
    assert len(proc.kills) == 1  # closing the jail found nothing left to kill


async def test_a_term_ignoring_script_waits_out_the_grace(fake: FakeBackend, workspace: Path) -> None:
    fake.scripts["stubborn"] = Script((math.inf,), ignores_term=True)
    jail = await open_fake(fake, workspace)
    proc = await jail.spawn(["stubborn"])
    started = time.monotonic()
    await proc.kill_tree(0.2)
    assert time.monotonic() - started >= 0.2 and await proc.wait() == -9
    await jail.aclose()


async def test_a_leftover_holds_the_pipes_until_killed(fake: FakeBackend, workspace: Path) -> None:
    fake.scripts["daemonize"] = Script([("stdout", b"forked\n")], leaves_running=True)
    jail = await open_fake(fake, workspace)
    await jail.spawn(["daemonize"])
    proc = only_process(jail)
    assert await proc.wait() == 0
    assert proc.running_pids() == [proc.child_pid] and await proc.stdout.receive() == b"forked\n"
    with anyio.move_on_after(0.1) as waited:
        await proc.stdout.receive()
    assert waited.cancelled_caught  # no end of stream while a child holds the pipe
    await proc.kill_tree(0)
    assert proc.running_pids() == [] and await chunks(proc.stdout) == []
    await jail.aclose()


async def test_oom_and_peak_memory_are_reported_as_scripted(fake: FakeBackend, workspace: Path) -> None:
    fake.scripts["hog"] = Script(exit_code=-9, oom_killed=True, peak_memory=512 << 20)
    jail = await open_fake(fake, workspace)
    result = await executor.run(jail, ["hog"])
    assert (result.exit_code, result.signal, result.oom_killed, result.peak_memory_bytes) == (137, 9, True, 512 << 20)
    assert only_process(jail).released
    await jail.aclose()


async def test_stdin_bytes_and_streams_are_recorded(fake: FakeBackend, workspace: Path) -> None:
    fake.scripts["cat"] = Script([0.2])  # the executor stops feeding stdin once a command exits
    jail = await open_fake(fake, workspace)
    await executor.run(jail, ["cat"], stdin=b"given whole")
    send, receive = anyio.create_memory_object_stream[bytes](4)
    async with send:
        await send.send(b"streamed ")
        await send.send(b"in parts")
    async with receive:
        await executor.run(jail, ["cat"], stdin=BufferedByteReceiveStream(receive))
    assert [p.stdin_received for p in jail.processes] == [b"given whole", b"streamed in parts"]
    assert jail.processes[0].call.stdin == b"given whole" and jail.processes[1].call.stdin is None
    await jail.aclose()


async def test_a_slow_fake_times_out_and_its_tree_kill_is_recorded(fake: FakeBackend, workspace: Path) -> None:
    fake.scripts["slow"] = Script.hang([("stdout", b"working\n")])
    jail = await open_fake(fake, workspace, **{"timeouts.kill_grace_s": 0.3})
    result = await executor.run(jail, ["slow"], timeout=1)
    proc = only_process(jail)
    assert result.timed_out and not result.aborted and result.stdout == "working\n"
    assert (result.exit_code, result.signal) == (143, 15) and result.kill_ms is not None
    assert proc.kills == [Kill(0.3, (proc.pid,))] and proc.running_pids() == []
    await jail.aclose()


async def test_an_abort_kills_and_is_recorded(fake: FakeBackend, workspace: Path) -> None:
    fake.scripts["slow"] = Script.hang()
    jail = await open_fake(fake, workspace)
    abort = anyio.Event()
    async with anyio.create_task_group() as tg:
        tg.start_soon(_set_soon, abort)
        result = await executor.run(jail, ["slow"], abort=abort)
    proc = only_process(jail)
    assert result.aborted and not result.timed_out
    assert [k.grace for k in proc.kills] == [jail.profile.timeouts.kill_grace_s] and proc.running_pids() == []
    await jail.aclose()


async def test_a_cancelled_caller_still_kills_the_tree(fake: FakeBackend, workspace: Path) -> None:
    fake.scripts["slow"] = Script.hang()
    jail = await open_fake(fake, workspace)
    with anyio.move_on_after(0.2) as scope:
        await executor.run(jail, ["slow"])
    proc = only_process(jail)
    assert scope.cancelled_caught and proc.kills and proc.kills[0].pids == (proc.pid,)
    assert proc.running_pids() == [] and proc.released
    await jail.aclose()


async def test_closing_the_jail_kills_what_runs(fake: FakeBackend, workspace: Path) -> None:
    fake.scripts["slow"] = Script.hang()
    jail = await open_fake(fake, workspace)
    await jail.spawn(["slow"])
    proc = only_process(jail)
    await jail.aclose()
    assert proc.kills == [Kill(jail.profile.timeouts.kill_grace_s, (proc.pid,))]


async def test_a_handler_sees_the_call_and_scripts_win_over_it(workspace: Path) -> None:
    seen: list[Call] = []

    def handler(call: Call) -> Script:
        seen.append(call)
        return Script.output(stderr=call.command.encode(), exit_code=7)

    fake = FakeBackend(handler, scripts={"named": Script.output(b"scripted")})
    jail = await open_fake(fake, workspace)
    named = await executor.run(jail, ["named"])
    other = await executor.run(jail, [*BASH, "make test"], env={"A": "1"}, cwd="/w")
    assert (named.stdout, named.exit_code) == ("scripted", 0)
    assert (other.stderr, other.exit_code) == ("make test", 7)
    assert seen == [Call((*BASH, "make test"), {"A": "1"}, "/w", None)]
    await jail.aclose()


# -- the unscripted default ----------------------------------------------------------------------


def bash(command: str, **env: str) -> Script:
    return default_script(Call((*BASH, command), env))


def test_default_reads_echo_sleep_exit_and_stderr() -> None:
    script = bash("echo out; echo err >&2; sleep 0.5; echo $WHO ${WHO}; exit 4", WHO="me")
    assert list(script.steps) == [("stdout", b"out\n"), ("stderr", b"err\n"), 0.5, ("stdout", b"me me\n")]
    assert script.exit_code == 4


def test_default_knows_and_and_true_false() -> None:
    assert (bash("false && echo no").steps, bash("false && echo no").exit_code) == ((), 1)
    assert bash("true && echo yes").steps == (("stdout", b"yes\n"),)
    assert bash("sleep infinity").steps == (math.inf,)


def test_default_says_command_not_found_like_a_shell() -> None:
    script = bash("make test")
    assert script.exit_code == 127 and len(script.steps) == 1
    assert isinstance(step := script.steps[0], tuple) and b"make: command not found" in step[1]
    assert bash("echo 'unbalanced").exit_code == 2
    piped = bash("echo a | tr a b")
    assert piped.exit_code == 2 and isinstance(step := piped.steps[1], tuple) and b"interpret '|'" in step[1]
    assert bash("sleep soon").exit_code == 1 and bash("sleep").exit_code == 1


def test_default_file_tool_reply_is_a_plain_tool_failure() -> None:
    call = Call(("python3", "-I", "-S", "-c", "SOURCE"), stdin=b'{"op": "read", "path": "/w/a.txt"}')
    assert call.is_file_tool and call.request() == {"op": "read", "path": "/w/a.txt"}
    step = default_script(call).steps[0]
    assert isinstance(step, tuple) and step[0] == "stdout"
    reply = json.loads(step[1])
    assert (reply["ok"], reply["error_code"]) == (False, "TOOL_FAILED")
    assert "runs no file tools" in reply["content"] and reply["details"]["op"] == "read"


def test_checked_argv_and_plain_argv_read_as_commands() -> None:
    checked = Call(("/bin/sh", "-c", "CHECK", "sandbox", "", "echo", "a b"))
    assert checked.command == "echo 'a b'" and Call(("ls", "-l")).command == "ls -l"


# -- probe and loader --------------------------------------------------------------------------------


def test_probe_grants_everything_and_says_it_enforces_nothing() -> None:
    report = FakeBackend().probe()
    assert report.available and set(report.guarantees) == set(get_args(Guarantee))
    assert all(report.guarantees.values()) and report.details["enforces"] == "nothing"
    assert "enforces nothing" in report.details["warning"]
    assert report.missing(fake_profile("untrusted").requires, fake_profile("untrusted")) == {}


def test_never_offered_nor_chosen_by_auto() -> None:
    assert "fake" not in BACKENDS and "fake" not in AUTO_ORDER


def test_the_loader_hands_out_the_fake_by_name() -> None:
    assert isinstance(base.get("fake"), FakeBackend)
    offered = "auto, bwrap, docker, landlock, microvm, host, winjob"
    with pytest.raises(InvalidArgument, match=f"unknown backend 'fake'; choose one of {offered}"):
        base.get("fake", offered=True)


@pytest.mark.parametrize(
    "argv", [["run", "--backend", "fake", "--", "echo", "hi"], ["tool", "Bash", "--backend", "fake"]]
)
def test_the_cli_refuses_the_fake(argv: list[str], tmp_path: Path) -> None:
    """A user who names it gets the real backends' list, never a toy shell's answer."""
    sandbox = str(Path(sys.executable).with_name("sandbox"))
    args = [*argv, "--args", json.dumps({"command": "echo hi"})] if argv[0] == "tool" else argv
    done = subprocess.run([sandbox, *args], cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 125, done
    assert "hi" not in done.stdout
    assert "unknown backend 'fake'" in done.stderr


async def test_the_template_checks_still_apply(fake: FakeBackend, tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument):
        await open_fake(fake, tmp_path / "missing")
    jail = await open_fake(fake, tmp_path)
    with pytest.raises(InvalidArgument):
        await jail.spawn([])
    await jail.aclose()
    assert fake.jails == [jail]


async def _set_soon(event: anyio.Event) -> None:
    await anyio.sleep(0.1)
    event.set()
