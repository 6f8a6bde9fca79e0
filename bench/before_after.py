"""Per-call cost of two revisions of the code, side by side in one run.

A refactor must not make a call slower. This checks out ``REV`` (default: ``SANDBOX_BENCH_BEFORE``, else
``HEAD~1``) into a temporary git worktree and
measures the same per-call workloads with each tree first on ``sys.path``, alternating rounds
(before, after, before, after, …) so the noise of a shared machine falls on both alike:

- ``exec.run`` of ``true`` in one open bubblewrap jail (the executor's per-call overhead);
- a session's Bash, Read and LS calls through the five boundaries (``Sandbox.call``);
- the same exec call in one warm Docker jail, and a per-call Docker jail, when a daemon answers;
- a whole ``sandbox run -- true`` process (the CLI's quick path).

Usage: ``python bench/before_after.py [REV] [--rounds N] [--calls N]``. Prints medians and the
after/before ratio per row; timings are reported, never turned into a failure.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

# Runs in a fresh interpreter with one tree first on sys.path; prints {row: [seconds, ...]}.
PROBE = r"""
import json, os, subprocess, sys, tempfile, time
from pathlib import Path
import anyio
from sandbox import exec as executor, profile as profiles
from sandbox.backends import base
from sandbox.session import Sandbox

CALLS = int(os.environ["BENCH_CALLS"])
out = {}

def timed(name, samples):
    out[name] = samples

async def jail_calls(backend, prof, ws):
    async with await base.get(backend).open_jail(ws, prof) as jail:
        await executor.run(jail, ["true"])
        times = []
        for _ in range(CALLS):
            t = time.perf_counter()
            result = await executor.run(jail, ["true"])
            assert result.exit_code == 0
            times.append(time.perf_counter() - t)
        return times

async def session_calls(ws):
    (ws / "a.txt").write_text("hello\n")
    rows = {"session Bash true (bwrap)": ("Bash", {"command": "true"}),
            "session Read (bwrap)": ("Read", {"path": "a.txt"}),
            "session LS (bwrap)": ("LS", {"path": "."})}
    async with Sandbox.open(ws, profile="default", backend="bwrap", mode="auto") as s:
        await s.call("Bash", {"command": "true"})
        for name, (tool, args) in rows.items():
            times = []
            for _ in range(CALLS):
                t = time.perf_counter()
                result = await s.call(tool, args)
                assert result.ok, result
                times.append(time.perf_counter() - t)
            timed(name, times)

async def main():
    ws = Path(tempfile.mkdtemp(prefix="bench-ba-"))
    ws.chmod(0o755)  # a container's command uid (1000 for a root-owned workspace) must enter it
    prof = profiles.load("default")
    timed("exec.run true (bwrap jail)", await jail_calls("bwrap", prof, ws))
    await session_calls(ws)
    if os.environ.get("BENCH_DOCKER") == "1":
        timed("exec.run true (docker, warm)", await jail_calls("docker", prof.with_overrides(backend="docker"), ws))
        call = prof.with_overrides(**{"backend": "docker", "docker.lifecycle": "call"})
        timed("exec.run true (docker, per call)", await jail_calls("docker", call, ws))

anyio.run(main)
sandbox = [sys.executable, "-m", "sandbox.cli", "run", "--workspace", tempfile.mkdtemp(), "--", "true"]
subprocess.run(sandbox, check=True)  # the first run fills the quick path's cache
times = []
for _ in range(CALLS):
    t = time.perf_counter()
    subprocess.run(sandbox, check=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    times.append(time.perf_counter() - t)
timed("sandbox run -- true (process)", times)
print(json.dumps(out))
"""


def docker_answers() -> bool:
    """Whether the Docker backend can run here (daemon, SDK and image), as its own probe says."""
    code = "from sandbox.backends import base; import sys; sys.exit(0 if base.get('docker').probe().available else 1)"
    try:
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60, check=False)
    except subprocess.TimeoutExpired:
        return False
    return done.returncode == 0


def worktree(rev: str, into: Path) -> Path:
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q", str(into), rev], check=True)
    return into


def measure(tree: Path, calls: int, docker: bool) -> dict[str, list[float]]:
    env = dict(os.environ, PYTHONPATH=str(tree), BENCH_CALLS=str(calls), BENCH_DOCKER="1" if docker else "0")
    done = subprocess.run([sys.executable, "-c", PROBE], cwd=tree, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        sys.exit(f"before_after: the probe failed in {tree}:\n{done.stderr[-3000:]}")
    result: dict[str, list[float]] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("rev", nargs="?", default=os.environ.get("SANDBOX_BENCH_BEFORE", "HEAD~1"))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=30)
    args = parser.parse_args()
    docker = docker_answers()
    samples: dict[str, dict[str, list[float]]] = {"before": {}, "after": {}}
    with tempfile.TemporaryDirectory(prefix="bench-before-") as tmp:
        trees = {"before": worktree(args.rev, Path(tmp) / "tree"), "after": ROOT}
        try:
            for _ in range(args.rounds):
                for side, tree in trees.items():
                    for row, times in measure(tree, args.calls, docker).items():
                        samples[side].setdefault(row, []).extend(times)
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(trees["before"])], check=False)
    print(f"per-call medians, before = {args.rev}, after = this tree ({args.rounds} alternating rounds x {args.calls})")
    for row, before in samples["before"].items():
        after = samples["after"].get(row)
        if not after:
            continue
        b, a = statistics.median(before) * 1000, statistics.median(after) * 1000
        print(f"  {row:<36} before {b:7.2f} ms   after {a:7.2f} ms   after/before {a / b:.2f}x")
    if not docker:
        print("  (docker rows skipped: the docker backend's probe says it is unavailable here)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
