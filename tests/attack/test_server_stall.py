"""One session cannot stall or crash the server (issue 31, category 4), through the real ``sandbox serve``.

Every session of an agent shares one server process. The attacks: a jail writes files whose review
diff is quadratic (two large files of unique lines that share every other one), the client side
sends a line nested 100,000 deep or longer than the server reads, and the process runs out of
descriptors. Each time another session's Read must still be answered, the hostile request gets a
structured error or a summary, and the server keeps serving. Bounds here are functional (which
reply comes first, a generous ceiling), never tight timings: ``bench/bench_stall.py`` measures.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import subprocess
from typing import TYPE_CHECKING, Any

import anyio
import pytest

from tests.conftest import DOCKER_RUNSC, MICROVM, RUNSC, own_like_a_checkout
from tests.rpc_client import MAX_LINE, Client, serve

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterator
    from pathlib import Path

    from sandbox.backends import base

pytestmark = [pytest.mark.anyio]

SERVER_MAX_LINE = 64 * 1024 * 1024  # sandbox.jsonrpc.MAX_LINE: what one line may hold
ANSWER_S = 90.0  # generous: a reply the server owes within this is "answered"
# 12,000 lines sharing every other one: difflib alone takes many seconds (quadratic); under the
# size bound, so the review's deadline is what ends it. 40,000: past the size bound.
SLOW_LINES, HUGE_LINES = 12_000, 40_000


@pytest.fixture
def profile_file(backend: base.Backend, request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    """A profile naming the backend and lifecycle the ``backend`` param stands for, workspace copied."""
    param = str(request.node.callspec.params["backend"])
    lifecycle = "call" if param.endswith("-call") else "session"
    # The server is another process, which no patch of the fixture's reaches: the profile names the runtime.
    runtime = f'runtime = "{RUNSC}"\n' if param == DOCKER_RUNSC else ""
    # The microVM has no table: a VM per session, none per call.
    table = "" if backend.name == MICROVM else f'[{backend.name}]\nlifecycle = "{lifecycle}"\n{runtime}'
    path = tmp_path / "stall.toml"
    path.write_text(f'backend = "{backend.name}"\nrequires = []\n\n[mount]\nstrategy = "copy"\n\n{table}')
    return path


@pytest.fixture
async def client() -> AsyncIterator[Client]:
    async with serve() as c:
        init = await c.call("initialize", {"client": "stall"})
        assert "result" in init
        yield c


async def open_session(client: Client, workspace: Path, profile: Path) -> str:
    reply = await client.call("session.open", {"workspace": str(workspace), "profile": str(profile), "mode": "auto"})
    assert "result" in reply, reply
    return str(reply["result"]["session_id"])


async def read_readme(client: Client, sid: str) -> dict[str, Any]:
    reply = await client.call("tool.call", {"session_id": sid, "tool": "Read", "args": {"path": "README.md"}})
    assert reply["result"]["ok"] is True, reply
    assert "# sample" in reply["result"]["content"]
    return reply


async def replies_in_order(client: Client, requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Send ``requests`` at once and return their replies in the order they arrived (approvals allowed)."""
    wanted = {}
    for params in requests:
        client.next_id += 1
        wanted[client.next_id] = params
        await client.send({"jsonrpc": "2.0", "id": client.next_id, **params})
    arrived: list[dict[str, Any]] = []
    with anyio.fail_after(ANSWER_S):
        while len(arrived) < len(wanted):
            message = json.loads(await client.lines.receive_until(b"\n", MAX_LINE))
            if message.get("id") in wanted and "method" not in message:
                arrived.append(message)
            elif message.get("method") == "approval.request":
                await client.send({"jsonrpc": "2.0", "id": message["id"], "result": {"decision": "allow-once"}})
    return arrived


