"""Session snapshots (issue 39): snapshot, restore and fork of 4 at 1,000 and 50,000 files, 100 changed.

For each mount a session can snapshot (``overlay`` on bubblewrap, as root; ``copy`` on bubblewrap
and on Docker), a session over a workspace of N files changes 100 of them, then, round after
round: ``snapshot()``, ``restore(id)`` and ``fork(4)`` (which takes its own snapshot and opens
four sessions, each its own jail over the state; closing them is not timed), and four fresh
sessions opened side by side (what a fork costs beyond its state). Beside them, in the same run,
what a snapshot costs done the naive way: ``cp -a`` of the whole workspace (a snapshot)
and four of them (a fork's copies, with no jail at all). The issue's targets: a snapshot within
20 ms, a fork of 4 within 200 ms, each within 2x between 1,000 and 50,000 files.

Usage: ``python bench/bench_snapshots.py [--rounds N] [--sizes 1000,50000]``. Timings are
reported, never turned into a failure; a mount this host cannot give is skipped, saying why.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import anyio

from sandbox import mounts, snapshots
from sandbox.backends import base
from sandbox.errors import SandboxError
from sandbox.profile import Profile, load
from sandbox.session import Sandbox

CHANGED = 100
TARGETS = {"snapshot": 20.0, "fork of 4": 200.0}


def say(text: str) -> None:
    print(text, flush=True)


def fill(ws: Path, files: int) -> None:
    for d in range(max(1, files // 1000)):
        folder = ws / f"d{d:03d}"
        folder.mkdir()
        for f in range(min(files, 1000)):
            (folder / f"f{f:04d}").write_text(f"{d} {f}\n")


def cases() -> list[tuple[str, str, str | None]]:
    """(backend, mount, why not) for every mount a session can snapshot."""
    found: list[tuple[str, str, str | None]] = []
    for backend, mount in (("bwrap", "overlay"), ("bwrap", "copy"), ("docker", "copy")):
        why = None
        try:
            report = base.get(backend).probe()
            why = None if report.available else report.reason
        except SandboxError as exc:
            why = exc.message
        if why is None and mount == "overlay":
            why = mounts.overlay_support()
        found.append((backend, mount, why))
    return found


async def measure(ws: Path, backend: str, mount: str, rounds: int) -> dict[str, list[float]]:
    profile = load("default").with_overrides(backend=backend, **{"mount.strategy": mount, "requires": ()})
    times: dict[str, list[float]] = {"snapshot": [], "restore": [], "fork of 4": [], "4 fresh sessions (no state)": []}
    async with Sandbox.open(ws, profile=profile, mode="auto") as box:
        script = f"for i in $(seq 0 {CHANGED - 1}); do echo changed $i > d000/f$(printf %04d $i); done"
        result = await box.call("Bash", {"command": script})
        assert result.ok, result.content
        first = await box.snapshot()  # the seal's cache and the store are warm from here on
        for _ in range(rounds):
            started = time.perf_counter()
            snap = await box.snapshot()
            times["snapshot"].append((time.perf_counter() - started) * 1000)
            started = time.perf_counter()
            await box.restore(first)
            times["restore"].append((time.perf_counter() - started) * 1000)
            started = time.perf_counter()
            forks = await box.fork(4)
            times["fork of 4"].append((time.perf_counter() - started) * 1000)
            for fork in forks:
                await fork.aclose()
            fresh: list[Sandbox] = []
            started = time.perf_counter()
            async with anyio.create_task_group() as tg:
                for _ in range(4):
                    tg.start_soon(_open_into, fresh, ws, profile)
            times["4 fresh sessions (no state)"].append((time.perf_counter() - started) * 1000)
            for session in fresh:
                await session.aclose()
            for made in {snap, *(f.current_snapshot for f in forks)} - {first, None}:
                snapshots.discard(str(made))
    return times


async def _open_into(opened: list[Sandbox], ws: Path, profile: Profile) -> None:
    opened.append(await Sandbox.create(ws, profile=profile, mode="auto"))


def naive(ws: Path, rounds: int) -> dict[str, list[float]]:
    """``cp -a`` of the whole workspace: the snapshot (and four: the fork) done by copying."""
    out: dict[str, list[float]] = {"cp -a (a snapshot by copy)": [], "4 x cp -a (a fork by copy)": []}
    with tempfile.TemporaryDirectory() as scratch:
        for i in range(rounds):
            started = time.perf_counter()
            subprocess.run(["cp", "-a", str(ws), f"{scratch}/s{i}"], check=True)
            out["cp -a (a snapshot by copy)"].append((time.perf_counter() - started) * 1000)
            started = time.perf_counter()
            for k in range(4):
                subprocess.run(["cp", "-a", str(ws), f"{scratch}/f{i}-{k}"], check=True)
            out["4 x cp -a (a fork by copy)"].append((time.perf_counter() - started) * 1000)
            shutil.rmtree(f"{scratch}/s{i}")
            for k in range(4):
                shutil.rmtree(f"{scratch}/f{i}-{k}")
    return out


def line(label: str, values: list[float]) -> str:
    median = statistics.median(values)
    return f"  {label:<34} median {median:9.1f} ms   min {min(values):9.1f}   max {max(values):9.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--sizes", default="1000,50000")
    parser.add_argument("--only", default="", help="a mount (overlay, copy) or backend (bwrap, docker) alone")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    medians: dict[tuple[str, str, int], float] = {}
    with tempfile.TemporaryDirectory(prefix="bench-snapshots-") as root:
        os.environ.setdefault("SANDBOX_DATA_DIR", str(Path(root) / "data"))  # its snapshots go with it
        workspaces = {}
        for size in sizes:
            ws = Path(root) / f"ws{size}"
            ws.mkdir()
            fill(ws, size)
            workspaces[size] = ws
        for backend, mount, why in cases():
            if why is not None:
                say(f"\n{backend} {mount}: skipped ({why})")
                continue
            if args.only and args.only not in (backend, mount):
                continue
            for size in sizes:
                rounds = args.rounds if mount == "overlay" or size <= 1000 else max(2, args.rounds // 3)
                say(f"\n{backend} {mount}, {size} files, {CHANGED} changed, {rounds} rounds")
                times = anyio.run(measure, workspaces[size], backend, mount, rounds)
                for op, values in times.items():
                    say(line(op, values))
                    medians[(f"{backend} {mount}", op, size)] = statistics.median(values)
        for size in sizes:
            say(f"\nthe same done by copying, {size} files")
            for op, values in naive(workspaces[size], 3).items():
                say(line(op, values))
    say("\nagainst the targets (medians; 'within 2x': the larger size over the smaller)")
    for (what, op, size), value in sorted(medians.items()):
        if size != sizes[-1] or op not in TARGETS:
            continue
        small = medians.get((what, op, sizes[0]), value)
        ratio = value / small if small else float("nan")
        verdict = "meets" if value <= TARGETS[op] and ratio <= 2 else "misses"
        say(f"  {what:<14} {op:<10} {value:8.1f} ms at {size} files, {ratio:.2f}x of {sizes[0]}: {verdict}")


if __name__ == "__main__":
    main()
