"""Mount strategies as the workspace grows (part of `make bench`), on the bubblewrap backend.

For workspaces of 1,000 / 10,000 / 50,000 small files (generated once, cached in the temp dir)
and each strategy: setup (``open_jail``), a command writing 100 existing files, a command
reading 100 others, ``changes()`` and ``apply()`` (``copy``/``overlay``), and teardown. Medians
of ``BENCH_MOUNT_REPS`` (3) rounds. The two commands' times include one jail spawn each.

Expected shape: ``copy`` setup grows with the workspace (it copies it) and so does its
``changes()`` (a stat per entry); ``ro``/``rw`` (a bind) and ``overlay`` (a mount) stay flat;
``apply`` grows with the 100 changes, not with the workspace. Exit 1 if overlay setup at the
largest size is more than 3x its setup at the smallest *and* more than 50 ms (the claim that it
is O(1); a few milliseconds of scheduling noise on a shared machine is not growth).
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import anyio

from sandbox import exec as executor
from sandbox import profile as profiles
from sandbox.backends import base
from sandbox.errors import SandboxError
from sandbox.mounts import overlay_support

SIZES = tuple(int(n) for n in os.environ.get("BENCH_MOUNT_SIZES", "1000,10000,50000").split(","))
REPS = int(os.environ.get("BENCH_MOUNT_REPS", "3"))
STRATEGIES = ("ro", "rw", "overlay", "copy")  # copy last: its teardown floods the journal
TOUCHED = 100
FLAT_RATIO = 3.0
FLAT_MS = 50.0
SETUP_SAMPLES = 9  # extra open/close pairs for the cheap strategies: their setup is milliseconds
CELL_BUDGET_S = 20.0
PER_DIR = 100
CACHE = Path(tempfile.gettempdir()) / "sandbox-bench-mounts"
OUT = Path(__file__).resolve().parent / "out" / "mounts.json"
WRITE = 'for f in "$@"; do echo changed >> "$f"; done'
STEPS = ("setup", "write100", "read100", "changes", "apply", "teardown")


def say(text: str) -> None:
    print(text, flush=True)


def content(index: int) -> str:
    return f"file {index}: a small line of text for the mount benchmark\n" * 2


def rel(index: int) -> str:
    return f"d{index // PER_DIR:04d}/f{index:06d}.txt"


def workspace(size: int) -> Path:
    """``size`` small files, 100 per directory; generated once and reused across runs."""
    ws, done = CACHE / f"ws-{size}", CACHE / f"ws-{size}.done"
    if done.exists():
        return ws
    shutil.rmtree(ws, ignore_errors=True)
    for index in range(size):
        path = ws / rel(index)
        if index % PER_DIR == 0:
            path.parent.mkdir(parents=True)
        path.write_text(content(index))
    done.touch()
    return ws


def picks(size: int, offset: int) -> list[int]:
    """100 files spread over the whole tree (so a write touches many directories)."""
    stride = size // TOUCHED
    return [i * stride + offset for i in range(TOUCHED)]


def restore(ws: Path, size: int) -> None:
    for index in picks(size, 0):
        (ws / rel(index)).write_text(content(index))


@dataclass
class Round:
    times: dict[str, float] = field(default_factory=dict)

    def timed(self, step: str, started: float) -> None:
        self.times[step] = (time.perf_counter() - started) * 1000


async def one_round(backend: base.Backend, ws: Path, size: int, prof: profiles.Profile) -> Round:
    r = Round()
    writes = [str(ws / rel(i)) for i in picks(size, 0)]
    reads = [str(ws / rel(i)) for i in picks(size, 1)]
    started = time.perf_counter()
    jail = await backend.open_jail(ws, prof)
    r.timed("setup", started)
    try:
        if prof.mount.strategy != "ro":
            started = time.perf_counter()
            result = await executor.run(jail, ["sh", "-c", WRITE, "sh", *writes])
            r.timed("write100", started)
            assert result.exit_code == 0, result.stderr
        started = time.perf_counter()
        result = await executor.run(jail, ["cat", *reads])
        r.timed("read100", started)
        assert result.exit_code == 0 and result.stdout_bytes == sum(len(content(i)) for i in picks(size, 1))
        await changes_and_apply(jail, r)
    finally:
        started = time.perf_counter()
        await jail.aclose()
        r.timed("teardown", started)
    if prof.mount.strategy != "ro":
        restore(ws, size)
    return r


async def changes_and_apply(jail: base.Jail, r: Round) -> None:
    started = time.perf_counter()
    changes = await jail.changes()
    if changes is None:
        return
    r.timed("changes", started)
    assert len(changes.changes) == TOUCHED, changes.summary()
    started = time.perf_counter()
    applied = await jail.apply(changes)
    r.timed("apply", started)
    assert len(applied.applied) == TOUCHED and not applied.conflicts, applied.to_dict()


def medians(rounds: list[Round], setups: list[float]) -> dict[str, float]:
    steps = {k for r in rounds for k in r.times}
    found = {k: statistics.median(r.times[k] for r in rounds if k in r.times) for k in steps}
    found["setup"] = statistics.median([r.times["setup"] for r in rounds] + setups)
    return found


async def setup_only(backend: base.Backend, ws: Path, prof: profiles.Profile) -> float:
    started = time.perf_counter()
    jail = await backend.open_jail(ws, prof)
    elapsed = (time.perf_counter() - started) * 1000
    await jail.aclose()
    return elapsed


async def measure_cell(backend: base.Backend, ws: Path, size: int, strategy: str) -> dict[str, float]:
    """Rounds until REPS or the cell's time budget (a 50k-file copy takes seconds per round)."""
    prof = profiles.load("default").with_overrides(**{"mount.strategy": strategy, "backend": "bwrap"})
    await anyio.to_thread.run_sync(os.sync)  # the previous cell's writes must not land on this one
    cheap = strategy != "copy"
    if cheap:
        await one_round(backend, ws, size, prof)  # warm-up: page cache, dentries
    rounds: list[Round] = []
    deadline = time.perf_counter() + CELL_BUDGET_S
    while len(rounds) < REPS and (not rounds or time.perf_counter() < deadline):
        rounds.append(await one_round(backend, ws, size, prof))
    setups = [await setup_only(backend, ws, prof) for _ in range(SETUP_SAMPLES if cheap else 0)]
    found = medians(rounds, setups)
    found["rounds"] = len(rounds)
    return found