async def parse_error(client: Client) -> dict[str, Any]:
    """The next reply with a null id: what the server says of a line it could not read."""
    with anyio.fail_after(ANSWER_S):
        while True:
            message: dict[str, Any] = json.loads(await client.lines.receive_until(b"\n", MAX_LINE))
            if "id" in message and message["id"] is None and "error" in message:
                return message


def interleaved_script(path: str, lines: int) -> str:
    """A Bash command rewriting ``path`` (``line N`` for N in 1..lines) so every other line differs."""
    return f'seq 1 {lines} | awk \'{{ if (NR % 2) print "changed " NR; else print "line " NR }}\' > {path}'


def numbered(lines: int) -> str:
    return "".join(f"line {n}\n" for n in range(1, lines + 1))


async def test_a_huge_review_diff_does_not_hold_back_another_sessions_read(
    client: Client, workspace: Path, profile_file: Path
) -> None:
    (workspace / "slow.txt").write_text(numbered(SLOW_LINES))
    (workspace / "huge.txt").write_text(numbered(HUGE_LINES))
    own_like_a_checkout(workspace)  # the jail's user (Docker's uid 1000) may rewrite them
    hostile = await open_session(client, workspace, profile_file)
    other = await open_session(client, workspace, profile_file)
    command = f"{interleaved_script('slow.txt', SLOW_LINES)} && {interleaved_script('huge.txt', HUGE_LINES)}"
    wrote = await client.call("tool.call", {"session_id": hostile, "tool": "Bash", "args": {"command": command}})
    assert wrote["result"]["ok"] is True, wrote
    closed = await client.call("session.close", {"session_id": hostile})
    changeset = closed["result"]["changeset_id"]
    assert changeset is not None, closed

    show = {"method": "changes.show", "params": {"changeset_id": changeset}}
    read = {"method": "tool.call", "params": {"session_id": other, "tool": "Read", "args": {"path": "README.md"}}}
    first, second = await replies_in_order(client, [show, read])
    assert "# sample" in first["result"]["content"], "the Read waited for the review's diff"
    diff = second["result"]["diff"]
    assert diff.count("diff omitted") == 2, diff[:2000]
    assert "modified slow.txt" in diff and "modified huge.txt" in diff
    await read_readme(client, other)


async def test_a_write_over_a_hostile_file_keeps_its_review_off_the_event_loop(
    client: Client, workspace: Path, profile_file: Path
) -> None:
    """A Write's review record diffs the jail's file against the new content: never on the loop."""
    hostile = await open_session(client, workspace, profile_file)
    other = await open_session(client, workspace, profile_file)
    planted = await client.call(
        "tool.call", {"session_id": hostile, "tool": "Bash", "args": {"command": f"seq 1 {SLOW_LINES} > slow.txt"}}
    )
    assert planted["result"]["ok"] is True, planted
    content = "".join(f"changed {n}\n" if n % 2 else f"{n}\n" for n in range(1, SLOW_LINES + 1))
    write = {
        "method": "tool.call",
        "params": {"session_id": hostile, "tool": "Write", "args": {"path": "slow.txt", "content": content}},
    }
    read = {"method": "tool.call", "params": {"session_id": other, "tool": "Read", "args": {"path": "README.md"}}}
    first, second = await replies_in_order(client, [write, read])
    assert "# sample" in first["result"]["content"], "the Read waited for the Write's review diff"
    review = second["result"]["review"]
    assert second["result"]["ok"] is True and "diff omitted" in review["omitted"], review
    assert review["truncated"] is True and review["hunks"] == []


async def test_a_line_nested_too_deep_gets_a_parse_error_and_the_server_lives(
    client: Client, workspace: Path, profile_file: Path
) -> None:
    sid = await open_session(client, workspace, profile_file)
    await read_readme(client, sid)
    assert client.proc.stdin is not None
    await client.proc.stdin.send(b"[" * 100_000 + b"]" * 100_000 + b"\n")
    error = await parse_error(client)
    assert error["error"]["code"] == -32700 and "nested deeper" in error["error"]["message"]
    nested = {"client": json.loads("[" * 100 + "]" * 100)}  # parses, but deeper than any message of ours
    await client.send({"jsonrpc": "2.0", "id": "deep", "method": "initialize", "params": nested})
    assert (await parse_error(client))["error"]["code"] == -32700
    await read_readme(client, sid)


