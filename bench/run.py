"""`make bench`: every benchmark, each in its own process, ratios against the raw tools.

Timings on a shared machine are noisy: each benchmark measures ours and the raw tool in the
same run and reports the ratio. A benchmark whose backend is unavailable says why and is skipped.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
BENCHES = [
    ("executor (bubblewrap)", "bench_exec.py"),
    ("start-up: whole processes, ours against bare bwrap, srt, Codex and docker", "bench_startup.py"),
    ("permission layer", "bench_policy.py"),
    ("docker backend", "bench_docker.py"),
    ("mount strategies", "bench_mounts.py"),
]


def main() -> int:
    failed = []
    for title, script in BENCHES:
        path = HERE / script
        if not path.exists():
            continue
        print(f"\n== {title} ({script})", flush=True)
        done = subprocess.run([sys.executable, str(path)], check=False)
        if done.returncode != 0:
            failed.append(f"{script} (exit {done.returncode})")
    if failed:
        print(f"\nbenchmarks that missed a target or could not run: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
