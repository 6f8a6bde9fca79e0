"""One hostile session against another's Read latency, through one ``sandbox serve`` (bubblewrap).

Every session of an agent shares one server process (issue 31, category 4). A quiet session's
Read is timed alone, then while a hostile one floods the server with each of these in turn:

* ``review diff``: ``changes.show`` of a changeset whose files make difflib quadratic (two large
  files of unique lines sharing every other one), over and over;
* ``write review``: Writes whose review record diffs such a file, over and over;
* ``deep lines``: lines nested 100,000 deep (each a parse error);
* ``oversized lines``: lines longer than the server reads (each skipped to its end, refused).

The line floods come from the client itself, on the one ordered pipe that also carries the quiet
session's requests: its Read waits behind the flood's bytes (a whole 64 MiB line, read and
dropped) whatever the server does, so their ratios measure that pipe, not a stall; they are
printed and held to the same target all the same. Descriptor pressure (EMFILE) is not flooded
here: the limit is the process's, so lowering it fails every session's calls alike
(``tests/attack/test_server_stall.py`` checks that the server survives it). Target: each
flood's median Read latency within 2x the quiet one, and the server alive at the end. Exit 1 when a target is missed.

Usage: ``python bench/bench_stall.py [--reads 40]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import anyio.lowlevel

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from tests.rpc_client import MAX_LINE, SANDBOX, serve  # noqa: E402 - after the checkout is on the path

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from tests.rpc_client import Client

TARGET = 2.0
LINES = 12_000  # under the diff's size bound: its deadline is what ends each review
SERVER_MAX_LINE = 64 * 1024 * 1024


class Mux:
    """Concurrent requests over one client: a reader task hands each reply to its waiter."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.waiting: dict[int, anyio.Event] = {}
        self.replies: dict[int, dict[str, Any]] = {}

    async def read(self) -> None:
        while True:
            message = json.loads(await self.client.lines.receive_until(b"\n", MAX_LINE))
            rid = message.get("id")
            if message.get("method") == "approval.request":
                await self.client.send({"jsonrpc": "2.0", "id": rid, "result": {"decision": "allow-once"}})
            elif "method" not in message and rid in self.waiting:
                self.replies[rid] = message
                self.waiting.pop(rid).set()

    async def call(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        self.client.next_id += 1
        rid = self.client.next_id
        done = self.waiting[rid] = anyio.Event()
        await self.client.send({"jsonrpc": "2.0", "id": rid, "method": method, "params": params})
        await done.wait()
        return self.replies.pop(rid)

    async def raw(self, data: bytes) -> None:
        assert self.client.proc.stdin is not None
        await self.client.proc.stdin.send(data)


async def read_latency(mux: Mux, sid: str, reads: int) -> float:
    """The median time of ``reads`` sequential Reads of README.md in session ``sid``."""
    took = []
    for _ in range(reads):
        started = time.perf_counter()
        reply = await mux.call("tool.call", {"session_id": sid, "tool": "Read", "args": {"path": "README.md"}})
        took.append(time.perf_counter() - started)
        assert reply["result"]["ok"], reply
    return statistics.median(took)


def interleaved(path: str) -> str:
    return f'seq 1 {LINES} | awk \'{{ if (NR % 2) print "changed " NR; else print "line " NR }}\' > {path}'


async def hostile_changeset(mux: Mux, workspace: Path, profile: Path) -> str:
    opened = await mux.call("session.open", {"workspace": str(workspace), "profile": str(profile), "mode": "auto"})
    sid = opened["result"]["session_id"]
    command = f"{interleaved('a.txt')} && {interleaved('b.txt')}"
    await mux.call("tool.call", {"session_id": sid, "tool": "Bash", "args": {"command": command}})
    closed = await mux.call("session.close", {"session_id": sid})
    return str(closed["result"]["changeset_id"])


def floods(mux: Mux, changeset: str, writer: str) -> dict[str, Callable[[], Awaitable[Any]]]:
    content = "".join(f"changed {n}\n" if n % 2 else f"line {n}\n" for n in range(1, LINES + 1))
    big = b"x" * (SERVER_MAX_LINE + 1024) + b"\n"
    return {
        "review diff": lambda: mux.call("changes.show", {"changeset_id": changeset}),
        "write review": lambda: mux.call(
            "tool.call", {"session_id": writer, "tool": "Write", "args": {"path": "a.txt", "content": content}}
        ),
        "deep lines": lambda: mux.raw(b"[" * 100_000 + b"]" * 100_000 + b"\n"),
        "oversized lines": lambda: mux.raw(big),
    }


async def under_flood(mux: Mux, sid: str, reads: int, flood: Callable[[], Awaitable[Any]]) -> float:
    async with anyio.create_task_group() as tg:

        async def flooding() -> None:
            while True:
                await flood()
                await anyio.lowlevel.checkpoint()

        tg.start_soon(flooding)
        await anyio.sleep(0.2)  # the flood is under way
        latency = await read_latency(mux, sid, reads)
        tg.cancel_scope.cancel()
    return latency


async def measure(workspace: Path, reads: int) -> tuple[float, dict[str, float], bool]:
    profile = workspace.parent / "stall.toml"
    profile.write_text('backend = "bwrap"\n\n[mount]\nstrategy = "copy"\n')
    async with serve() as client, anyio.create_task_group() as tg:
        mux = Mux(client)
        tg.start_soon(mux.read)
        opened = await mux.call("session.open", {"workspace": str(workspace), "profile": str(profile), "mode": "auto"})
        quiet_sid = opened["result"]["session_id"]
        changeset = await hostile_changeset(mux, workspace, profile)
        writer = await mux.call("session.open", {"workspace": str(workspace), "profile": str(profile), "mode": "auto"})
        writer_sid = writer["result"]["session_id"]
        plant = {"command": interleaved("a.txt")}
        await mux.call("tool.call", {"session_id": writer_sid, "tool": "Bash", "args": plant})
        await read_latency(mux, quiet_sid, 5)  # warm
        quiet = await read_latency(mux, quiet_sid, reads)
        flooded = {}
        for name, flood in floods(mux, changeset, writer_sid).items():
            flooded[name] = await under_flood(mux, quiet_sid, reads, flood)
        alive = (await mux.call("initialize", {"client": "bench"})).get("result") is not None
        tg.cancel_scope.cancel()
    return quiet, flooded, alive


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reads", type=int, default=40)
    args = parser.parse_args()
    if not Path(SANDBOX).exists():
        print(f"skipped: no {SANDBOX}")
        return 0
    with tempfile.TemporaryDirectory(dir="/var/tmp") as tmp:
        workspace = Path(tmp) / "ws"
        workspace.mkdir()
        (workspace / "README.md").write_text("# sample\n")
        for name in ("a.txt", "b.txt"):
            (workspace / name).write_text("".join(f"line {n}\n" for n in range(1, LINES + 1)))
        quiet, flooded, alive = anyio.run(measure, workspace, args.reads)
    print(f"a quiet session's Read, median of {args.reads}: {quiet * 1000:.2f} ms")
    missed = [] if alive else ["the server did not survive"]
    for name, latency in flooded.items():
        ratio = latency / quiet
        print(f"  under a {name} flood: {latency * 1000:.2f} ms ({ratio:.2f}x quiet)")
        if ratio > TARGET:
            missed.append(f"{name} {ratio:.2f}x > {TARGET}x")
    print(json.dumps({"quiet_ms": quiet * 1000, **{k: v / quiet for k, v in flooded.items()}, "alive": alive}))
    print("target met" if not missed else f"missed: {'; '.join(missed)}")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
