"""Docker backend latency against the docker CLI, in one run (part of `make bench`).

* warm exec: one call through our backend in a session container (started by the container's
  agent over its unix socket, no ``docker exec``) vs ``docker exec`` on that same container
  (target: ours <= 0.5x the CLI's);
* per-call container: our ``lifecycle = "call"`` (a fresh container per call, taken from the
  jail's pool of started ones, the call through its agent) vs ``docker run --rm`` with the same
  image and confinement flags (target: ours <= 0.5x). Two figures: a call that finds the pool
  refilled (an agent's calls are seconds apart: the model thinks between them; the refill is
  not timed), and calls back to back, where each waits for the refill of the one before, so
  that figure is the pool's throughput, a container start, not a call's latency;
* optionally (``--build``) the time of a forced offline image build (rootfs tarball cached).

Prints medians of N runs and the ratios. Needs a running daemon and the image (`make image`).
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import anyio

from sandbox import exec as executor
from sandbox.backends import docker as dockerb
from sandbox.errors import SandboxError
from sandbox.profile import load

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from sandbox.backends.docker import DockerJail


def say(text: str) -> None:
    print(text, flush=True)


def median_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1000


async def timed(n: int, call: Callable[[], Awaitable[object]]) -> list[float]:
    await call()  # warm-up: connections, page cache
    samples = []
    for _ in range(n):
        started = time.perf_counter()
        await call()
        samples.append(time.perf_counter() - started)
    return samples


async def cli(argv: list[str]) -> None:
    result = await anyio.run_process(argv, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed: {result.stderr.decode(errors='replace')}")


async def open_jail(workspace: Path, lifecycle: str) -> DockerJail:
    profile = load("default").with_overrides(**{"docker.lifecycle": lifecycle})
    jail = await dockerb.DockerBackend().open_jail(workspace, profile)
    assert isinstance(jail, dockerb.DockerJail)
    return jail


async def warm(workspace: Path, n: int, docker_cli: str) -> tuple[float, float]:
    jail = await open_jail(workspace, "session")
    try:
        ours = await timed(n, lambda: executor.run(jail, ["true"]))
        cid = jail.container_id
        assert cid is not None
        theirs = await timed(n, lambda: cli([docker_cli, "exec", "-u", jail.user, cid, "true"]))
    finally:
        await jail.aclose()
    return median_ms(ours), median_ms(theirs)


@dataclass
class PerCall:
    ready: float  # median ms of a call that finds the pool refilled
    back_to_back: float  # median ms of calls one after the other
    docker_run: float  # median ms of ``docker run --rm``
    started: int  # containers the pool started, for the calls of both figures


async def per_call(workspace: Path, n: int, docker_cli: str) -> PerCall:
    jail = await open_jail(workspace, "call")
    assert isinstance(jail, dockerb.PerCallJail)
    run = [
        docker_cli,
        "run",
        "--rm",
        "--network",
        "none",
        "--read-only",
        "--cap-drop",
        "ALL",
        "--security-opt",
        "no-new-privileges",
        "-u",
        jail.user,
        dockerb.DEFAULT_IMAGE,
        "true",
    ]

    async def after_refill() -> None:
        await jail.pool.full()  # not timed: the pause an agent's model gives between calls
        started = time.perf_counter()
        await executor.run(jail, ["true"])
        samples.append(time.perf_counter() - started)

    samples: list[float] = []
    try:
        for _ in range(n + 1):
            await after_refill()
        ready = samples[1:]  # the first one warms up
        back_to_back = await timed(n, lambda: executor.run(jail, ["true"]))
        theirs = await timed(n, lambda: cli(run))
        started = jail.pool.started
    finally:
        await jail.aclose()
    return PerCall(median_ms(ready), median_ms(back_to_back), median_ms(theirs), started)


def build_time() -> float:
    started = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "sandbox.cli", "image", "build", "--force", "--mode", "offline"],
        check=True,
        capture_output=True,
    )
    return time.perf_counter() - started


async def main_async(n: int, with_build: bool) -> int:
    docker_cli = shutil.which("docker")
    if docker_cli is None:
        say("bench_docker: skipped, no docker CLI to compare against")
        return 0
    report = dockerb.probe()
    if not report.available:
        say(f"bench_docker: skipped, {report.reason}")
        return 0
    with tempfile.TemporaryDirectory(prefix="bench-docker-") as tmp:
        ours, theirs = await warm(Path(tmp), n, docker_cli)
        say(
            f"warm exec      ours {ours:7.1f} ms   docker exec    {theirs:7.1f} ms   ratio {ours / theirs:.2f}"
            f"  (target <= 0.50, median of {n})"
        )
        calls = await per_call(Path(tmp), n, docker_cli)
        say(
            f"call container ours {calls.ready:7.1f} ms   docker run --rm {calls.docker_run:6.1f} ms   "
            f"ratio {calls.ready / calls.docker_run:.2f}  (target <= 0.50, median of {n}; pool refilled between calls)"
        )
        say(
            f"call container ours {calls.back_to_back:7.1f} ms   docker run --rm {calls.docker_run:6.1f} ms   "
            f"ratio {calls.back_to_back / calls.docker_run:.2f}  (back to back: the pool's refill rate; "
            f"{calls.started} containers started)"
        )
    if with_build:
        say(f"image build (offline, rootfs cached, forced): {build_time():.1f} s")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("-n", type=int, default=20, help="runs per measurement (default 20)")
    parser.add_argument("--build", action="store_true", help="also time a forced offline image build")
    opts = parser.parse_args()
    with contextlib.suppress(KeyboardInterrupt):
        try:
            return anyio.run(main_async, opts.n, opts.build)
        except SandboxError as exc:
            say(f"bench_docker: {exc}")
            return 1
    return 130


if __name__ == "__main__":
    sys.exit(main())
