"""A real suite with its dependencies installed in the jail, against the same on the host (part of `make bench`).

The workload is the recipe of docs/unattended.md on a project nobody here wrote: more-itertools'
source distribution (``make test-fixtures``) as the workspace, then ``python3 -m venv .venv &&
.venv/bin/pip install . pytest && .venv/bin/python -m pytest -q``, its packages from the hermetic
index of tests/registries.py on loopback. Each round times, in one run:

* **host**: that command run directly (``PIP_INDEX_URL`` set to the index);
* **jail**: ``sandbox run --profile untrusted-deps --backend bwrap --allow-index pypi=URL -- ...``,
  the whole command (copy-in, the allowlist proxy, the changeset at the end included);

each **cold** (an empty pip download cache) and **warm** (pip's cache already holding every
download, as a second install of the project finds it). The cache is outside the workspace on both
sides, as a user's is: the host's in a directory of its own (``PIP_CACHE_DIR``), the jail's the
project's download cache of the data directory (``--download-cache project``, bound into the jail;
seeded for a warm run with a copy of the same cache, untimed). A fresh copy of the project for every
run. Medians of ``BENCH_DEPS_REPS`` (3) rounds, host and jail alternating. Targets: jail/host <=
1.15x cold, <= 1.05x warm; exit 1 if missed, exit 0 with a reason if bubblewrap or the fixtures
are missing.
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

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from sandbox import downloads  # noqa: E402
from tests import registries  # noqa: E402 (the checkout's tests/ package, beside bench/)

PROJECT = os.environ.get("BENCH_DEPS_PROJECT", "more-itertools")
REPS = int(os.environ.get("BENCH_DEPS_REPS", "3"))
TARGETS = {"cold": 1.15, "warm": 1.05}
SANDBOX = str(Path(sys.executable).with_name("sandbox"))
RECIPE = (
    "python3 -m venv .venv && .venv/bin/pip install -q --disable-pip-version-check . pytest"
    " && .venv/bin/python -m pytest -q -p no:cacheprovider"
)
OUT = HERE / "out" / "deps.json"
RUN_TIMEOUT_S = 900


def say(text: str) -> None:
    print(text, flush=True)


def workspace(sdist: Path, scratch: Path) -> Path:
    """A fresh copy of the project."""
    return registries.unpack(sdist, Path(tempfile.mkdtemp(dir=scratch)))


def fresh_cache(scratch: Path, seed: Path | None) -> Path:
    """An empty pip cache, or a copy of ``seed``."""
    where = Path(tempfile.mkdtemp(dir=scratch)) / "pip"
    if seed is not None:
        shutil.copytree(seed, where, symlinks=True)
    return where


def timed(argv: list[str], cwd: Path, env: dict[str, str]) -> float:
    started = time.perf_counter()
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=False)
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"{argv[0]} exited {done.returncode}:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    return elapsed


def host_run(project: Path, index: str, cache: Path) -> float:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(project), "LANG": "C.UTF-8", "PIP_INDEX_URL": index}
    env["PIP_CACHE_DIR"] = str(cache)
    return timed(["sh", "-c", RECIPE], project, env)


def jail_run(project: Path, index: str, data: Path, seed: Path | None = None, recipe: str = RECIPE) -> float:
    """``sandbox run`` of the recipe with the project's download cache (a copy of ``seed`` in it)."""
    env = dict(os.environ, SANDBOX_DATA_DIR=str(data))
    if seed is not None:
        os.environ["SANDBOX_DATA_DIR"] = str(data)  # where downloads.host_dir looks, as the run will
        try:
            entry = downloads.host_dir(project, "bwrap")
        finally:
            del os.environ["SANDBOX_DATA_DIR"]
        shutil.copytree(seed, entry / "cache" / "pip", symlinks=True)
    argv = [SANDBOX, "run", "--profile", "untrusted-deps", "--backend", "bwrap", "--allow-index", f"pypi={index}"]
    argv += ["--download-cache", "project", "--workspace", str(project)]
    return timed([*argv, "--", "sh", "-c", recipe], project, env)


def warm_cache(sdist: Path, scratch: Path, index: str) -> Path:
    """pip's download cache after one install of the project: what every warm run starts from."""
    cache = fresh_cache(scratch, None)
    host_run(workspace(sdist, scratch), index, cache)
    return cache


def measure(sdist: Path, scratch: Path, index: str) -> dict[str, dict[str, list[float]]]:
    warm = warm_cache(sdist, scratch, index)
    times: dict[str, dict[str, list[float]]] = {kind: {"host": [], "jail": []} for kind in TARGETS}
    for rep in range(REPS):
        for kind in TARGETS:
            seed = warm if kind == "warm" else None
            times[kind]["host"].append(host_run(workspace(sdist, scratch), index, fresh_cache(scratch, seed)))
            data = scratch / f"data{rep}{kind}"
            times[kind]["jail"].append(jail_run(workspace(sdist, scratch), index, data, seed))
            say(f"  round {rep + 1} {kind}: host {times[kind]['host'][-1]:.2f} s, jail {times[kind]['jail'][-1]:.2f} s")
    return times


def report(times: dict[str, dict[str, list[float]]]) -> list[str]:
    """Print the medians and ratios; the targets missed."""
    missed = []
    say(f"{'':6} {'host s':>8} {'jail s':>8} {'ratio':>7} {'target':>7}")
    for kind, target in TARGETS.items():
        host, jail = (statistics.median(times[kind][where]) for where in ("host", "jail"))
        ratio = jail / host
        say(f"{kind:6} {host:8.2f} {jail:8.2f} {ratio:6.2f}x {target:6.2f}x")
        if ratio > target:
            missed.append(f"{kind} {ratio:.2f}x > {target}x")
    return missed


def main() -> int:
    if shutil.which("bwrap") is None:
        say("skipped: bubblewrap is not installed")
        return 0
    try:
        root = registries.require_fixtures()
    except registries.FixturesMissing as exc:
        say(f"skipped: {exc}")
        return 0
    sdist = registries.sdist(root, PROJECT)
    say(f"{PROJECT}: venv + pip install . pytest + its suite, {REPS} rounds, host against sandbox run (bwrap)")
    with registries.running(root) as served, tempfile.TemporaryDirectory(prefix="bench-deps-") as scratch:
        times = measure(sdist, Path(scratch), served.pypi_url)
        # What the jail costs whatever the work: the same command with nothing to do (`true`).
        fixed = jail_run(workspace(sdist, Path(scratch)), served.pypi_url, Path(scratch) / "data-true", recipe="true")
    missed = report(times)
    say(f"sandbox run -- true on the same workspace: {fixed:.2f} s (the fixed part of the jail's time)")
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps({"project": PROJECT, "times": times, "true_s": fixed, "targets": TARGETS}, indent=1))
    if missed:
        say(f"missed: {', '.join(missed)}")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
