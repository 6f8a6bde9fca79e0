"""Attack class: fill what the host shares (issue 31, category 11, "Limits that hold for ordinary users too").

A hostile command floods the jail's writable places: empty files by the thousand on the jail's
``/tmp`` and ``HOME`` (an inode flood costs no bytes, so a size cap alone does not stop it; each
tmpfs inode is kernel memory), and big files in a copy-mode session's tree that the executor
would then keep in its data directory. Each must stop at a bound with a clear error, on both
backends, warm and per call; the run as an ordinary user (``tests/run-as-user.sh``) gives the
user axis.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from sandbox import changes
from sandbox import exec as executor
from sandbox.backends import bwrap_argv
from sandbox.errors import ToolFailed
from sandbox.session import Sandbox
from tests.attack.conftest import mode_profile, skip_unless_mode_available
from tests.conftest import JailFactory, make_profile

if TYPE_CHECKING:
    from pathlib import Path

    from sandbox.backends import base

pytestmark = pytest.mark.anyio

FLOOD = 3000  # files the attack tries to make: far above a 1 MiB tmpfs's cap, far below the kernel's default


def _flood(folder: str) -> str:
    """Empty files in ``folder/flood`` until one fails or FLOOD are made; prints ``folder=<made>``."""
    make = f'while [ $i -lt {FLOOD} ] && true > "f$i"; do i=$((i+1)); done'
    return f'i=0; if mkdir -p "{folder}/flood" && cd "{folder}/flood"; then {make}; fi; echo "{folder}=$i"'


async def test_inode_flood_stops_at_the_tmpfs_cap(backend: base.Backend, open_jail: JailFactory) -> None:
    if backend.name == "bwrap" and not bwrap_argv.inode_cap_available():
        pytest.skip("no inode cap for bwrap's /tmp here: unshare(1) or mount(1) is missing, or user namespaces are off")
    jail = await open_jail(make_profile(**{"limits.tmp_size": "1MiB"}))
    cap = 2**20 // 4096  # one inode per page of the tmpfs's size
    result = await executor.run(jail, ["/bin/sh", "-c", f"{_flood('/tmp')}; {_flood('$HOME')}"])
    made = dict(line.split("=") for line in result.stdout.split())
    assert int(made["/tmp"]) < cap, result.stdout  # the cap counts the directories already there too
    assert sum(int(n) for n in made.values()) < cap  # HOME shares the cap (or has its own, as small)
    assert "No space left on device" in result.stderr
    after = await executor.run(jail, ["/bin/sh", "-c", "rm -rf /tmp/flood; echo ok"])
    assert after.stdout == "ok\n"  # the jail survives its own flood


@pytest.mark.parametrize("kept_mode", ["copy", "overlay"])
async def test_kept_changes_past_the_store_bound_are_refused(
    backend: base.Backend, workspace: Path, kept_mode: str
) -> None:
    skip_unless_mode_available(backend, kept_mode)
    limits = {"limits.kept_changes": "1MiB", "limits.file_size": "8MiB"}
    prof = mode_profile(kept_mode, backend=backend.name, **limits)
    box = await Sandbox.create(workspace, profile=prof, mode="auto")
    try:
        result = await box.call("Bash", {"command": "head -c 4194304 /dev/zero > big.bin; echo done"})
        assert result.ok, result
    finally:
        with pytest.raises(ToolFailed) as refused:  # the close keeps the changes: refused there
            await box.aclose()
    assert refused.value.data["errno"] == "ENOSPC"
    assert refused.value.data["limit"] == 2**20
    assert not [p for p in changes.store().iterdir() if not p.name.startswith(".")]
