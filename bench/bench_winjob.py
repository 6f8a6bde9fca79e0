"""Per-call overhead of the winjob backend under Wine against the same command run directly under Wine.

On Linux this re-runs itself with the Windows CPython that tests/run-wine.sh prepares (skipped,
saying why, where Wine is not set up); on Windows (or under Wine) it measures: ``exec.run`` of
``cmd /c exit 0`` in a winjob jail (a job per call, suspended start, two pipes, the job's
accounting checked at the end) against ``subprocess.run`` of the same command, N calls each,
medians and the ratio. Under Wine both sides pay Wine's process start; the ratio is the cost of
the job object and our plumbing on top of it.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

N = int(os.environ.get("SANDBOX_BENCH_WINJOB_N", "30"))
REPO = Path(__file__).resolve().parents[1]


def on_linux() -> int:
    home = Path(os.environ.get("SANDBOX_WINE_HOME", Path.home() / ".cache" / "sandbox-wine"))
    if not shutil.which("wine") or not (home / "python" / "python.exe").exists():
        print("skipped: Wine and its Windows CPython are not set up here (bash tests/run-wine.sh --setup)")
        return 0
    harness = REPO / "tests" / "run-wine.sh"
    return subprocess.run(["bash", str(harness), "--python", "bench/bench_winjob.py"], check=False).returncode


def on_windows() -> int:
    import anyio

    from sandbox import exec as executor
    from sandbox import profile as profiles
    from sandbox.backends import base, winjob_job
    from tests.wine.conftest import PROFILE_TOML

    comspec = os.environ.get("COMSPEC", "cmd.exe")
    argv = [comspec, "/d", "/c", "exit 0"]
    tmp = Path(tempfile.mkdtemp())
    (tmp / "windows.toml").write_text(PROFILE_TOML)
    (tmp / "ws").mkdir()
    prof = profiles.load_file(tmp / "windows.toml")

    async def measure() -> tuple[list[float], list[float], list[float]]:
        # Interleaved, call by call: Wine's timings drift, and each side must see the same drift.
        plain: list[float] = []
        hidden: list[float] = []
        jailed: list[float] = []
        async with await base.get("winjob").open_jail(tmp / "ws", prof) as jail:
            for i in range(N + 1):
                t0 = time.perf_counter()
                subprocess.run(argv, capture_output=True, check=True)  # noqa: ASYNC221 - a bench: blocking is the point
                t1 = time.perf_counter()
                subprocess.run(argv, capture_output=True, check=True, creationflags=winjob_job.CREATE_NO_WINDOW)  # noqa: ASYNC221
                t2 = time.perf_counter()
                result = await executor.run(jail, argv)
                t3 = time.perf_counter()
                assert result.exit_code == 0, result
                if i:  # the first round warms Wine's caches
                    plain.append(t1 - t0)
                    hidden.append(t2 - t1)
                    jailed.append(t3 - t2)
        return plain, hidden, jailed

    plain, hidden, jailed = anyio.run(measure)
    p, d, j = (statistics.median(t) * 1000 for t in (plain, hidden, jailed))
    where = f"Wine {winjob_job.wine_version()}" if winjob_job.wine_version() else "Windows"
    print(f"winjob per call under {where}, {N} calls of `cmd /c exit 0`:")
    print(f"  direct subprocess.run  median {p:8.1f} ms")
    print(f"  direct, CREATE_NO_WINDOW (as the job's) median {d:8.1f} ms  <- the baseline")
    print(f"  winjob exec.run        median {j:8.1f} ms")
    print(f"  ratio to the baseline  {j / d:8.2f}x  ({j - d:+.1f} ms per call)")
    print(f"  ratio to plain         {j / p:8.2f}x  ({j - p:+.1f} ms per call; a hidden console costs Wine most of it)")
    shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(on_windows() if sys.platform == "win32" else on_linux())
