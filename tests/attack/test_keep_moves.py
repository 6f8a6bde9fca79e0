"""A keep that moves the private copy's files into the store (``sandbox run``: ``giving_up``), attacked.

Moving instead of copying is only sound when nothing can reach the moved file afterwards. A file
with a second link in the copy (which a survivor, or a later call, could write through) is copied,
not moved; what is moved becomes ours and private (``0600``), and its kept content is what the
changeset read. Each case on every backend x lifecycle (the attack suite's matrix).
"""

from __future__ import annotations

import os
import stat
from typing import TYPE_CHECKING

import pytest

from sandbox import changes
from sandbox import exec as executor
from tests.attack.conftest import mode_profile

if TYPE_CHECKING:
    from sandbox.backends import base
    from tests.conftest import JailFactory

pytestmark = pytest.mark.anyio


async def _kept(jail: base.Jail, script: str) -> changes.Kept:
    result = await executor.run(jail, ["sh", "-c", script])
    assert result.exit_code == 0, result.stderr
    changeset = await jail.changes()
    assert changeset is not None and jail.tree is not None
    return await changes.keep(jail.tree, changeset, source="run", profile="test", backend=jail.backend, giving_up=True)


async def test_a_file_with_a_second_link_is_copied_and_a_write_through_it_changes_nothing_kept(
    open_jail: JailFactory,
) -> None:
    jail = await open_jail(mode_profile("copy"))
    kept = await _kept(jail, "echo one > src/linked && ln src/linked src/other-name && echo solo > src/alone")
    assert jail.tree is not None
    (jail.tree.root / "src" / "other-name").write_text("rewritten through the other link\n")
    assert (kept.path / "tree" / "src" / "linked").read_text() == "one\n"
    assert not (jail.tree.root / "src" / "alone").exists()  # a file of one link was moved, not copied
    await kept.apply(include_flagged=True)  # a hard link is flagged: held back unless included
    assert (jail.workspace / "src" / "linked").read_text() == "one\n"
    assert (jail.workspace / "src" / "alone").read_text() == "solo\n"


async def test_a_moved_file_is_ours_and_private_in_the_store(open_jail: JailFactory) -> None:
    jail = await open_jail(mode_profile("copy"))
    kept = await _kept(jail, "echo secret > src/shared && chmod 0777 src/shared")
    st = os.stat(kept.path / "tree" / "src" / "shared")
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (os.geteuid(), 0o600)
    [entry] = [e for e in kept.changeset.changes if e.path == "src/shared"]
    assert entry.mode_after is not None and stat.S_IMODE(entry.mode_after) == 0o777  # applied as the jail left it
