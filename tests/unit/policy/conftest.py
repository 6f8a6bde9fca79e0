"""A real directory tree with real symlinks, a private HOME and data directory per test."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import pytest

from sandbox.policy import paths
from sandbox.policy.gate import SessionState
from tests.unit.policy.policy_world import World

if TYPE_CHECKING:
    from pathlib import Path


def _touch(path: Path, text: str = "x") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> World:
    home, data = tmp_path / "home", tmp_path / "data"
    ws, app2, outside = tmp_path / "work" / "app", tmp_path / "work" / "app2", tmp_path / "outside"
    scratch = data / "scratch" / "s1"
    for directory in (home / ".ssh", home / ".aws", ws / "src", ws / ".git" / "hooks", app2, outside, scratch):
        directory.mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("SANDBOX_DATA_DIR", str(data))
    # The jail's private /tmp, as Bash's writes see it: the world's own, so that {outside} (under the
    # host's /tmp like every pytest directory) stays outside every writable root.
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(paths, "TMP_ROOTS", (str(tmp_path / "tmp"),))
    for path in (
        ws / "src" / "main.py",
        ws / "README.md",
        ws / ".env",
        ws / ".env.example",
        ws / "deploy.pem",
        ws / ".git" / "config",
        app2 / "secret.txt",
        outside / "notes.txt",
        home / ".ssh" / "id_rsa",
        home / ".bashrc",
        home / ".aws" / "credentials",
    ):
        _touch(path)
    os.symlink(outside, ws / "link_out")
    os.symlink(outside / "notes.txt", ws / "notes_link.txt")
    os.symlink(outside / "new.txt", ws / "dangling.txt")
    os.symlink(ws / "src", ws / "src_link")
    os.symlink(home / ".ssh" / "id_rsa", ws / "key_link")
    os.symlink(scratch.parent, scratch / "escape")
    os.symlink("/", ws / "root_link")  # deleting the link is not deleting the root
    os.symlink(home, ws / "home_link")
    return World(tmp_path, home, ws, app2, outside, scratch, data)


@pytest.fixture
def state() -> SessionState:
    return SessionState("s1")
