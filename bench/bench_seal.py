"""The sealing's search of a workspace (sandbox/backends/seal.py), cold against its cache (part of `make bench`).

A workspace of ``BENCH_SEAL_FILES`` (50,000) small files in about 2,500 directories (50 x 50, 20
files each, a few secrets), generated once and kept in the temp dir. Rows, interleaved round by
round so that a noisy neighbour slows them alike, medians of ``BENCH_SEAL_REPS`` (9):

* ``find()`` cold: no cache in memory nor on disk (the first jail on a workspace);
* ``find()`` warm from disk: a new process's case (``sandbox run``): the memory cache emptied,
  the data directory's file read, every directory ``lstat``\\ ed;
* ``find()`` warm in memory: ``serve`` and the library opening another jail on the workspace;
* ``find()`` after one change: a secret added in one directory (listed again), then removed;
* bare ``os.walk`` (the names only, no glob) and GNU ``find`` (``-name`` per default glob, pruning
  the same directories; one process spawn included) for scale;
* with bubblewrap: ``sandbox run -- true`` in that workspace, its search cold (the cache file
  removed before each run) and warm: the whole quick path, before and after the cache.

Exit 1 when the warm search from disk is not at least ``TARGET_RATIO`` (3x) faster than the cold
one, or when any row's masks differ from the cold search's (a cache that hides a secret is no
speed-up).
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

from sandbox.backends import bwrap_argv, seal, seal_cache
from sandbox.patterns import DEFAULT_DENY_READ

if TYPE_CHECKING:
    from collections.abc import Callable

FILES = int(os.environ.get("BENCH_SEAL_FILES", "50000"))
REPS = int(os.environ.get("BENCH_SEAL_REPS", "9"))
FANOUT = 50  # top directories, and sub-directories in each
TARGET_RATIO = 3.0
SECRETS = ("a07/b13/.env", "a21/b02/server.key", "a49/b49/id_rsa", "a33/tls.pem")
CACHE = Path(tempfile.gettempdir()) / "sandbox-bench-seal"
OUT = Path(__file__).resolve().parent / "out" / "seal.json"
SANDBOX = Path(sys.executable).with_name("sandbox")


def say(text: str) -> None:
    print(text, flush=True)


def workspace() -> Path:
    """``FILES`` files, 20 to a directory of ``aNN/bNN``; generated once, then aged past the racy window."""
    ws, done = CACHE / f"ws-{FILES}", CACHE / f"ws-{FILES}.done"
    if not done.exists():
        shutil.rmtree(ws, ignore_errors=True)
        per_dir = max(1, FILES // (FANOUT * FANOUT))
        for index in range(FILES):
            folder = ws / f"a{index // per_dir // FANOUT % FANOUT:02d}" / f"b{index // per_dir % FANOUT:02d}"
            if index % per_dir == 0:
                folder.mkdir(parents=True, exist_ok=True)
            (folder / f"f{index:06d}.txt").write_text("a small file of the seal benchmark\n")
        for rel in SECRETS:
            (ws / rel).write_text("SECRET\n")
        done.touch()
    settled = os.stat(done).st_mtime + seal.RACY_NS / 1e9 + 0.5
    time.sleep(max(0.0, settled - time.time()))  # directories younger than that are never trusted
    return ws


def timed(fn: Callable[[], object]) -> tuple[float, object]:
    started = time.perf_counter()
    found = fn()
    return (time.perf_counter() - started) * 1000, found


def cold(ws: Path) -> seal.Seal:
    seal_cache.CACHE.clear()
    shutil.rmtree(CACHE / "data" / "cache" / "seal", ignore_errors=True)
    return seal.find(ws)


def from_disk(ws: Path) -> seal.Seal:
    seal_cache.CACHE.clear()
    return seal.find(ws)


def one_change(ws: Path) -> seal.Seal | None:
    """A secret added, searched, removed: the row's masks are the others' with it left out again."""
    late = "a11/b11/late.pem"
    (ws / late).write_text("x")
    try:
        found = seal.find(ws)
    finally:
        (ws / late).unlink()
    return found._replace(masked=tuple(m for m in found.masked if m[0] != late)) if late in found.masked_paths else None


def os_walk(ws: Path) -> int:
    return sum(len(names) + len(dirs) for _, dirs, names in os.walk(ws))


def gnu_find(ws: Path) -> bytes:
    pruned = [arg for name in sorted(seal.NOT_SEARCHED) for arg in ("-name", name, "-o")][:-1]
    globs = [p for p in DEFAULT_DENY_READ if not p.startswith(("~", "!"))]
    names = [arg for p in globs for arg in ("-name", p, "-o")][:-1]
    argv = ["find", str(ws), "(", *pruned, ")", "-prune", "-o", "(", *names, ")", "-print"]
    return subprocess.run(argv, capture_output=True, check=True).stdout


def rows(ws: Path) -> dict[str, Callable[[], object]]:
    found: dict[str, Callable[[], object]] = {
        "find() cold": lambda: cold(ws),
        "find() warm, from disk": lambda: from_disk(ws),
        "find() warm, in memory": lambda: seal.find(ws),
        "find() after one change": lambda: one_change(ws),
        "os.walk (names only)": lambda: os_walk(ws),
    }
    if shutil.which("find"):
        found["GNU find -name (a process)"] = lambda: gnu_find(ws)
    if bwrap_argv.bwrap_path() and SANDBOX.exists():
        run = [str(SANDBOX), "run", "--backend", "bwrap", "--workspace", str(ws), "--", "true"]
        found["sandbox run -- true, search cold"] = lambda: run_cold(run)
        found["sandbox run -- true, search cached"] = lambda: subprocess.run(run, check=True)
    return found


def run_cold(argv: list[str]) -> None:
    shutil.rmtree(CACHE / "data" / "cache" / "seal", ignore_errors=True)
    subprocess.run(argv, check=True)


def measure(ws: Path) -> tuple[dict[str, list[float]], list[str]]:
    table = rows(ws)
    times: dict[str, list[float]] = {name: [] for name in table}
    wrong: list[str] = []
    expected = cold(ws)
    for fn in table.values():
        fn()  # unmeasured: imports, page cache, the quick path's cached profile
    for _ in range(REPS):
        for name, fn in table.items():
            elapsed, found = timed(fn)
            times[name].append(elapsed)
            if name.startswith("find()") and found != expected:
                wrong.append(f"{name}: {found} != {expected}")
    return times, wrong


def report(times: dict[str, list[float]]) -> dict[str, float]:
    medians = {name: statistics.median(values) for name, values in times.items()}
    base = medians["find() cold"]
    say(f"\n{FILES} files, {FANOUT * FANOUT + FANOUT + 1} directories; median ms of {REPS} interleaved rounds")
    for name, value in medians.items():
        spread = f"p90 {sorted(times[name])[int(0.9 * (len(times[name]) - 1))]:.1f}"
        say(f"  {name:38} {value:8.1f} ms  {spread:>11}  {base / value:6.1f}x faster than cold")
    return medians


def main() -> int:
    os.environ["SANDBOX_DATA_DIR"] = str(CACHE / "data")
    started = time.perf_counter()
    ws = workspace()
    say(f"workspace ready in {time.perf_counter() - started:.1f} s: {ws}")
    if os.stat(ws).st_dev not in seal._trusted_devices():
        say(f"skipped: {ws}'s file system is not one the cache trusts (seal.TRUSTED_FILE_SYSTEMS)")
        return 0
    times, wrong = measure(ws)
    medians = report(times)
    ratio = medians["find() cold"] / medians["find() warm, from disk"]
    OUT.parent.mkdir(exist_ok=True)
    OUT.write_text(json.dumps({"files": FILES, "reps": REPS, "times_ms": times, "medians_ms": medians}, indent=2))
    say(f"\nbench_seal: {time.perf_counter() - started:.0f} s; figures in {OUT}")
    if wrong:
        say("FAIL: a cached search differs from the cold one: " + "; ".join(wrong))
        return 1
    if ratio < TARGET_RATIO:
        say(f"FAIL: the warm search from disk is only {ratio:.1f}x faster than the cold one (target {TARGET_RATIO}x)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
