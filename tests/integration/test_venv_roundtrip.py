"""A venv made in a copy jail survives the round trip (issue 32, item 2), on bwrap and Docker.

Jail 1 runs plain ``python3 -m venv --without-pip .venv`` (links, not ``--copies``: the image may
lack ensurepip); the run keeps its changeset; ``sandbox changes apply ID --only .venv`` applies
the directory's content (its interpreter link carried as a ``system-link``); then
``.venv/bin/python`` runs in jail 2 and on the host.
"""

from __future__ import annotations

import re
import subprocess
from typing import TYPE_CHECKING

from sandbox.cli import main as cli_main

if TYPE_CHECKING:
    from pathlib import Path

    import pytest

    from sandbox.backends import base

PREFIX = "import sys; print(sys.prefix)"


def _run(backend: base.Backend, workspace: Path, *command: str) -> list[str]:
    return ["run", "--backend", backend.name, "--workspace", str(workspace), "--mount", "copy", "--", *command]


def test_a_venv_made_in_a_jail_runs_in_the_next_jail_and_on_the_host(
    backend: base.Backend, workspace: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    assert cli_main(_run(backend, workspace, "python3", "-m", "venv", "--without-pip", ".venv")) == 0
    err = capfd.readouterr().err
    found = re.search(r"changes kept as (ch-[0-9a-f]{12})", err)
    assert found is not None, err
    assert "system-link" in err and "never applied" not in err, err

    assert cli_main(["changes", "apply", found[1], "--only", ".venv"]) == 0
    applied = capfd.readouterr().out.splitlines()
    assert "applied .venv/bin/python3" in applied and "applied .venv/pyvenv.cfg" in applied, applied

    host = subprocess.run(
        [str(workspace / ".venv/bin/python"), "-c", PREFIX], capture_output=True, text=True, check=True
    )
    assert host.stdout.strip() == str(workspace / ".venv")

    assert cli_main(_run(backend, workspace, ".venv/bin/python", "-c", PREFIX)) == 0
    assert capfd.readouterr().out.strip().endswith("/.venv")
