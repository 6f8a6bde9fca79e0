"""Per-call cost through ``sandbox mcp`` (the MCP SDK's own client, stdio) against ``sandbox serve``.

The same calls, in one run, on one bubblewrap session each: a Read of a small file and a Bash
``true``. Printed: the median of each per transport and the ratio MCP / serve. No target: the
issue asks for the figure (the MCP SDK's framing and validation against our JSON lines).

Usage: ``python bench/bench_mcp.py [--calls 40]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import anyio

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from tests.rpc_client import SANDBOX, serve  # noqa: E402 - after the checkout is on the path

CALLS = {"Read": {"path": "README.md"}, "Bash": {"command": "true"}}


async def via_serve(
    workspace: Path, n: int, calls: dict[str, dict[str, str]] = CALLS, gap_s: float = 0.0
) -> dict[str, float]:
    """Median seconds per tool of ``n`` calls through ``sandbox serve``, ``gap_s`` apart (bubblewrap)."""
    medians = {}
    async with serve() as client:
        opened = await client.call("session.open", {"workspace": str(workspace), "mode": "auto", "backend": "bwrap"})
        sid = opened["result"]["session_id"]
        for tool, args in calls.items():
            times = []
            for _ in range(n):
                await anyio.sleep(gap_s)
                started = time.perf_counter()
                reply = await client.call("tool.call", {"session_id": sid, "tool": tool, "args": args})
                times.append(time.perf_counter() - started)
                assert reply["result"]["ok"], reply
            medians[tool] = statistics.median(times[2:])  # the first calls warm the jail's caches
        await client.call("shutdown", {})
    return medians


async def via_mcp(workspace: Path, n: int) -> dict[str, float]:
    from mcp import ClientSession, StdioServerParameters, stdio_client

    argv = ["mcp", "--workspace", str(workspace), "--backend", "bwrap", "--mode", "auto"]
    server = StdioServerParameters(command=SANDBOX, args=argv, env=dict(os.environ))
    medians = {}
    async with stdio_client(server) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        for tool, args in CALLS.items():
            times = []
            for _ in range(n):
                started = time.perf_counter()
                result = await session.call_tool(tool, args)
                times.append(time.perf_counter() - started)
                assert not result.is_error, result
            medians[tool] = statistics.median(times[2:])
    return medians


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=40)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-mcp-") as tmp:
        workspace = Path(tmp) / "ws"
        workspace.mkdir()
        (workspace / "README.md").write_text("# sample\n" * 20)
        serve_ms = anyio.run(via_serve, workspace, args.calls)
        mcp_ms = anyio.run(via_mcp, workspace, args.calls)
    print(f"{'call':<6} {'serve ms':>9} {'mcp ms':>9} {'mcp/serve':>10}")
    for tool in CALLS:
        ratio = mcp_ms[tool] / serve_ms[tool]
        print(f"{tool:<6} {serve_ms[tool] * 1000:>9.1f} {mcp_ms[tool] * 1000:>9.1f} {ratio:>9.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
