"""Attack class: reach around the seal through what is bound into the jail, or through time (issue 31,
categories 3 and 5).

Category 3, "What is bound into a jail is resolved and sealed like the workspace": a plugin
declaration whose directory is a symlink leading out of the folder that declared it is refused; a
plugin directory's secrets (``.env``, ``id_rsa``, ``*.pem``) are masked as the workspace's are; a
declaration the project ships (a manifest inside the workspace, as pi's ``.pi/sandbox-plugins/``)
never shows the jail a directory outside the workspace unless the project is trusted and the user
granted the plugin.

Category 5, "Secrets that appear during a session are masked too": a secret created on the host
after the jail opened, and one an earlier call wrote, are unreadable by the next call, warm and per
call, in every mount mode (the jail's seal is searched again before each call; a warm jail whose
masks changed is replaced).

Every test runs on bubblewrap and Docker, warm and per call; the ordinary-user run gives the user axis.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import pytest

from sandbox import exec as executor
from sandbox import plugins
from sandbox.errors import InvalidArgument
from sandbox.session import Sandbox
from tests.attack.conftest import mode_profile
from tests.conftest import JailFactory, own_like_a_checkout

if TYPE_CHECKING:
    from pathlib import Path

    from sandbox import profile as profiles
    from sandbox.backends import base

pytestmark = pytest.mark.anyio

SECRET = "hunter2-bound"
PUBLIC = "nothing-to-hide"


def _manifest(directory: Path, plugin_id: str = "kit") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    tool = {"name": "look", "risk": "low", "command": ["cat", "${PLUGIN_DIR}/notes.json"]}
    manifest = directory / "plugin.json"
    manifest.write_text(json.dumps({"id": plugin_id, "tools": [tool]}))
    (directory / "notes.json").write_text(json.dumps(PUBLIC))
    return manifest


def _secrets(directory: Path) -> None:
    (directory / ".env").write_text(f"API_KEY={SECRET}\n")
    (directory / "keys").mkdir(exist_ok=True)
    (directory / "keys" / "id_rsa").write_text(f"{SECRET}-rsa\n")
    (directory / "server.pem").write_text(f"{SECRET}-pem\n")


async def _bash(jail: base.Jail, script: str) -> str:
    result = await executor.run(jail, ["bash", "-c", script], timeout=60)
    return result.stdout + result.stderr


async def _shown(
    workspace: Path, profile: profiles.Profile, manifest: Path, granted: list[str], trusted: bool | None
) -> str:
    """What a session declaring ``manifest`` shows at the plugin's jail directory."""
    async with Sandbox.open(
        workspace, profile=profile, plugins=[manifest], granted_plugins=granted, trust_project=trusted, mode="auto"
    ) as box:
        return await _bash(box.jail, "cat /run/sandbox/plugins/kit/notes.json")


# ------------------------------------------------------------------------------ category 3


@pytest.mark.parametrize("how", ["directory", "manifest", "workspace"])
async def test_a_plugin_dir_that_is_a_symlink_out_of_its_folder_is_refused(
    backend: base.Backend, workspace: Path, tmp_path: Path, how: str
) -> None:
    """``folder/kit -> elsewhere`` (a plugin directory), ``folder/kit.json -> elsewhere/plugin.json``,
    or the project's ``.pi/sandbox-plugins/kit -> ../..``: the whole workspace, unmasked, at the plugin's path."""
    elsewhere = tmp_path / "elsewhere"
    _manifest(elsewhere)
    folder = tmp_path / "plugins"
    folder.mkdir()
    if how == "directory":
        (folder / "kit").symlink_to(elsewhere, target_is_directory=True)
        declared = folder / "kit" / "plugin.json"
    elif how == "manifest":
        (folder / "kit.json").symlink_to(elsewhere / "plugin.json")
        declared = folder / "kit.json"
    else:
        _manifest(workspace)
        _secrets(workspace)
        (workspace / ".pi" / "sandbox-plugins").mkdir(parents=True)
        (workspace / ".pi" / "sandbox-plugins" / "kit").symlink_to("../..", target_is_directory=True)
        declared = workspace / ".pi" / "sandbox-plugins" / "kit" / "plugin.json"
    profile = mode_profile("ro", backend=backend.name)
    with pytest.raises(InvalidArgument, match="symlink"):
        async with Sandbox.open(workspace, profile=profile, plugins=[declared], granted_plugins=["kit"]):
            pass


