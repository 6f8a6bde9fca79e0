"""The Windows backend under Wine, driven from Linux (``make test``; ``make test-wine`` alone).

The Windows suite (tests/wine, run by the official embeddable CPython under Wine through
tests/run-wine.sh) must pass, once as Wine jails run (the caller's token) and once in part
through the restricted token's code path (plumbing: Wine enforces no token); and what only
Linux can see is checked here with ``ps``: no
Wine process of a killed tree is left, after a timeout and after the executor is SIGKILLed
(the job's KILL_ON_JOB_CLOSE). Skipped, naming what is missing, where Wine is not installed;
``.ci/run`` installs it (``tests/run-wine.sh --setup``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
import uuid
import warnings
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
HARNESS = REPO / "tests" / "run-wine.sh"
HOME = Path(os.environ.get("SANDBOX_WINE_HOME", Path.home() / ".cache" / "sandbox-wine"))

pytestmark = [pytest.mark.wine, pytest.mark.slow]


@pytest.fixture(scope="module")
def wine() -> None:
    missing = [tool for tool in ("wine", "wineboot", "winepath", "x86_64-w64-mingw32-ld") if not shutil.which(tool)]
    if not (REPO / "sandbox" / "backends" / "winjob.py").is_file():  # tests/run-as-user.sh's copy of tests/
        pytest.skip(f"no checkout at {REPO}: the Windows CPython imports sandbox from a checkout")
    if missing:
        pytest.skip(f"Wine is not installed here (missing {', '.join(missing)}): `bash tests/run-wine.sh --setup`")
    done = subprocess.run(["bash", str(HARNESS), "--setup"], capture_output=True, text=True, timeout=900, check=False)
    if done.returncode != 0:
        pytest.fail(f"tests/run-wine.sh --setup failed:\n{done.stderr[-3000:]}")


def marked(marker: str) -> list[str]:
    """Command lines of live processes carrying ``marker`` (a Wine process shows its Windows one)."""
    out = subprocess.run(["ps", "-ww", "-eo", "stat=,args="], capture_output=True, text=True, check=True).stdout
    rows = [line.strip().split(None, 1) for line in out.splitlines()]
    return [row[1] for row in rows if len(row) == 2 and marker in row[1] and not row[0].startswith("Z")]


def win_workspace(tmp_path: Path) -> str:
    ws = tmp_path / "ws"
    ws.mkdir()
    return subprocess.run(["winepath", "-w", str(ws)], capture_output=True, text=True, check=True).stdout.strip()


OUTCOME = re.compile(r"\b(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\b")
STARTED = re.compile(r"^(tests/wine/\S+::\S+)", re.MULTILINE)
FLAKES_AT_MOST = 2  # more failures than this in one run is never Wine's chance


def _suite(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    argv = ["bash", str(HARNESS), "-v", "-rfE", *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=540, check=False, env=env)


def unfinished(stdout: str) -> list[str]:
    """The tests of a verbose run that failed, erred or never finished (a timeout under Windows
    dumps the threads and ends the process: no summary names the test, only the line it started)."""
    starts = list(STARTED.finditer(stdout))
    bad = []
    for here, after in zip(starts, [*starts[1:], None], strict=True):
        segment = stdout[here.end() : after.start() if after else len(stdout)]
        outcome = OUTCOME.search(segment)
        if outcome is None or outcome.group(1) in ("FAILED", "ERROR"):
            bad.append(here.group(1))
    return list(dict.fromkeys(bad))


def windows_suite(*args: str, env: dict[str, str] | None = None) -> None:
    """The Windows suite under Wine must pass. Wine 8.0 is a stand-in for Windows with faults of its
    own under load (``CreateProcess`` failing with ERROR_INTERNAL_ERROR, 1359; an event loop whose
    completion port never wakes): at most two tests that fail or hang are run once more, on their
    own, and the run passes only if they all pass then; the first failure is reported as a warning
    in the summary, never dropped."""
    done = _suite(*args, env=env)
    tail = done.stdout[-6000:] + done.stderr[-2000:]
    if done.returncode == 0:
        assert " passed" in done.stdout and " failed" not in done.stdout, tail
        return
    bad = unfinished(done.stdout)
    assert bad, f"the Windows suite failed with no test to blame:\n{tail}"
    assert len(bad) <= FLAKES_AT_MOST, f"{len(bad)} tests failed under Wine: {bad}\n{tail}"
    again = _suite(*args, *bad, env=env)
    assert again.returncode == 0, f"{bad} failed under Wine, and again on their own:\n{again.stdout[-6000:]}"
    first = tail[-1500:]
    warnings.warn(f"Wine: {bad} failed once, then passed on their own; the first run ended:\n{first}", stacklevel=2)


@pytest.mark.timeout(600)
@pytest.mark.usefixtures("wine")
def test_windows_suite_passes_under_wine() -> None:
    windows_suite()


@pytest.mark.timeout(600)
@pytest.mark.usefixtures("wine")
def test_the_token_code_path_keeps_the_contracts_under_wine() -> None:
    """The jail started through CreateProcessAsUserW with the restricted token (as on real Windows;
    ``SANDBOX_WINJOB_TOKEN_UNDER_WINE=1``): streams, exit and crash codes, tree kill, copy and tools
    hold the same. Wine enforces nothing of the token: this tests the plumbing, never a guarantee."""
    env = {**os.environ, "SANDBOX_WINJOB_TOKEN_UNDER_WINE": "1"}
    subset = "streams or crash or timeout_kills or close_kills or copy or file_tools or runner or token"
    windows_suite("-k", subset, env=env)


@pytest.mark.timeout(180)
@pytest.mark.usefixtures("wine")
def test_timeout_leaves_no_wine_process_of_the_tree(tmp_path: Path) -> None:
    marker = f"sbxwine{uuid.uuid4().hex[:10]}"
    argv = ["bash", str(HARNESS), "--python", "tests/wine/scenario.py", "timeout", marker, win_workspace(tmp_path)]
    seen = 0
    with subprocess.Popen(argv, stdout=subprocess.PIPE, text=True) as proc:
        while proc.poll() is None:
            seen = max(seen, len(marked(marker)))
            time.sleep(0.2)
        out, _ = proc.communicate()
    assert proc.returncode == 0, out
    result = json.loads(out.strip().splitlines()[-1])
    assert result["timed_out"] and result["exit_code"] == 137, result
    assert seen >= 6, f"the tree never showed up in ps ({seen} processes)"  # tree.py + 4 children + grandchild
    assert marked(marker) == []


@pytest.mark.timeout(180)
@pytest.mark.usefixtures("wine")
def test_sigkilled_executor_leaves_no_wine_process(tmp_path: Path) -> None:
    marker = f"sbxwine{uuid.uuid4().hex[:10]}"
    argv = ["bash", str(HARNESS), "--python", "tests/wine/scenario.py", "hold", marker, win_workspace(tmp_path)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("ready"), line
        assert len(marked(marker)) >= 6
        executor = [line for line in marked(marker) if "python.exe tests/wine/scenario.py" in line]
        assert len(executor) == 1, executor
        pid = int(
            subprocess.run(
                ["pgrep", "-f", f"python.exe tests/wine/scenario.py hold {marker}"],
                capture_output=True,
                text=True,
                check=True,
            ).stdout.split()[0]
        )
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 20
        while marked(marker) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert marked(marker) == [], "KILL_ON_JOB_CLOSE left processes of the tree"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the harness's bash and its `cat`
        proc.communicate()
