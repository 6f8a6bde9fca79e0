"""A flood through ``sandbox serve`` against the same command through ``sandbox run`` (bubblewrap).

``head -c 1G /dev/zero`` as one Bash call: the server streams the client its live budget (the
profile's ``limits.live_*_bytes``), then one ``tool.output.withheld`` notice, while the capture
counts every byte. Target: within 1.2x of ``sandbox run`` (whose stdout goes to /dev/null), with
the bytes the client received bounded by the budget. Exit 1 when a target is missed.

Usage: ``python bench/bench_flood.py [--size 1G] [--rounds 3]``.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import anyio

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from tests.rpc_client import SANDBOX, serve  # noqa: E402 - after the checkout is on the path

TARGET = 1.2


def via_run(workspace: Path, size: str, *, json_capture: bool = False) -> float:
    """``sandbox run`` with its stdout read by another process (``| cat``), as a terminal or a
    log reads it; or, with ``json_capture``, captured like the server's (``--json``), not streamed."""
    run = [SANDBOX, "run", "--backend", "bwrap", "--workspace", str(workspace)]
    command = ["--", "head", "-c", size, "/dev/zero"]
    started = time.perf_counter()
    if json_capture:
        subprocess.run([*run, "--json", *command], stdout=subprocess.DEVNULL, check=True)
    else:
        shell = " ".join(shlex.quote(arg) for arg in [*run, *command]) + " | cat > /dev/null"
        subprocess.run(["bash", "-o", "pipefail", "-c", shell], check=True)
    return time.perf_counter() - started


async def via_serve(workspace: Path, size: str) -> tuple[float, int, int]:
    async with serve() as client:
        opened = await client.call("session.open", {"workspace": str(workspace), "mode": "auto", "backend": "bwrap"})
        sid = opened["result"]["session_id"]
        started = time.perf_counter()
        reply = await client.call(
            "tool.call",
            {
                "session_id": sid,
                "tool": "Bash",
                "tool_call_id": "flood",
                "args": {"command": f"head -c {size} /dev/zero"},
            },
        )
        elapsed = time.perf_counter() - started
        received = sum(len(n["data"]) for n in client.notes)
        await client.call("session.close", {"session_id": sid})
    return elapsed, received, int(reply["result"]["details"]["stdout_bytes"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="1G")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    runs, captured, serves, received, counted = [], [], [], 0, 0
    with tempfile.TemporaryDirectory(dir="/var/tmp") as tmp:
        workspace = Path(tmp)
        for _ in range(args.rounds):  # alternating, so a noisy moment falls on all alike
            runs.append(via_run(workspace, args.size))
            captured.append(via_run(workspace, args.size, json_capture=True))
            took, received, counted = anyio.run(via_serve, workspace, args.size)
            serves.append(took)
    run_s, json_s, serve_s = statistics.median(runs), statistics.median(captured), statistics.median(serves)
    ratio = serve_s / run_s
    print(f"head -c {args.size} /dev/zero, median of {args.rounds} (whole processes for run; the call for serve):")
    print(f"  sandbox run | cat:     {run_s:.2f} s")
    print(f"  sandbox run --json:    {json_s:.2f} s (captured, not streamed)")
    print(f"  sandbox serve (Bash):  {serve_s:.2f} s ({ratio:.2f}x run | cat, {serve_s / json_s:.2f}x run --json)")
    print(f"  the client received {received:,} bytes live; the server counted {counted:,}")
    print(json.dumps({"run_s": run_s, "run_json_s": json_s, "serve_s": serve_s, "ratio": ratio, "received": received}))
    missed = ratio > TARGET
    print("target met" if not missed else f"missed: {ratio:.2f}x > {TARGET}x")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
