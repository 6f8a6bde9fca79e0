"""The work of a killed executor is kept, never deleted (issue 33, item 2).

``sandbox run --mount copy`` is SIGKILLed while its command runs: nothing of ours could keep the
changeset then. Its private copy, with the baselines saved beside it at copy-in, is recovered into a
changeset (source ``recovered``) by ``sandbox gc``, or by the next session that opens, which says
so in its notices; the copy is removed only after that. On bubblewrap and Docker.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from typing import TYPE_CHECKING

import pytest

from sandbox import changes
from sandbox.backends import cgroups
from sandbox.session import Sandbox
from tests.integration.test_changes_cli import SANDBOX, cli_backend, sandbox

if TYPE_CHECKING:
    from pathlib import Path

    from sandbox.vocabulary import BackendChoice

__all__ = ["cli_backend"]  # the fixture, shared
RECOVERED = re.compile(r"recovered the work of a killed executor as (ch-[0-9a-f]{12})")


def _killed_mid_command(backend: str, workspace: Path, data_dir: Path) -> int:
    """A copy run that wrote ``new.txt`` and changed ``README.md``, SIGKILLed before it could keep
    them; its pid. On bubblewrap it leaves its call's cgroups where this host delegates them."""
    script = "echo work > new.txt && echo changed > README.md && echo ready && exec sleep 60"
    argv = [SANDBOX, "run", "--backend", backend, "--mount", "copy", "--workspace", str(workspace), "--"]
    proc = subprocess.Popen([*argv, "sh", "-c", script], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        left = bool(_cgroups_of(proc.pid)) or backend != "bwrap" or not _delegated()
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(30)
        if proc.stdout is not None:
            proc.stdout.close()
    assert [p for p in (data_dir / "copies").iterdir() if p.is_dir()], "the killed run left no private copy"
    assert left, "the bwrap run had no call cgroup to leave: the sweep would be tested on nothing"
    return proc.pid


def _delegated() -> bool:
    return any(isinstance(h, cgroups.Hierarchy) for h in cgroups.hierarchies().values())


def _assert_kept(changeset_id: str, workspace: Path) -> None:
    kept = changes.load(changeset_id)
    assert kept.source == "recovered"
    assert {e.change.path for e in kept.entries} == {"new.txt", "README.md"}
    assert (workspace / "README.md").read_text() == "# sample\n"  # nothing reached the host unasked
    applied = sandbox("changes", "apply", changeset_id, "--json")
    assert applied.returncode == 0, applied.stderr
    assert (workspace / "new.txt").read_text() == "work\n"
    assert (workspace / "README.md").read_text() == "changed\n"


@pytest.mark.slow
def test_gc_keeps_a_killed_runs_work_as_a_changeset(cli_backend: str, workspace: Path, data_dir: Path) -> None:
    _killed_mid_command(cli_backend, workspace, data_dir)
    done = sandbox("gc")
    found = RECOVERED.search(done.stderr)
    assert found, done.stderr
    assert not [p for p in (data_dir / "copies").iterdir() if p.is_dir()]  # removed once kept
    _assert_kept(found[1], workspace)
    listed = json.loads(sandbox("changes", "list", "--json").stdout)["changesets"]
    assert [c["id"] for c in listed] == [found[1]]


def _cgroups_of(pid: int) -> list[Path]:
    """The call cgroups an executor of pid ``pid`` named for itself (``call-<pid>-<start>-…``)."""
    bases = {h.base for h in cgroups.hierarchies().values() if isinstance(h, cgroups.Hierarchy)}
    return [entry for base in bases if base.is_dir() for entry in base.glob(f"call-{pid}-*")]


@pytest.mark.slow
@pytest.mark.anyio
async def test_the_next_session_keeps_it_and_says_so(cli_backend: str, workspace: Path, data_dir: Path) -> None:
    killed = _killed_mid_command(cli_backend, workspace, data_dir)
    backend: BackendChoice = "docker" if cli_backend == "docker" else "bwrap"
    async with Sandbox.open(workspace, backend=backend) as session:
        [notice] = [n for n in session.notices if n["code"] == "changes.recovered"]
        assert _cgroups_of(killed) == []  # the killed run's call cgroups went as the session opened
    assert "sandbox changes show" in notice["message"]
    _assert_kept(notice["changeset_id"], workspace)


def test_a_copy_with_no_baseline_is_not_recovered(tmp_path: Path) -> None:
    copy = tmp_path / "copy-1-1-abc"
    copy.mkdir()
    assert changes.recover(copy) is None
