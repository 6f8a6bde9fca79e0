"""The per-project download cache (``mount.download_cache``), attacked on every backend (issue 32, item 3).

Off, nothing a run writes outside the workspace outlives it and no cache is shown. On, what one
run of a workspace leaves in ``/sandbox-downloads`` the next run of that workspace finds, and only
that workspace's jails: not another workspace's, never the host's own caches, never in the
workspace's changeset. What a jail plants there (links to host files, directories it closed) is
removed by the host without following or opening up anything outside, and the disk guard
watches the cache like every directory a jail writes on the host.
"""

from __future__ import annotations

import os
import stat
from typing import TYPE_CHECKING

import pytest

from sandbox import downloads
from sandbox import exec as executor
from sandbox.backends import base
from sandbox.errors import InvalidArgument
from tests.attack.conftest import mode_profile
from tests.conftest import make_profile, own_like_a_checkout

if TYPE_CHECKING:
    from pathlib import Path

    from sandbox import profile as profiles
    from tests.conftest import JailFactory

pytestmark = pytest.mark.anyio
WRITE = 'mkdir -p "$PIP_CACHE_DIR" && echo fetched > "$PIP_CACHE_DIR/wheel"'
LOOK = 'cat "${PIP_CACHE_DIR:-/nowhere}/wheel" 2>/dev/null || echo none'


def _profile(mode: str, cache: str = "project") -> profiles.Profile:
    return mode_profile(mode, **{"mount.download_cache": cache})


async def _sh(open_jail: JailFactory, prof: profiles.Profile, script: str, ws: Path | None = None) -> str:
    jail = await open_jail(prof, ws)
    try:
        result = await executor.run(jail, ["sh", "-c", script])
    finally:
        await jail.aclose()
    assert result.exit_code == 0, result.stderr
    return result.stdout.strip()


async def test_off_nothing_is_shown_and_nothing_persists(open_jail: JailFactory, mode: str, data_dir: Path) -> None:
    prof = _profile(mode, "off")
    shown = await _sh(open_jail, prof, f'echo "[$PIP_CACHE_DIR]"; test -e {downloads.JAIL_DIR} && echo shown || :')
    assert shown == "[]"
    assert not (data_dir / "downloads").exists()


async def test_a_later_run_of_the_workspace_finds_its_downloads_and_the_changeset_has_none(
    open_jail: JailFactory, workspace: Path, mode: str
) -> None:
    prof = _profile(mode)
    jail = await open_jail(prof)
    try:
        result = await executor.run(jail, ["sh", "-c", WRITE])
        assert result.exit_code == 0, result.stderr
        if jail.tree is not None:  # copy, overlay: the cache is not the workspace, so not its changes
            changeset = await jail.changes()
            assert changeset is None or not changeset.changes, changeset
    finally:
        await jail.aclose()
    assert await _sh(open_jail, prof, LOOK) == "fetched"
    assert sorted(p.name for p in workspace.iterdir()) == ["README.md", "src"]


async def test_another_workspace_never_sees_it(open_jail: JailFactory, tmp_path: Path, backend: base.Backend) -> None:
    prof = _profile("copy")
    await _sh(open_jail, prof, WRITE)
    other = tmp_path / "other"
    other.mkdir()
    own_like_a_checkout(other, backend.name)
    assert await _sh(open_jail, prof, LOOK, other) == "none"


async def test_the_hosts_own_caches_and_the_entry_stamp_are_out_of_reach(
    open_jail: JailFactory, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    for cache in (".cache/pip", ".npm", ".cache/uv"):
        (home / cache).mkdir(parents=True)
        (home / cache / "host-secret").write_text("the host's own cache\n")
    monkeypatch.setenv("HOME", str(home))
    script = f"ls -a {downloads.JAIL_DIR}; find {downloads.JAIL_DIR} / -xdev -name host-secret 2>/dev/null; :"
    names = (await _sh(open_jail, _profile("copy"), script)).splitlines()
    assert "used" not in names  # the entry's stamp sits beside the cache, not in it
    assert not [name for name in names if "host-secret" in name]


async def test_every_installer_is_pointed_at_it(open_jail: JailFactory) -> None:
    script = "; ".join(f'echo "{name}=${name}"' for name in downloads.VARIABLES)
    seen = dict(line.split("=", 1) for line in (await _sh(open_jail, _profile("copy"), script)).splitlines())
    assert seen == {name: f"{downloads.JAIL_DIR}/{sub}" for name, sub in downloads.VARIABLES.items()}


async def test_what_a_jail_plants_is_removed_without_following_or_opening_it(
    open_jail: JailFactory, tmp_path: Path
) -> None:
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep").write_text("the host's\n")
    os.chmod(victim / "keep", 0o600)
    os.chmod(victim, 0o711)
    plant = (
        f'cd "$PIP_CACHE_DIR/.." && mkdir -p pip/closed/deep && echo x > pip/closed/deep/f'
        f" && ln -s {victim} pip/dirlink && ln -s {victim}/keep pip/filelink && ln -s {victim} used"
        " && chmod 000 pip/closed/deep pip/closed && chmod 000 pip"
    )
    await _sh(open_jail, _profile("copy"), plant)
    assert downloads.prune(limit=0)  # every cache goes: the one planted in included
    assert not any(p.is_dir() for p in downloads.root().iterdir())
    assert (victim / "keep").read_text() == "the host's\n"
    assert stat.S_IMODE(os.stat(victim).st_mode) == 0o711  # not opened up through the link
    assert stat.S_IMODE(os.stat(victim / "keep").st_mode) == 0o600


async def test_the_disk_guard_watches_it(open_jail: JailFactory) -> None:
    jail = await open_jail(_profile("copy"))
    assert jail.downloads is not None
    assert jail.downloads in jail.host_writable


async def test_a_backend_that_cannot_bind_it_refuses(workspace: Path) -> None:
    fake = base.get("fake")
    with pytest.raises(InvalidArgument, match="download_cache") as caught:
        await fake.open_jail(workspace, make_profile("default", **{"mount.download_cache": "project"}))
    assert caught.value.data["setting"] == "mount.download_cache"
