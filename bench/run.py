"""`make bench`: every benchmark, each in its own process, ratios against the raw tools.

Timings on a shared machine are noisy: each benchmark measures ours and the raw tool in the
same run and reports the ratio. A benchmark whose backend is unavailable says why and is skipped.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
BENCHES = [
    ("executor (bubblewrap)", "bench_exec.py"),
    ("start-up: whole processes, ours against bare bwrap, srt, Codex and docker", "bench_startup.py"),
    ("permission layer", "bench_policy.py"),
    ("classifier layer: share of a recorded session judged by the model", "bench_classifier.py"),
    ("docker backend", "bench_docker.py"),
    ("landlock backend: per call against bubblewrap, bare bwrap and Codex's sandbox", "bench_landlock.py"),
    (
        "microvm backend: cold boot, warm call, stdout and a real suite against bwrap, docker run and the host",
        "bench_microvm.py",
    ),
    ("1 GiB of stdout: docker warm jail against bubblewrap against bare bwrap", "bench_streams.py"),
    ("mount strategies", "bench_mounts.py"),
    ("copy over the archive API (a remote engine) against the local bind path", "bench_archive.py"),
    ("sealing: the search for secrets to mask, cold against its cache", "bench_seal.py"),
    ("resealing: the seal searched before each call of a warm jail, against once per jail", "bench_reseal.py"),
    ("winjob under Wine: per call against the same command run directly under Wine", "bench_winjob.py"),
    ("apply: per file against journalled, all or nothing", "bench_apply.py"),
    ("session snapshots: snapshot, restore and fork of 4 at 1,000 and 50,000 files", "bench_snapshots.py"),
    ("network allowlist: set-up and throughput through the proxy against direct", "bench_network.py"),
    ("secret broker: a terminated host against SNI pass-through and direct", "bench_broker.py"),
    ("a real suite with its dependencies installed in the jail against the same on the host", "bench_deps.py"),
    ("a 1 GiB flood through sandbox serve against sandbox run", "bench_flood.py"),
    ("one hostile session's floods against another session's Read latency (sandbox serve)", "bench_stall.py"),
    ("per-call cost through sandbox mcp (the MCP SDK's client) against sandbox serve", "bench_mcp.py"),
    ("pi's real agent loop: per-call times with the sandbox extension against pi's own tools", "bench_pi.py"),
    ("per-call cost, two revisions side by side (SANDBOX_BENCH_BEFORE=<rev>)", "before_after.py"),
]
# before_after.py needs a revision to compare with; without one it is skipped and says so.
NEEDS_ENV = {"before_after.py": "SANDBOX_BENCH_BEFORE"}


def main() -> int:
    failed = []
    for title, script in BENCHES:
        path = HERE / script
        if not path.exists():
            continue
        print(f"\n== {title} ({script})", flush=True)
        needed = NEEDS_ENV.get(script)
        if needed and not os.environ.get(needed):
            print(f"skipped: set {needed} to the revision to compare with (e.g. {needed}=v0.1.0)")
            continue
        done = subprocess.run([sys.executable, str(path)], check=False)
        if done.returncode != 0:
            failed.append(f"{script} (exit {done.returncode})")
    if failed:
        print(f"\nbenchmarks that missed a target or could not run: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