async def measure(backend: base.Backend, strategies: list[str]) -> dict[str, dict[int, dict[str, float]]]:
    results: dict[str, dict[int, dict[str, float]]] = {s: {} for s in strategies}
    for size in SIZES:
        started = time.perf_counter()
        ws = await anyio.to_thread.run_sync(workspace, size)
        say(f"workspace of {size} files ready in {time.perf_counter() - started:.1f} s: {ws}")
        for strategy in strategies:
            results[strategy][size] = await measure_cell(backend, ws, size, strategy)
    return results


def cell(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def print_table(results: dict[str, dict[int, dict[str, float]]]) -> None:
    say(
        f"\nmedian ms over up to {REPS} rounds (write100/read100 include one jail spawn each; setup of ro, rw "
        f"and overlay also over {SETUP_SAMPLES} extra open/close pairs)"
    )
    say(f"{'strategy':9} {'files':>6} " + " ".join(f"{s:>9}" for s in STEPS) + "  rounds")
    for strategy, by_size in results.items():
        for size, times in by_size.items():
            say(
                f"{strategy:9} {size:>6} "
                + " ".join(f"{cell(times.get(s)):>9}" for s in STEPS)
                + f"  {times['rounds']:>6.0f}"
            )


def ratios(results: dict[str, dict[int, dict[str, float]]]) -> dict[str, dict[str, float]]:
    small, large = min(SIZES), max(SIZES)
    out: dict[str, dict[str, float]] = {}
    for strategy, by_size in results.items():
        out[strategy] = {
            step: by_size[large][step] / by_size[small][step]
            for step in ("setup", "changes", "apply")
            if step in by_size[small]
        }
    return out


def print_ratios(found: dict[str, dict[str, float]]) -> None:
    say(
        f"\nscaling, {max(SIZES)} files / {min(SIZES)} files (flat is ~1x; the workspace grew "
        f"{max(SIZES) / min(SIZES):.0f}x):"
    )
    for strategy, steps in found.items():
        say(f"  {strategy:8} " + ", ".join(f"{step} {value:.2f}x" for step, value in steps.items()))


async def main() -> int:
    try:
        backend = base.get("bwrap")
    except SandboxError as exc:
        say(f"skipped: {exc.message}")
        return 0
    report = backend.probe()
    if not report.available:
        say(f"skipped: bubblewrap unavailable here: {report.reason}")
        return 0
    strategies = list(STRATEGIES)
    overlay = overlay_support()
    if overlay:
        say(f"overlay skipped: {overlay}")
        strategies.remove("overlay")
    started = time.perf_counter()
    results = await measure(backend, strategies)
    print_table(results)
    found = ratios(results)
    print_ratios(found)
    OUT.parent.mkdir(exist_ok=True)
    OUT.write_text(json.dumps({"sizes": SIZES, "reps": REPS, "results": results, "ratios": found}, indent=2))
    say(f"\nbench_mounts: {time.perf_counter() - started:.0f} s; figures in {OUT}")
    flat = found.get("overlay", {}).get("setup")
    largest = results.get("overlay", {}).get(max(SIZES), {}).get("setup")
    if flat is not None and largest is not None and flat > FLAT_RATIO and largest > FLAT_MS:
        say(
            f"FAIL: overlay setup grew {flat:.2f}x with the workspace to {largest:.1f} ms "
            f"(target <= {FLAT_RATIO:.0f}x or <= {FLAT_MS:.0f} ms)"
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(anyio.run(main))
