"""The microvm backend in one run beside bubblewrap, bare bwrap, ``docker run --rm`` and the host.

Rows (medians; rounds interleaved where the rows are calls, since the machine is shared):

* **cold boot**: opening a microvm jail, QEMU's start to the agent's first word, then a call of ``true``;
* **from the pool** (root): the same when a booted VM waits (``sandbox.backends.microvm.pool``);
* **warm call**: ``true`` in an open microvm jail, a warm bubblewrap jail, bare ``bwrap`` with our
  flags, and ``docker run --rm`` of the sandbox image;
* **stdout**: ``--stdout-mib`` MiB of stdout read through the microvm jail and the bubblewrap one;
* **a real suite**: more-itertools' own unittest suite (its sdist, from ``make test-fixtures``) in
  the microvm jail against the host's ``python3``.

The issue's targets (with hardware KVM): warm call <= 10 ms, cold start from the pool <= 50 ms,
cold boot <= 500 ms, stdout >= 0.5x bubblewrap, suite <= 1.2x host. ``accel`` says whether this
host gave KVM or emulation (TCG).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
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
from sandbox.backends.microvm import machine  # noqa: E402
from sandbox.errors import SandboxError  # noqa: E402
from tests import registries  # noqa: E402

FIXTURES = HERE.parent / ".cache" / "fixtures"
SUITE = "more-itertools"
IMAGE = "sandbox-runtime:0.1.0"


def _own(path: Path) -> None:
    if os.geteuid() == 0:  # a root-owned workspace runs as 1000 in the jail
        for root, dirs, files in os.walk(path):
            for name in (root, *(os.path.join(root, n) for n in dirs + files)):
                os.chown(name, 1000, 1000, follow_symlinks=False)


async def cold(ws: Path, rounds: int) -> list[float]:
    profile = profiles.Profile().with_overrides(**{"mount.strategy": "ro"})
    samples = []
    for _ in range(rounds):
        started = time.perf_counter()
        jail = await base.get("microvm").open_jail(ws, profile)
        try:
            await executor.run(jail, ["true"])
            samples.append(time.perf_counter() - started)
        finally:
            await jail.aclose()
    return samples


async def pooled(ws: Path, rounds: int) -> tuple[list[float], list[float]]:
    """Opening a jail when a booted VM waits in the pool (root only: staged VMs); and that, then ``true``."""
    from sandbox.backends.microvm import pool

    profile = profiles.Profile().with_overrides(**{"mount.strategy": "ro"})
    opened: list[float] = []
    samples: list[float] = []
    if not pool.staged(1000 if os.geteuid() == 0 else os.getuid()):
        print("pool: none as an ordinary user (VMs boot with their session)")
        return opened, samples
    for _ in range(rounds):
        with anyio.fail_after(300):
            while not any(pool.POOL._ready.values()):  # noqa: ASYNC110 - a thread fills it
                await anyio.sleep(0.2)
        started = time.perf_counter()
        jail = await base.get("microvm").open_jail(ws, profile)
        opened.append(time.perf_counter() - started)
        try:
            await executor.run(jail, ["true"])
            samples.append(time.perf_counter() - started)
        finally:
            await jail.aclose()
    return opened, samples


async def warm(ws: Path, n: int, stdout_mib: int) -> tuple[dict[str, list[float]], dict[str, float]]:
    profile = profiles.Profile().with_overrides(**{"mount.strategy": "ro"})
    jails: dict[str, base.Jail] = {}
    samples: dict[str, list[float]] = {}
    rates: dict[str, float] = {}
    try:
        for name in ("microvm", "bwrap"):
            try:
                jails[name] = await base.get(name).open_jail(ws, profile)
                samples[f"{name} warm call"] = []
            except SandboxError as exc:
                print(f"{name}: unavailable ({exc.message})")
        for jail in jails.values():
            await executor.run(jail, ["true"])
        for _ in range(n):
            for name, jail in jails.items():
                started = time.perf_counter()
                result = await executor.run(jail, ["true"])
                samples[f"{name} warm call"].append(time.perf_counter() - started)
                assert result.exit_code == 0, result
        for name, jail in jails.items():
            seen = 0

            def count(chunk: bytes) -> None:
                nonlocal seen
                seen += len(chunk)

            started = time.perf_counter()
            script = f"head -c {stdout_mib}M /dev/zero"
            await executor.run(jail, ["/bin/sh", "-c", script], on_stdout=count, capture_bytes=4096, timeout=300)
            elapsed = time.perf_counter() - started
            assert seen == stdout_mib << 20, (name, seen)
            rates[name] = stdout_mib / elapsed
    finally:
        for jail in jails.values():
            await jail.aclose()
    return samples, rates


def processes(ws: Path, n: int) -> dict[str, list[float]]:
    samples: dict[str, list[float]] = {}
    try:
        command = startup.bare_bwrap_argv(ws)
        samples["bare bwrap -- true"] = [startup.run_once(command, ws) for _ in range(n)]
    except startup.Unavailable as exc:
        print(f"bare bwrap: unavailable ({exc})")
    docker = shutil.which("docker")
    if docker and subprocess.run([docker, "image", "inspect", IMAGE], capture_output=True).returncode == 0:
        command = [docker, "run", "--rm", "--network", "none", IMAGE, "true"]
        samples["docker run --rm -- true"] = [startup.run_once(command, ws) for _ in range(max(3, n // 4))]
    else:
        print(f"docker run: unavailable (no docker or no {IMAGE})")
    return samples


async def suite(ws: Path) -> tuple[float, float] | None:
    try:
        top = registries.unpack(registries.sdist(FIXTURES, SUITE), ws)
    except registries.FixturesMissing as exc:
        print(f"suite: unavailable ({exc})")
        return None
    _own(ws)
    argv = ["python3", "-m", "unittest", "discover", "-s", "tests", "-q"]
    started = time.perf_counter()
    await anyio.run_process(argv, cwd=top, check=True)
    host = time.perf_counter() - started
    jail = await base.get("microvm").open_jail(ws, profiles.Profile().with_overrides(**{"mount.strategy": "rw"}))
    try:
        started = time.perf_counter()
        result = await executor.run(jail, argv, cwd=str(top), timeout=600)
        guest = time.perf_counter() - started
        assert result.exit_code == 0, result.stderr[-2000:]
    finally:
        await jail.aclose()
    return host, guest


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("-n", type=int, default=20, help="warm calls of each row (default 20)")
    parser.add_argument("--boots", type=int, default=3, help="cold boots (default 3)")
    parser.add_argument("--stdout-mib", type=int, default=1024, help="stdout read through each jail (default 1024)")
    args = parser.parse_args()
    kind, why = machine.accel()
    print(f"accel: {kind} ({why})")
    with tempfile.TemporaryDirectory(prefix="bench-microvm-") as tmp:
        ws = Path(tmp) / "ws"
        ws.mkdir()
        (ws / "README.md").write_text("bench\n")
        Path(tmp).chmod(0o755)  # QEMU and bwrap run as the workspace's owner, who must reach it
        _own(ws)
        boots = anyio.run(cold, ws, args.boots)  # the second asks the pool to keep one booted
        opened, from_pool = anyio.run(pooled, ws, args.boots)
        rows, rates = anyio.run(warm, ws, args.n, args.stdout_mib)
        rows |= processes(ws, args.n)
        suite_ws = Path(tmp) / "suite"
        suite_ws.mkdir()
        timed = anyio.run(suite, suite_ws)
    print(f"{'row':32} {'median ms':>10} {'min':>8} {'max':>8} {'microvm ÷ row':>14}")
    print(f"{'microvm cold boot + true':32} {statistics.median(boots) * 1000:10.0f} {min(boots) * 1000:8.0f} "
          f"{max(boots) * 1000:8.0f}")  # fmt: skip
    if from_pool:
        print(f"{'microvm open from the pool':32} {statistics.median(opened) * 1000:10.0f} "
              f"{min(opened) * 1000:8.0f} {max(opened) * 1000:8.0f}")  # fmt: skip
        print(f"{'microvm open from the pool + true':32} {statistics.median(from_pool) * 1000:10.0f} "
              f"{min(from_pool) * 1000:8.0f} {max(from_pool) * 1000:8.0f}")  # fmt: skip
    mine = statistics.median(rows["microvm warm call"]) if rows.get("microvm warm call") else None
    for name, values in rows.items():
        if not values:
            continue
        median = statistics.median(values)
        ratio = f"{mine / median:.2f}" if mine else "-"
        print(f"{name:32} {median * 1000:10.1f} {min(values) * 1000:8.1f} {max(values) * 1000:8.1f} {ratio:>14}")
    for name, rate in rates.items():
        print(f"stdout through {name:17} {rate:10.0f} MiB/s")
    if "microvm" in rates and "bwrap" in rates:
        print(f"stdout: microvm ÷ bwrap = {rates['microvm'] / rates['bwrap']:.2f}")
    if timed is not None:
        host, guest = timed
        print(f"{SUITE} suite: host {host:.1f} s, microvm {guest:.1f} s, ratio {guest / host:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