async def test_a_plugin_dirs_secrets_are_masked(
    backend: base.Backend, workspace: Path, tmp_path: Path, mode: str
) -> None:
    manifest = _manifest(tmp_path / "plugins" / "kit")
    _secrets(manifest.parent)
    own_like_a_checkout(manifest.parent, backend.name)
    plugin = plugins.Plugin.load(manifest)
    jail = await backend.open_jail(workspace, mode_profile(mode), shared=plugins.jail_binds([plugin]))
    async with jail:
        script = "cat .env keys/id_rsa server.pem; cat ./keys/../.env; cat notes.json; echo; echo end"
        seen = await _bash(jail, f"cd {plugin.jail_dir}; {script}")
        (manifest.parent / "keys" / "late.pem").write_text(f"{SECRET}-late\n")  # on the host, mid-session
        seen += await _bash(jail, f"cat {plugin.jail_dir}/keys/late.pem; echo late")
    assert SECRET not in seen, seen
    assert f'"{PUBLIC}"\nend' in seen and "late" in seen, seen  # the plugin's own files stay readable


async def test_a_project_declared_plugin_outside_the_workspace_needs_trust_and_a_grant(
    backend: base.Backend, workspace: Path, tmp_path: Path
) -> None:
    """The project's ``.pi/sandbox-plugins`` is a symlink to a directory outside the workspace."""
    outside = tmp_path / "outside"
    _manifest(outside / "kit")
    (outside / "kit" / "notes.json").write_text(json.dumps(f"{SECRET}-outside"))
    (workspace / ".pi").mkdir()
    (workspace / ".pi" / "sandbox-plugins").symlink_to(outside, target_is_directory=True)
    own_like_a_checkout(outside, backend.name)
    declared = workspace / ".pi" / "sandbox-plugins" / "kit" / "plugin.json"
    profile = mode_profile("ro", backend=backend.name)
    for trusted, granted in ((None, ["kit"]), (True, [])):
        with pytest.raises(InvalidArgument, match="trust"):
            await _shown(workspace, profile, declared, granted, trusted)
    # Both given: the user's choice, bound and callable.
    async with Sandbox.open(
        workspace, profile=profile, plugins=[declared], granted_plugins=["kit"], trust_project=True, mode="auto"
    ) as box:
        result = await box.call("plugin_kit_look", {})
    assert SECRET in result.content, result


async def test_a_project_declared_plugin_inside_the_workspace_is_sealed(
    backend: base.Backend, workspace: Path, mode: str
) -> None:
    """A manifest the project ships whose directory is the workspace's own: its secrets stay masked."""
    manifest = _manifest(workspace / ".pi" / "sandbox-plugins" / "kit")
    _secrets(manifest.parent)
    own_like_a_checkout(workspace, backend.name)
    profile = mode_profile(mode, backend=backend.name)
    async with Sandbox.open(workspace, profile=profile, plugins=[manifest], mode="auto") as box:
        seen = await _bash(box.jail, "cd /run/sandbox/plugins/kit && cat .env keys/id_rsa; echo end")
    assert SECRET not in seen and "end" in seen, seen


# ------------------------------------------------------------------------------ category 5


async def test_a_secret_created_on_the_host_mid_session_is_masked(
    backend: base.Backend, open_jail: JailFactory, workspace: Path, mode: str
) -> None:
    jail = await open_jail(mode_profile(mode))
    assert "before" in await _bash(jail, "cat .env 2>/dev/null; echo before")  # the jail is up (and warm)
    (workspace / ".env").write_text(f"API_KEY={SECRET}\n")
    (workspace / "src" / "id_rsa").write_text(f"{SECRET}-rsa\n")
    own_like_a_checkout(workspace, backend.name)
    seen = await _bash(jail, "cat .env src/id_rsa; echo after")
    assert SECRET not in seen and "after" in seen, seen


@pytest.mark.usefixtures("backend")
async def test_a_secret_written_by_an_earlier_call_is_masked(
    open_jail: JailFactory, workspace: Path, writable_mode: str
) -> None:
    jail = await open_jail(mode_profile(writable_mode))
    wrote = await _bash(
        jail, f"echo API_KEY={SECRET} > .env && mkdir -p keys && echo {SECRET}-rsa > keys/id_rsa && echo wrote"
    )
    assert "wrote" in wrote, wrote
    seen = await _bash(jail, "cat .env keys/id_rsa ./keys/../.env; echo after")
    assert SECRET not in seen and "after" in seen, seen
    # Masked, not lost: in rw the host keeps the file the command wrote.
    if writable_mode == "rw":
        assert SECRET in (workspace / ".env").read_text()
