"""Sustained load (behind the ``soak`` marker; ``make soak``, which CI runs).

``sandbox serve`` with ``SESSIONS`` concurrent sessions making ``CALLS`` mixed calls (Bash
with output on both streams, every file tool, timeouts, cancellations, denied approvals), over
each backend. Afterwards: no process, cgroup, container, copy, scratch directory or open file
descriptor of theirs remains; every call has exactly one audit record; the executor's memory is
flat after warm-up; p50/p99 per tool are reported (``ci-artifacts/soak/``). A second test kills
the executor with SIGKILL at random moments under load: ``sandbox gc`` and the next start leave
nothing behind, and the audit database passes ``PRAGMA integrity_check``.

``SANDBOX_SOAK_CALLS`` is the calls per backend (default 2,500: 5,000 in all over the two).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import socket
import sqlite3
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import psutil
import pytest
from anyio.streams.buffered import BufferedByteReceiveStream

from sandbox.backends import cgroups
from tests.conftest import backend_or_skip, own_like_a_checkout

pytestmark = [pytest.mark.soak, pytest.mark.anyio, pytest.mark.timeout(3600)]
SANDBOX = str(Path(sys.executable).with_name("sandbox"))
SESSIONS = 20
CALLS = int(os.environ.get("SANDBOX_SOAK_CALLS", "2500"))  # per backend
ARTIFACTS = Path(os.environ.get("SANDBOX_SOAK_REPORT", "ci-artifacts/soak"))
MAX_LINE = 1 << 26


class Client:
    """Concurrent JSON-RPC over a ``sandbox serve`` child: replies matched by id, approvals answered."""

    def __init__(self, proc: anyio.abc.Process) -> None:
        assert proc.stdout is not None and proc.stdin is not None
        self.proc = proc
        self.lines = BufferedByteReceiveStream(proc.stdout)
        self.next_id = 0
        self.waiting: dict[int, tuple[anyio.Event, list[dict[str, Any]]]] = {}
        self.lock = anyio.Lock()
        self.approvals = 0

    async def send(self, message: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        async with self.lock:
            await self.proc.stdin.send((json.dumps(message) + "\n").encode())

    async def read_forever(self) -> None:
        with contextlib.suppress(anyio.EndOfStream, anyio.IncompleteRead, anyio.ClosedResourceError):
            while True:
                message = json.loads(await self.lines.receive_until(b"\n", MAX_LINE))
                if message.get("method") == "approval.request":
                    self.approvals += 1
                    # Deny every other one: denied approvals are part of the mix.
                    decision = "deny" if self.approvals % 2 else "allow-once"
                    await self.send({"jsonrpc": "2.0", "id": message["id"], "result": {"decision": decision}})
                elif "id" in message and "method" not in message and message["id"] in self.waiting:
                    event, box = self.waiting.pop(message["id"])
                    box.append(message)
                    event.set()

    async def call(self, method: str, params: dict[str, Any], *, cancel_after: float | None = None) -> dict[str, Any]:
        self.next_id += 1
        rid = self.next_id
        event, box = anyio.Event(), list[dict[str, Any]]()
        self.waiting[rid] = (event, box)
        await self.send({"jsonrpc": "2.0", "id": rid, "method": method, "params": params})
        if cancel_after is not None:
            await anyio.sleep(cancel_after)
            await self.send({"jsonrpc": "2.0", "method": "$/cancelRequest", "params": {"id": rid}})
        with anyio.fail_after(120):
            await event.wait()
        reply: dict[str, Any] = box[0]
        return reply


def _mix(rng: random.Random, n: int) -> tuple[str, dict[str, Any], float | None]:
    """One call of the mix: (tool, args, cancel after)."""
    roll = rng.random()
    name = f"f{n % 7}.txt"
    if roll < 0.25:
        return "Bash", {"command": f"echo out-{n}; echo err-{n} >&2; seq 1 200 | tail -n 1"}, None
    if roll < 0.27:
        return "Bash", {"command": "sleep 30", "timeout": 1}, None
    if roll < 0.29:
        return "Bash", {"command": "sleep 30; echo late"}, 0.3
    if roll < 0.33:
        return "Bash", {"command": "echo x > ../outside.txt; rm -rf ./gone"}, None  # asked: approved or denied
    if roll < 0.45:
        return "Write", {"path": name, "content": f"line {n}\n" * 20}, None
    if roll < 0.55:
        return "Read", {"path": "README.md"}, None
    if roll < 0.62:
        return "Edit", {"path": "README.md", "edits": [{"old_text": "# sample", "new_text": "# sample"}]}, None
    if roll < 0.75:
        return "LS", {"path": "."}, None
    if roll < 0.88:
        return "Glob", {"pattern": "**/*.txt"}, None
    return "Grep", {"pattern": "line", "outputMode": "count"}, None


def _workspace(root: Path, i: int, backend: str) -> Path:
    ws = root / f"ws{i}"
    (ws / "src").mkdir(parents=True)
    (ws / "README.md").write_text("# sample\n")
    (ws / "src" / "app.py").write_text("print('hi')\n")
    if backend == "docker":
        own_like_a_checkout(ws)  # Docker runs commands as the workspace's owner, never root
    return ws


async def _reap(proc: anyio.abc.Process) -> None:
    with anyio.CancelScope(shield=True):
        if proc.returncode is None:
            proc.kill()
        await proc.wait()
        await proc.aclose()


def _rss(pid: int) -> int:
    return psutil.Process(pid).memory_info().rss


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _leftovers(data_dir: Path, pid: int, backend: str) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    try:
        found["processes"] = [p.name() for p in psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        found["processes"] = []
    found["copies"] = [p.name for p in (data_dir / "copies").glob("*")] if (data_dir / "copies").exists() else []
    found["scratch"] = [p.name for p in (data_dir / "scratch").glob("*")] if (data_dir / "scratch").exists() else []
    bases = {h.base for h in cgroups.hierarchies().values() if isinstance(h, cgroups.Hierarchy)}
    found["cgroups"] = [str(c) for b in bases for c in b.glob(f"call-{pid}-*")]
    if backend == "docker":
        from sandbox.backends.docker.config import LABEL_OWNER

        ps = subprocess.run(
            ["docker", "ps", "-aq", "--filter", f"label={LABEL_OWNER}={pid}@{socket.gethostname()}"],
            capture_output=True,
            text=True,
            check=False,
        )
        found["containers"] = ps.stdout.split()
    return {k: v for k, v in found.items() if v}


@pytest.mark.parametrize("backend", ["bwrap", "docker"])
async def test_sustained_load_leaves_nothing_and_stays_flat(backend: str, tmp_path: Path, data_dir: Path) -> None:
    backend_or_skip(backend)
    rng = random.Random(20261203)
    proc = await anyio.open_process([SANDBOX, "serve"], env=dict(os.environ))
    client = Client(proc)
    latencies: dict[str, list[float]] = {}
    outcomes: dict[str, int] = {}
    sent: list[str] = []
    samples: list[tuple[int, int, int]] = []  # calls done, rss, fds
    done = 0
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(client.read_forever)
            opened = []
            for i in range(SESSIONS):
                reply = await client.call(
                    "session.open",
                    {"workspace": str(_workspace(tmp_path, i, backend)), "backend": backend, "mode": "accept-edits"},
                )
                assert "result" in reply, reply
                opened.append(reply["result"]["session_id"])

            async def session(sid: str, share: int) -> None:
                nonlocal done
                for n in range(share):
                    tool, args, cancel = _mix(rng, n)
                    call_id = f"{sid}-{n}"
                    sent.append(call_id)
                    started = time.perf_counter()
                    reply = await client.call(
                        "tool.call",
                        {"session_id": sid, "tool": tool, "args": args, "tool_call_id": call_id, "turn_id": f"t{n}"},
                        cancel_after=cancel,
                    )
                    latencies.setdefault(tool, []).append(time.perf_counter() - started)
                    result = reply.get("result") or {}
                    kind = "error" if "error" in reply else (result.get("error_code") or "ok")
                    outcomes[kind] = outcomes.get(kind, 0) + 1
                    done += 1
                    if done % 500 == 0:
                        samples.append((done, _rss(proc.pid), _fds(proc.pid)))

            async with anyio.create_task_group() as load:
                for sid in opened:
                    load.start_soon(session, sid, CALLS // SESSIONS)
            for sid in opened:
                await client.call("session.close", {"session_id": sid})
            end_rss, end_fds = _rss(proc.pid), _fds(proc.pid)
            left = _leftovers(data_dir, proc.pid, backend)
            await client.call("shutdown", {})
            tg.cancel_scope.cancel()
    finally:
        await _reap(proc)

    report = {
        "backend": backend,
        "sessions": SESSIONS,
        "calls": done,
        "outcomes": outcomes,
        "latency_ms": {
            tool: {
                "n": len(v),
                "p50": round(statistics.median(v) * 1000, 1),
                "p99": round(sorted(v)[max(0, int(len(v) * 0.99) - 1)] * 1000, 1),
            }
            for tool, v in sorted(latencies.items())
        },
        "rss_mib": [round(rss / 2**20, 1) for _, rss, _ in samples] + [round(end_rss / 2**20, 1)],
        "fds": [fds for _, _, fds in samples] + [end_fds],
        "leftovers": left,
    }
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / f"soak-{backend}.json").write_text(json.dumps(report, indent=2))
    print(json.dumps(report))  # noqa: T201 - the figures the README quotes
    assert done == CALLS // SESSIONS * SESSIONS
    assert left == {}, left
    assert outcomes.get("error", 0) == 0, outcomes  # no protocol error: every refusal is a tool result
    assert outcomes.get("TOOL_FAILED", 0) == 0, outcomes  # nothing in the mix fails but by design
    assert outcomes.get("TIMEOUT", 0) > 0 and outcomes.get("ABORTED", 0) > 0 and outcomes.get("TOOL_DENIED", 0) > 0
    # Flat after warm-up: from the second sample on, RSS grows by less than a quarter (plus 16 MiB of slack).
    if len(samples) >= 3:
        warm = samples[1][1]
        assert end_rss < warm * 1.25 + 16 * 2**20, report["rss_mib"]
        assert end_fds <= samples[1][2] + 8, report["fds"]
    counts = _audit_counts(data_dir)
    missing = [c for c in sent if counts.get(c, 0) != 1]
    assert missing == [], f"{len(missing)} calls without exactly one audit record, e.g. {missing[:5]}"


def _audit_db(data_dir: Path) -> Path:
    db = data_dir / "audit" / "audit.sqlite3"
    assert db.is_file(), f"no audit database at {db}"
    return db


def _audit_counts(data_dir: Path) -> dict[str, int]:
    with contextlib.closing(sqlite3.connect(_audit_db(data_dir))) as conn:
        return dict(conn.execute("SELECT tool_call_id, COUNT(*) FROM calls GROUP BY tool_call_id").fetchall())


@pytest.mark.parametrize("backend", ["bwrap", "docker"])
async def test_sigkilled_under_load_gc_and_the_next_start_leave_nothing(
    backend: str, tmp_path: Path, data_dir: Path
) -> None:
    backend_or_skip(backend)
    rng = random.Random(7)
    killed = [await _killed_under_load(backend, tmp_path / f"r{round_}", rng) for round_ in range(3)]
    gc = await anyio.run_process([SANDBOX, "gc"], check=False)
    assert gc.returncode == 0, gc.stderr
    # The next start: a server that opens and closes a session, then leaves.
    nxt = await anyio.run_process(
        [SANDBOX, "serve"],
        input=b'{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}\n'
        b'{"jsonrpc":"2.0","id":2,"method":"shutdown","params":{}}\n',
        check=False,
    )
    assert nxt.returncode == 0, nxt.stderr
    left = {pid: _leftovers(data_dir, pid, backend) for pid in killed}
    assert all(found == {} for found in left.values()), left
    for kind in ("copies", "scratch"):
        entries = list((data_dir / kind).glob("*")) if (data_dir / kind).exists() else []
        assert entries == [], (kind, entries)
    with contextlib.closing(sqlite3.connect(_audit_db(data_dir))) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)


async def _killed_under_load(backend: str, root: Path, rng: random.Random) -> int:
    """One server with four copy sessions under load, SIGKILLed after 1-4 s; its pid."""
    proc = await anyio.open_process([SANDBOX, "serve"], env=dict(os.environ))
    client = Client(proc)

    async def hammer(sid: str) -> None:
        for n in range(10_000):
            tool, args, _ = _mix(rng, n)
            await client.call("tool.call", {"session_id": sid, "tool": tool, "args": args})

    try:
        with contextlib.suppress(Exception):  # every call in flight dies with the server
            async with anyio.create_task_group() as tg:
                tg.start_soon(client.read_forever)
                for i in range(4):
                    opened = {
                        "workspace": str(_workspace(root, i, backend)),
                        "backend": backend,
                        "mount": "copy",
                        "mode": "auto",
                    }
                    reply = await client.call("session.open", opened)
                    tg.start_soon(hammer, reply["result"]["session_id"])
                await anyio.sleep(rng.uniform(1.0, 4.0))
                os.kill(proc.pid, signal.SIGKILL)
                await proc.wait()
                tg.cancel_scope.cancel()
    finally:
        await _reap(proc)
    return proc.pid
