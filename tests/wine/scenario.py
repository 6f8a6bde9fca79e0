"""Scenarios the Linux side watches with ``ps`` (tests/integration/test_wine.py), run by the
Windows CPython under Wine: ``python scenario.py timeout|hold MARKER WORKSPACE``.

``timeout``: tree.py in a winjob call with a 5 s timeout; prints the result as JSON when the call
has returned (by then, every process of the tree must be gone). ``hold``: the same tree, spawned
and left running; prints ``ready`` once it is up, then sleeps until the Linux side SIGKILLs us
(KILL_ON_JOB_CLOSE must then end the tree).
"""

import sys
import tempfile
import time
from pathlib import Path

import anyio

from sandbox import exec as executor
from sandbox import profile as profiles
from sandbox.backends import base
from tests.wine.conftest import PROFILE_TOML

TREE = str(Path(__file__).with_name("tree.py"))


async def main(mode: str, marker: str, workspace: str) -> None:
    tmp = Path(tempfile.mkdtemp())
    (tmp / "windows.toml").write_text(PROFILE_TOML)
    prof = profiles.load_file(tmp / "windows.toml")
    pidfile = tmp / "pids"
    async with await base.get("winjob").open_jail(Path(workspace), prof) as jail:
        if mode == "timeout":
            result = await executor.run(jail, [sys.executable, TREE, marker, str(pidfile)], timeout=5)
            sys.stdout.write(result.model_dump_json() + "\n")
            sys.stdout.flush()
            return
        proc = await jail.spawn([sys.executable, TREE, marker, str(pidfile)])
        while len(pidfile.read_text().split() if pidfile.exists() else []) < 5:
            await anyio.sleep(0.05)
        sys.stdout.write(f"ready {len(proc.running_pids())}\n")
        sys.stdout.flush()
        time.sleep(600)  # noqa: ASYNC251 - blocking on purpose: only a SIGKILL ends this


if __name__ == "__main__":
    anyio.run(main, sys.argv[1], sys.argv[2], sys.argv[3])
