"""``mount.exclude``, without a jail: what the private copy leaves out, and what a profile may name.

The private copy is edited directly as a jail would (or as a jail could, were its read-only bind
missing): nothing under an excluded path may reach the changeset either way.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import pytest

from sandbox import profile as profiles
from sandbox.backends.bwrap_argv import jail_args
from sandbox.errors import InvalidArgument
from sandbox.mounts import Changeset, CopyTree, untracked_paths

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = pytest.mark.anyio

VENV_BYTES = 64 * 1024


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    (ws / ".venv" / "bin").mkdir(parents=True)
    (ws / ".venv" / "bin" / "python").write_bytes(b"\0" * VENV_BYTES)
    (ws / "web" / "node_modules" / "left-pad").mkdir(parents=True)
    (ws / "web" / "node_modules" / "left-pad" / "index.js").write_text("module.exports = 1\n")
    (ws / "web" / "app.js").write_text("app\n")
    (ws / "README.md").write_text("readme\n")
    (tmp_path / "copies").mkdir()
    return ws


async def copy_of(ws: Path, *exclude: str) -> CopyTree:
    return await CopyTree.prepare(ws, ws.parent / "copies", exclude=exclude)


async def test_an_excluded_directory_is_not_copied_but_left_as_an_empty_mount_point(ws: Path) -> None:
    tree = await copy_of(ws, ".venv", "web/node_modules")
    assert tree.untracked == [".venv", "web/node_modules"]
    assert list((tree.root / ".venv").iterdir()) == []
    assert list((tree.root / "web" / "node_modules").iterdir()) == []
    assert (tree.root / "web" / "app.js").read_text() == "app\n"
    assert (tree.root / "README.md").read_text() == "readme\n"
    assert ".venv/bin/python" not in tree.host


async def test_bytes_copied_leave_the_excluded_bytes_out(ws: Path) -> None:
    whole, lean = await copy_of(ws), await copy_of(ws, ".venv")
    assert whole.bytes_copied - lean.bytes_copied == VENV_BYTES


async def test_a_directory_copied_entry_by_entry_keeps_its_mode_and_times(ws: Path) -> None:
    os.chmod(ws / "web", 0o750)
    os.utime(ws / "web", ns=(1_000_000_000, 1_000_000_000))
    tree = await copy_of(ws, "web/node_modules")
    st = os.stat(tree.root / "web")
    assert (st.st_mode & 0o777, st.st_mtime_ns) == (0o750, 1_000_000_000)


async def test_the_changeset_lists_the_untracked_and_nothing_under_them(ws: Path) -> None:
    tree = await copy_of(ws, ".venv", "web/node_modules")
    (tree.root / ".venv" / "planted").write_text("x\n")
    (tree.root / "web" / "node_modules").rename(tree.root / "web" / "moved")
    (tree.root / "web" / "node_modules").mkdir()
    (tree.root / "README.md").write_text("changed\n")
    changes = await tree.changes()
    assert changes.untracked == [".venv", "web/node_modules"]
    assert sorted(c.path for c in changes.changes) == ["README.md", "web/moved"]


async def test_a_missing_excluded_path_is_skipped(ws: Path) -> None:
    tree = await copy_of(ws, "node_modules", ".venv/nope")
    assert tree.untracked == []
    assert (tree.root / ".venv" / "bin" / "python").exists()
    assert (await tree.changes()).untracked == []


async def test_an_excluded_symlink_is_copied_as_a_link_never_bound(ws: Path, tmp_path: Path) -> None:
    (tmp_path / "elsewhere").mkdir()
    (ws / "node_modules").symlink_to(tmp_path / "elsewhere")
    (ws / "deps").symlink_to("web")
    assert untracked_paths(ws, ["node_modules", "deps/node_modules"]) == []
    tree = await copy_of(ws, "node_modules")
    assert os.readlink(tree.root / "node_modules") == str(tmp_path / "elsewhere")


async def test_an_excluded_file_gets_an_empty_file_as_its_mount_point(ws: Path) -> None:
    tree = await copy_of(ws, "README.md")
    assert tree.untracked == ["README.md"]
    assert (tree.root / "README.md").read_text() == ""


def test_an_entry_inside_another_is_covered_by_it(ws: Path) -> None:
    assert untracked_paths(ws, ["web", "web/node_modules", "web"]) == ["web"]


def test_a_changeset_tracks_everything_unless_told() -> None:
    assert Changeset().untracked == []


# --- the binds ---------------------------------------------------------------------------------


def test_bwrap_binds_the_untracked_read_only_after_the_workspace(tmp_path: Path) -> None:
    ws, copy = tmp_path / "ws", tmp_path / "copy"
    args = jail_args(profiles.Profile(), ws, copy, None, [".venv"])
    at = args.index(str(copy))
    assert args[at - 1 : at + 2] == ["--bind", str(copy), str(ws)]
    assert args[at + 2 : at + 5] == ["--ro-bind", str(ws / ".venv"), str(ws / ".venv")]


def test_the_quick_path_binds_nothing_more(tmp_path: Path) -> None:
    prof = profiles.Profile.model_validate({"mount": {"exclude": [".venv"]}})
    assert "--ro-bind" not in jail_args(prof, tmp_path, tmp_path)[-6:]
    assert str(tmp_path / ".venv") not in jail_args(prof, tmp_path, tmp_path)


async def test_docker_binds_the_untracked_read_only_for_a_copy_only(ws: Path) -> None:
    """The container binds exactly what the copy left out at copy-in (no second look at the host)."""
    pytest.importorskip("docker")
    from sandbox.backends.docker.config import container_config

    prof = profiles.Profile.model_validate({"mount": {"strategy": "copy", "exclude": [".venv", "nope"]}})
    tree = await copy_of(ws, ".venv", "nope")
    mounts = container_config(prof, "j", ws, tree.root, untracked=tree.untracked)["mounts"]
    venv = str(ws / ".venv")
    assert [(m["Target"], m["Source"], m["ReadOnly"]) for m in mounts[1:]] == [(venv, venv, True)]
    rw = prof.with_overrides(**{"mount.strategy": "rw"})
    assert [m["Target"] for m in container_config(rw, "j", ws, ws)["mounts"]] == [str(ws)]


# --- the profile -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("entry", "problem"),
    [
        ("/opt/venv", "absolute"),
        ("../sibling", "'..'"),
        ("a/../../b", "'..'"),
        ("*.egg-info", "not globs"),
        ("build/[ab]", "not globs"),
        ("", "whole workspace"),
        (".", "whole workspace"),
    ],
)
def test_a_bad_entry_is_invalid_argument_naming_the_key(tmp_path: Path, entry: str, problem: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(f'[mount]\nstrategy = "copy"\nexclude = [".venv", "{entry}"]\n')
    with pytest.raises(InvalidArgument) as caught:
        profiles.load_file(path)
    assert "mount.exclude.1" in caught.value.message and problem in caught.value.message
    assert (caught.value.code, caught.value.data["errors"][0]["key"]) == ("INVALID_ARGUMENT", "mount.exclude.1")


def test_entries_are_normalised() -> None:
    prof = profiles.Profile.model_validate({"mount": {"exclude": ["./.venv/", "web//node_modules"]}})
    assert prof.mount.exclude == (".venv", "web/node_modules")


def test_a_mounts_section_is_refused_naming_the_one_there_is(tmp_path: Path) -> None:
    path = tmp_path / "typo.toml"
    path.write_text('[mounts]\nexclude = [".venv"]\n')
    with pytest.raises(InvalidArgument, match="mounts"):
        profiles.load_file(path)


def test_the_shipped_defaults() -> None:
    assert profiles.load("untrusted").mount.exclude == (".venv", "node_modules")
    assert profiles.load("ci").mount.exclude == ()
    assert profiles.load("default").mount.exclude == ()
