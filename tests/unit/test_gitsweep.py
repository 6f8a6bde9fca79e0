"""The sweep's own rules, on plain directories (the attack on real jails: tests/attack/test_host_git.py)."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from sandbox import gitsweep


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    (tmp_path / "ws" / ".git" / "modules" / "sub" / "refs").mkdir(parents=True)
    (tmp_path / "ws" / ".git" / "modules" / "sub" / "HEAD").write_text("ref: refs/heads/main\n")
    return tmp_path / "ws"


def test_the_git_directories_are_the_repository_and_its_submodules(ws: Path) -> None:
    assert gitsweep.gitdirs(str(ws), ()) == (".git", ".git/modules/sub")


class _Jail:
    """Stands for a jail: the sweep only keys its window on it."""


def test_overlapping_calls_are_swept_by_the_last_to_end(ws: Path) -> None:
    """A call that ends while another runs sweeps nothing: the other may be mid-rebase."""
    jail = _Jail()
    gitsweep.opening(jail, str(ws), ())
    gitsweep.opening(jail, str(ws), ())
    (ws / ".git" / "rebase-merge").mkdir()
    assert gitsweep.closing(jail)[0] == []
    (ws / ".git" / "modules" / "sub" / "commondir").write_text("/elsewhere\n")
    assert sorted(gitsweep.closing(jail)[0]) == [".git/modules/sub/commondir", ".git/rebase-merge"]


def test_an_edit_in_place_of_what_was_there_is_seen(ws: Path) -> None:
    todo = ws / ".git" / "sequencer" / "todo"
    todo.parent.mkdir()
    todo.write_text("pick 1\n")
    before = gitsweep.take(str(ws), (".git",))
    assert gitsweep.planted(before) == []
    with todo.open("r+") as fh:  # same size, same directory times: only the file's own stamp moves
        fh.write("exec x\n"[:7])
    os.utime(todo, ns=(todo.stat().st_atime_ns, todo.stat().st_mtime_ns + 1))
    assert gitsweep.planted(before) == [".git/sequencer"]


def test_across_file_systems_it_is_set_aside_then_copied(
    ws: Path, data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """EXDEV: renamed in place first (git stops obeying it at once), copied without opening a FIFO,
    then removed from the workspace."""
    state = ws / ".git" / "rebase-merge"
    state.mkdir()
    (state / "git-rebase-todo").write_text("exec touch /tmp/x\n")
    os.mkfifo(state / "fifo")
    rename = os.rename

    def cross(src: str, dst: str) -> None:
        if str(dst).startswith(str(data_dir)):
            raise OSError(errno.EXDEV, "Invalid cross-device link")
        rename(src, dst)

    monkeypatch.setattr(os, "rename", cross)
    [moved] = gitsweep.quarantine(str(ws), [".git/rebase-merge"])
    kept = moved["moved_to"]
    assert kept.startswith(str(data_dir / gitsweep.QUARANTINE)) and kept.endswith(".git/rebase-merge")
    assert Path(kept, "git-rebase-todo").read_text() == "exec touch /tmp/x\n"
    assert sorted(os.listdir(ws / ".git")) == ["modules"]


def test_without_a_data_directory_it_is_set_aside_in_place(ws: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gitsweep, "_folder", lambda: None)
    (ws / ".git" / "commondir").write_text("/elsewhere\n")
    [moved] = gitsweep.quarantine(str(ws), [".git/commondir"])
    assert os.path.basename(moved["moved_to"]).startswith("sandbox-quarantined.commondir.")
    assert not (ws / ".git" / "commondir").exists()
    assert "quarantined" in gitsweep.summary([moved])


def test_a_config_is_judged_by_an_allowlist_of_keys() -> None:
    clone = '[core]\n\trepositoryformatversion = 0\n\tbare = false\n[remote "origin"]\n\turl = /x\n\tfetch = +a:b\n'
    keys = gitsweep.config_keys(clone)
    assert keys is not None and keys <= gitsweep.SAFE_CONFIG
    for hostile in (
        "[core]\n\tfsmonitor = touch x\n",
        "[core] pager = x\n",
        "[include]\npath = ../x\n",
        "[alias]\nx = !sh\n",
    ):
        keys = gitsweep.config_keys(hostile)
        assert keys is not None and not keys <= gitsweep.SAFE_CONFIG, hostile
    assert gitsweep.config_keys("[core]\n\tpager = a \\\n b\n") is None  # a continuation: not understood, unsafe
