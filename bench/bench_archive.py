"""A copy mount over the archive API (a remote engine) against the local bind path (part of `make bench`).

For workspaces of 1,000 and 10,000 small files: **copy-in**, ``open_jail`` of a ``copy`` session
(the private copy, then, remote, the tar stream into the engine's volume and the carrier
container that hands its root to the command uid; local, the copy bound into the container),
and **copy-out**, ``changes()`` after a command rewrote 100 files (remote: the volume read back as a
tar stream and mirrored into the private copy first; local: a stat per entry). One run each;
the ratio is remote / local.

The remote engine is a second dockerd over TLS on a loopback port (:mod:`tests.remote_engine`,
as root); without root, the host's engine declared remote (``docker.remote = true``), which
costs the archive API without TLS. Both engines run on this machine: the ratio is the archive
API's cost, not a network's.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sandbox import exec as executor  # after the checkout is on the path
from sandbox import profile as profiles
from sandbox.backends import base
from sandbox.errors import SandboxError

if TYPE_CHECKING:
    from collections.abc import Iterator

SIZES = tuple(int(n) for n in os.environ.get("BENCH_ARCHIVE_SIZES", "1000,10000").split(","))
TOUCHED = 100
PER_DIR = 100
OUT = Path(__file__).resolve().parent / "out" / "archive.json"
WRITE = 'for f in "$@"; do echo changed >> "$f"; done'


def say(text: str) -> None:
    print(text, flush=True)


def rel(index: int) -> str:
    return f"d{index // PER_DIR:04d}/f{index:06d}.txt"


def make_workspace(root: Path, size: int) -> Path:
    ws = root / f"ws-{size}"
    for index in range(size):
        path = ws / rel(index)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"file {index}: a small line of text for the archive benchmark\n")
    if os.geteuid() == 0:  # owned like a checkout: the jail's commands run as the owner, never root
        for path in (ws, *ws.rglob("*")):
            os.chown(path, 1000, 1000, follow_symlinks=False)
    return ws


def profile(**overrides: Any) -> profiles.Profile:
    return profiles.load("untrusted").with_overrides(
        **{"requires": (), "mount.exclude": (), "docker.lifecycle": "session", **overrides}
    )


async def measure(ws: Path, prof: profiles.Profile) -> dict[str, float]:
    backend = base.get("docker")
    started = time.perf_counter()
    jail = await backend.open_jail(ws, prof)
    copy_in = time.perf_counter() - started
    try:
        touched = [rel(i) for i in range(0, TOUCHED * 7, 7)]
        result = await executor.run(jail, ["/bin/sh", "-c", WRITE, "write", *touched])
        if result.exit_code != 0:
            raise RuntimeError(f"the write command failed: {result.stderr[:300]}")
        started = time.perf_counter()
        changes = await jail.changes()
        copy_out = time.perf_counter() - started
        assert changes is not None
        if len(changes.changes) != TOUCHED:
            raise RuntimeError(f"expected {TOUCHED} changes, got {len(changes.changes)}")
    finally:
        await jail.aclose()
    return {"copy_in_s": copy_in, "copy_out_s": copy_out}


@contextlib.contextmanager
def remote_engine(hidden: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """The remote engine's profile overrides, and what it is."""
    from sandbox.backends.docker.client import DEFAULT_IMAGE
    from tests import remote_engine as engines

    try:
        engine = engines.start(hidden, DEFAULT_IMAGE)
    except engines.Unavailable as exc:
        say(f"  (no second dockerd: {exc}; the host's engine declared remote instead, no TLS)")
        yield "the host's engine with docker.remote = true (unix socket)", {"docker.remote": True}
        return
    try:
        yield f"a second dockerd over TLS at {engine.host}", engine.profile_overrides()
    finally:
        engines.stop(engine)


def row(size: int, remote: dict[str, float], local: dict[str, float]) -> dict[str, Any]:
    return {
        "files": size,
        "remote": remote,
        "local": local,
        "ratio": {key: remote[key] / local[key] for key in remote if local[key] > 0},
    }


async def main_async() -> int:
    scratch = Path(tempfile.mkdtemp(prefix="sandbox-bench-archive-"))
    os.environ.setdefault("SANDBOX_DATA_DIR", str(scratch / "data"))
    rows: list[dict[str, Any]] = []
    try:
        report = base.get("docker").probe()
        if not report.available:
            say(f"skipped: the docker backend is unavailable here ({report.reason})")
            return 0
        with remote_engine(scratch) as (what, overrides):
            say(f"remote: {what}")
            head = (
                f"{'copy-in remote':>15} {'local':>8} {'ratio':>6}  {'copy-out remote':>16} {'local':>8} {'ratio':>6}"
            )
            say(f"{'files':>7}  {head}")
            for size in SIZES:
                ws = make_workspace(scratch, size)
                remote = await measure(ws, profile(**overrides))
                local = await measure(ws, profile())
                rows.append(row(size, remote, local))
                r = rows[-1]["ratio"]
                say(
                    f"{size:>7}  {remote['copy_in_s'] * 1000:>13.0f}ms {local['copy_in_s'] * 1000:>6.0f}ms "
                    f"{r['copy_in_s']:>5.1f}x  {remote['copy_out_s'] * 1000:>14.0f}ms "
                    f"{local['copy_out_s'] * 1000:>6.0f}ms {r['copy_out_s']:>5.1f}x"
                )
                shutil.rmtree(ws, ignore_errors=True)
        OUT.parent.mkdir(parents=True, exist_ok=True)
        OUT.write_text(json.dumps({"remote": what, "touched": TOUCHED, "rows": rows}, indent=2) + "\n")
    except SandboxError as exc:
        say(f"failed: {exc}")
        return 1
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


def main() -> int:
    return anyio.run(main_async)


if __name__ == "__main__":
    sys.exit(main())
