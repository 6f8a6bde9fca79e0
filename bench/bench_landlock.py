"""The Landlock backend's cost per call, in one run beside bubblewrap and Codex's sandbox.

Rows, each the median of ``-n`` calls, interleaved round by round (the machine is shared):

* a call in an open Landlock jail (``ro``, nothing required): the launcher per call;
* a call in the warm bubblewrap jail, and in a per-call bubblewrap jail (``lifecycle = "call"``);
* bare ``bwrap`` with our jail's flags running ``true`` (a whole process);
* Codex's native ``codex sandbox -- true`` (a whole process; the pinned peer of bench_startup.py).

The ratio column divides the Landlock row by each of the others. The issue's target: at or
below bare bubblewrap's.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import anyio

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import bench_startup as startup  # noqa: E402

from sandbox import exec as executor  # noqa: E402
from sandbox import profile as profiles  # noqa: E402
from sandbox.backends import base  # noqa: E402
from sandbox.errors import SandboxError  # noqa: E402


async def jail_rows(ws: Path, n: int) -> dict[str, list[float]]:
    """Per-call seconds in open jails, the jails' rounds interleaved."""
    ro = profiles.Profile().with_overrides(**{"mount.strategy": "ro"})
    wanted = {
        "landlock": ("landlock", ro),
        "bwrap warm": ("bwrap", ro),
        "bwrap per call": ("bwrap", ro.with_overrides(**{"bwrap.lifecycle": "call"})),
    }
    jails: dict[str, base.Jail] = {}
    samples: dict[str, list[float]] = {name: [] for name in wanted}
    try:
        for name, (backend, profile) in wanted.items():
            try:
                jails[name] = await base.get(backend).open_jail(ws, profile)
            except SandboxError as exc:
                print(f"{name}: unavailable ({exc.message})")
        for jail in jails.values():
            await executor.run(jail, ["true"])  # warm the page cache and the cgroup pool
        for _ in range(n):
            for name, jail in jails.items():
                started = time.perf_counter()
                result = await executor.run(jail, ["true"])
                samples[name].append(time.perf_counter() - started)
                assert result.exit_code == 0, result
    finally:
        for jail in jails.values():
            await jail.aclose()
    return samples


def process_rows(ws: Path, n: int) -> dict[str, list[float]]:
    samples: dict[str, list[float]] = {}
    cases = {"bare bwrap -- true": lambda: startup.bare_bwrap_argv(ws)}
    problem = startup.ensure_peers()
    for name, argv in cases.items():
        try:
            command = argv()
            samples[name] = [startup.run_once(command, ws) for _ in range(n)]
        except startup.Unavailable as exc:
            print(f"{name}: unavailable ({exc})")
    codex = startup.codex_case(ws, problem)
    if codex.why_not:
        print(f"codex sandbox: unavailable ({codex.why_not})")
    else:
        codex.once()  # its first run links its helpers
        samples["codex sandbox -- true"] = [codex.once()[0] for _ in range(n)]
    return samples


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("-n", type=int, default=40, help="calls of each row (default 40)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-landlock-") as tmp:
        ws = Path(tmp) / "ws"
        ws.mkdir()
        (ws / "README.md").write_text("bench\n")
        rows = anyio.run(jail_rows, ws, args.n)
        rows |= process_rows(ws, args.n)
    medians = {name: statistics.median(values) * 1000 for name, values in rows.items() if values}
    mine = medians.get("landlock")
    print(f"{'row':40} {'median ms':>10} {'min':>8} {'max':>8} {'landlock ÷ row':>15}")
    for name, values in rows.items():
        if not values:
            continue
        ratio = f"{mine / medians[name]:.2f}" if mine else "-"
        print(f"{name:40} {medians[name]:10.1f} {min(values) * 1000:8.1f} {max(values) * 1000:8.1f} {ratio:>15}")
    if mine is None:
        print("landlock: no figure (unavailable here)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