async def test_a_line_longer_than_the_server_reads_is_refused_and_the_server_lives(
    client: Client, workspace: Path, profile_file: Path
) -> None:
    sid = await open_session(client, workspace, profile_file)
    assert client.proc.stdin is not None
    chunk = b"x" * (1 << 20)
    with anyio.fail_after(ANSWER_S):
        for _ in range(SERVER_MAX_LINE // len(chunk) + 4):  # past the bound, and no newline yet
            await client.proc.stdin.send(chunk)
        await client.proc.stdin.send(b"\n")
    error = await parse_error(client)
    assert error["error"]["code"] == -32700 and "longer than" in error["error"]["message"]
    await read_readme(client, sid)


async def test_running_out_of_descriptors_fails_the_call_not_the_server(
    client: Client, workspace: Path, profile_file: Path
) -> None:
    sid = await open_session(client, workspace, profile_file)
    await read_readme(client, sid)
    pid = client.proc.pid
    limits = resource.prlimit(pid, resource.RLIMIT_NOFILE)
    in_use = len(os.listdir(f"/proc/{pid}/fd"))
    resource.prlimit(pid, resource.RLIMIT_NOFILE, (in_use, limits[1]))  # not one descriptor more
    try:
        bash = await client.call("tool.call", {"session_id": sid, "tool": "Bash", "args": {"command": "echo hi"}})
        opened = await client.call("session.open", {"workspace": str(workspace), "profile": str(profile_file)})
    finally:
        resource.prlimit(pid, resource.RLIMIT_NOFILE, limits)
    for reply in (bash, opened):  # each a failure naming the resource, as an error or a failed result
        assert "error" in reply or reply["result"]["ok"] is False, reply
        assert "EMFILE" in json.dumps(reply) or "Too many open files" in json.dumps(reply), reply
    await read_readme(client, sid)
    await read_readme(client, await open_session(client, workspace, profile_file))


@pytest.fixture
def small_data_disk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A 16 MiB tmpfs as the server's data directory (root only: mounting one)."""
    mount_point = tmp_path / "small-data"
    mount_point.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=16m,mode=0700", "tmpfs", str(mount_point)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs for the data directory: {done.stderr.strip()}")
    monkeypatch.setenv("SANDBOX_DATA_DIR", str(mount_point))
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


def fill(disk: Path) -> Path:
    """Fill ``disk`` to its last block; the filler file, to remove to free it again."""
    filler = disk / "filler"
    with open(filler, "wb") as fh, contextlib.suppress(OSError):
        while True:
            fh.write(b"\0" * (1 << 16))
            fh.flush()
    return filler


@pytest.mark.root
async def test_a_full_data_disk_fails_the_call_not_the_server(
    small_data_disk: Path, workspace: Path, profile_file: Path
) -> None:
    async with serve() as client:
        sid = await open_session(client, workspace, profile_file)
        await read_readme(client, sid)
        filler = fill(small_data_disk)
        try:
            bash = await client.call(
                "tool.call", {"session_id": sid, "tool": "Bash", "args": {"command": "echo hi > new.txt"}}
            )
            opened = await client.call("session.open", {"workspace": str(workspace), "profile": str(profile_file)})
            closed = await client.call("session.close", {"session_id": sid})
        finally:
            filler.unlink()
        assert bash["result"]["ok"] is False and "No space left" in bash["result"]["content"], bash
        for reply in (opened, closed):  # what the server itself wrote: a structured error naming the errno
            assert reply["error"]["data"]["code"] == "TOOL_FAILED", reply
            assert reply["error"]["data"]["data"]["errno"] == "ENOSPC", reply
        await read_readme(client, await open_session(client, workspace, profile_file))
