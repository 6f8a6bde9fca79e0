"""Sizing and removing a tree a jail wrote (``datadir.opened_up_bytes``, ``datadir.remove_tree``).

The jail may close directories (mode ``000``) to hide what they hold from the count a cap is kept
by, or plant links for the host to follow while it opens things up; as an ordinary user (the
``tests/run-as-user.sh`` run) a closed directory is really closed to the host too.
"""

from __future__ import annotations

import os
import stat
from typing import TYPE_CHECKING

from sandbox import datadir

if TYPE_CHECKING:
    from pathlib import Path


def _planted(tmp_path: Path) -> tuple[Path, Path]:
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "big").write_bytes(b"v" * 5000)
    os.chmod(victim, 0o500)
    tree = tmp_path / "tree"
    (tree / "closed" / "deeper").mkdir(parents=True)
    (tree / "closed" / "deeper" / "f").write_bytes(b"x" * 1000)
    (tree / "open").write_bytes(b"y" * 24)
    (tree / "closed" / "link").symlink_to(victim)
    (tree / "closed" / "filelink").symlink_to(victim / "big")
    os.chmod(tree / "closed" / "deeper", 0)
    os.chmod(tree / "closed", 0)
    return tree, victim


def test_a_closed_directory_is_counted_and_no_link_is_followed(tmp_path: Path) -> None:
    tree, victim = _planted(tmp_path)
    link = len(str(victim / "big"))  # a link counts as itself (its target's name), not what it names
    assert datadir.opened_up_bytes(tree) == 1000 + 24 + link
    assert stat.S_IMODE(os.stat(victim).st_mode) == 0o500


def test_a_closed_tree_is_removed_and_what_its_links_name_stays(tmp_path: Path) -> None:
    tree, victim = _planted(tmp_path)
    datadir.remove_tree(tree)
    assert not os.path.lexists(tree)
    assert (victim / "big").read_bytes() == b"v" * 5000
    assert stat.S_IMODE(os.stat(victim).st_mode) == 0o500
