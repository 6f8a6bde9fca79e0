"""``mount.exclude`` in real jails (bubblewrap and a real dockerd): bound read-only, never copied.

The ``untrusted`` profile excludes ``.venv`` and ``node_modules``. The jail must see the host's
``.venv`` at its own path and run what is in it, must fail to change it however it tries, and
the private copy must leave its bytes out. Each attack's outcome is checked on the host.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from sandbox import compare
from sandbox import exec as executor
from sandbox.mounts import overlay_support
from tests.conftest import JailFactory, backend_or_skip, make_profile

if TYPE_CHECKING:
    from sandbox.backends import base

pytestmark = pytest.mark.anyio

VENV_BYTES = 512 * 1024
ATTACKS = (
    "echo evil > .venv/marker",
    "touch .venv/planted",
    "rm -f .venv/marker",
    "rm -rf .venv",
    "mv .venv gone",
    "chmod 777 .venv/marker",
    "ln -s /etc/passwd .venv/link",
    "mkdir .venv/bin/sub",
)
REFUSALS = ("Read-only file system", "Permission denied", "Device or resource busy", "Operation not permitted")


async def sh(jail: base.Jail, script: str) -> executor.ExecResult:
    return await executor.run(jail, ["/bin/sh", "-c", script])


@pytest.fixture
def venv(workspace: Path, backend: base.Backend) -> Path:
    """A ``.venv`` with a marker, a tool the jail can run and a large blob, owned like the workspace."""
    root = workspace / ".venv"
    (root / "bin").mkdir(parents=True)
    (root / "marker").write_text("host venv\n")
    (root / "bin" / "tool").write_text("#!/bin/sh\necho tool ran\n")
    (root / "bin" / "tool").chmod(0o755)
    (root / "blob").write_bytes(b"v" * (VENV_BYTES - 24))
    owner = workspace.stat()
    for path in (root, *root.rglob("*")):
        os.chown(path, owner.st_uid, owner.st_gid, follow_symlinks=False)
    assert backend.name in ("bwrap", "docker")
    return root


@pytest.mark.usefixtures("venv")
async def test_the_jail_uses_the_excluded_venv_at_its_own_path(open_jail: JailFactory, workspace: Path) -> None:
    jail = await open_jail(make_profile("untrusted"))
    assert jail.tree is not None and jail.tree.untracked == [".venv"]
    result = await sh(jail, f"cat {workspace}/.venv/marker && .venv/bin/tool && wc -c < .venv/blob")
    assert result.exit_code == 0, result.stderr
    assert result.stdout.split("\n")[:2] == ["host venv", "tool ran"]
    assert int(result.stdout.split("\n")[2]) == VENV_BYTES - 24


@pytest.mark.parametrize("attack", ATTACKS)
async def test_a_write_into_the_excluded_venv_fails(
    open_jail: JailFactory, workspace: Path, venv: Path, attack: str
) -> None:
    before = sorted(p.name for p in venv.rglob("*"))
    jail = await open_jail(make_profile("untrusted"))
    result = await sh(jail, attack)
    assert result.exit_code != 0, result.stdout
    assert any(why in result.stderr for why in REFUSALS), result.stderr
    assert (venv / "marker").read_text() == "host venv\n"
    assert (venv / "marker").stat().st_mode & 0o777 == 0o644
    assert sorted(p.name for p in venv.rglob("*")) == before
    assert not (workspace / "gone").exists()
    changes = await jail.changes()
    assert changes is not None
    assert changes.untracked == [".venv"]
    assert [c.path for c in changes.changes if c.path.startswith(".venv")] == []


async def test_the_copy_leaves_the_excluded_bytes_out(open_jail: JailFactory, venv: Path) -> None:
    whole = await open_jail(make_profile("untrusted", **{"mount.exclude": []}))
    lean = await open_jail(make_profile("untrusted"))
    assert whole.tree is not None and lean.tree is not None
    venv_bytes = sum(p.stat().st_size for p in venv.rglob("*") if p.is_file())
    assert venv_bytes >= VENV_BYTES
    assert whole.tree.bytes_copied - lean.tree.bytes_copied == venv_bytes
    assert (await whole.changes()).untracked == []


@pytest.mark.bwrap
@pytest.mark.usefixtures("venv")
@pytest.mark.parametrize("backend", ["bwrap"], indirect=True)
async def test_an_overlay_binds_the_excluded_read_only_too(open_jail: JailFactory, workspace: Path) -> None:
    backend_or_skip("bwrap")
    if why := overlay_support():
        pytest.skip(f"no overlay here: {why}")
    jail = await open_jail(make_profile("untrusted", **{"mount.strategy": "overlay"}))
    result = await sh(jail, "cat .venv/marker; echo new > kept.txt; touch .venv/planted")
    assert result.stdout == "host venv\n"
    assert "Read-only file system" in result.stderr
    assert not (workspace / ".venv" / "planted").exists()
    changes = await jail.changes()
    assert changes is not None
    assert (changes.untracked, [c.path for c in changes.changes]) == ([".venv"], ["kept.txt"])


@pytest.mark.bwrap
@pytest.mark.usefixtures("venv")
@pytest.mark.parametrize("backend", ["bwrap"], indirect=True)
async def test_compare_reports_the_setup_saved(workspace: Path, venv: Path, tmp_path: Path) -> None:
    profile = tmp_path / "lean.toml"
    profile.write_text('[mount]\nstrategy = "copy"\nexclude = [".venv"]\n')
    plan = compare.make_plan(["true"], workspace, backends="bwrap", mounts="copy,rw", repeat=1, profile=str(profile))
    report = await compare.compare(plan)
    cells = {cell.mount: cell.summary() for cell in report.cells}
    venv_bytes = sum(p.stat().st_size for p in venv.rglob("*") if p.is_file())
    assert (cells["copy"]["bytes_untracked"], cells["rw"]["bytes_untracked"]) == (venv_bytes, None)
    assert cells["copy"]["bytes_copied"] < venv_bytes
    assert "KiB bound)" in compare.table(report)


@pytest.mark.usefixtures("venv")
def test_sandbox_run_says_what_it_did_not_track(workspace: Path, backend: base.Backend, tmp_path: Path) -> None:
    """``sandbox run`` names the excluded paths on stderr and in ``--json``, changes or none."""
    profile = tmp_path / "excluding.toml"
    profile.write_text(
        f'backend = "{backend.name}"\nrequires = []\n\n[mount]\nstrategy = "copy"\nexclude = [".venv"]\n'
    )
    sandbox = str(Path(sys.executable).with_name("sandbox"))
    argv = [sandbox, "run", "--profile", str(profile), "--workspace", str(workspace)]
    done = subprocess.run([*argv, "--", "true"], capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done
    assert "not tracked (bound read-only from the host, mount.exclude): .venv" in done.stderr
    done = subprocess.run([*argv, "--json", "--", "true"], capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done
    assert json.loads(done.stdout)["untracked"] == [".venv"]
