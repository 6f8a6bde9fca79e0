"""What a jail leaves for review is judged and shown as data (issue 31, categories 7, 8 and 9).

* **Private state (7).** After a ``copy`` session (a Bash call, a Write, a review), nothing the
  executor made under its data directory or in the temporary directory is wider than ``0700`` (a
  directory) or reachable by another user (a socket: ``0600`` or in a ``0700`` directory). The
  exception, named in :func:`wide_entries`: the entries of a private tree (a copy, an overlay, a
  kept changeset's ``tree``) keep the workspace's own modes, because they are what an apply
  writes back; the tree's root is ``0700`` and is what keeps them private.
* **Links judged by where they lead (8).** The jail makes links that stay inside lexically but
  leave when followed: through a link of its own (``d/up -> ..``), through a host link that was
  there before (``vendor -> /etc``) or that the host made during the session, and loops. Each is
  flagged ``symlink-outside``, never applied (even with every flag consented); honest links are not.
* **Names are data (9).** The jail names files ``a\\nM  fake.py``, ``\\x1b[2J…`` and
  ``x\\u202etxt.exe`` and writes an escape sequence into a file: ``sandbox changes show`` (text and
  ``--json``), ``sandbox run``'s summary, JSON-RPC ``changes.show`` and the MCP review tools show
  one line per change, no raw control character, no forged line.
"""

from __future__ import annotations

import json
import os
import stat
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import anyio
import pytest

from sandbox import changes
from sandbox.cli import main as cli_main
from sandbox.session import Sandbox
from tests.attack.conftest import mode_profile

if TYPE_CHECKING:
    from sandbox.backends import base
    from sandbox.mounts import Changeset

pytestmark = pytest.mark.anyio

# -- 7: private state ----------------------------------------------------------------------------

PRIVATE_TREE_PARENTS = ("copies", "changes")  # copy-*/overlay-* trees; ch-*/tree of a kept changeset


def _is_private_tree(path: Path, data: Path) -> bool:
    rel = path.relative_to(data).parts
    if len(rel) == 2 and rel[0] == "copies":
        return rel[1].startswith(("copy-", "overlay-"))
    return len(rel) == 3 and rel[0] == "changes" and rel[2] == "tree"


def wide_entries(root: Path, data: Path) -> list[str]:
    """Directories wider than 0700 and sockets wider than 0600 in a directory wider than 0700.

    A private tree's root is checked and not entered: its entries mirror the workspace's modes.
    """
    found = []
    for dirpath, dirs, files in os.walk(root):
        here = Path(dirpath)
        dir_mode = stat.S_IMODE(here.lstat().st_mode)
        if dir_mode & 0o077:
            found.append(f"{here} {oct(dir_mode)}")
        if here != data and here.is_relative_to(data) and _is_private_tree(here, data):
            dirs.clear()
            continue
        for name in files:
            st = (here / name).lstat()
            if stat.S_ISSOCK(st.st_mode) and stat.S_IMODE(st.st_mode) & 0o077 and dir_mode & 0o077:
                found.append(f"{here / name} socket {oct(stat.S_IMODE(st.st_mode))}")
    return found


def _our_temp_dirs() -> set[Path]:
    temp = Path(tempfile.gettempdir())
    return {p for p in temp.glob("sbx-*") if p.lstat().st_uid == os.geteuid()}


async def test_what_the_executor_creates_is_private(backend: base.Backend, workspace: Path, data_dir: Path) -> None:
    old_umask = os.umask(0o022)  # an ordinary umask: modes must not depend on a strict one
    before = _our_temp_dirs()
    box = await Sandbox.create(workspace, profile=mode_profile("copy", backend=backend.name), mode="auto")
    try:
        ran = await box.call("Bash", {"command": "mkdir -p new/deep && echo x > new/deep/f && echo y >> README.md"})
        assert ran.ok, ran
        wrote = await box.call("Write", {"path": "w.txt", "content": "w\n"})
        assert wrote.ok, wrote
        assert (await box.changes()).changes
        during = wide_entries(data_dir, data_dir)
        made = _our_temp_dirs() - before
        if box.jail.egress is None:  # another worker's proxy (they share /tmp): this session has none
            made = {d for d in made if not d.name.startswith("sbx-net-")}
        during += [e for d in made for e in wide_entries(d, data_dir)]
    finally:
        await box.aclose()
        os.umask(old_umask)
    assert box.changeset_id is not None  # a kept changeset is part of what we check
    assert during == [], "\n".join(during)
    assert wide_entries(data_dir, data_dir) == []


def test_an_existing_wider_data_dir_is_narrowed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from sandbox import datadir

    wide = tmp_path / "wide"
    wide.mkdir(mode=0o755)
    (wide / "copies").mkdir(mode=0o777)
    (wide / "copies").chmod(0o777)
    monkeypatch.setenv("SANDBOX_DATA_DIR", str(wide))
    assert datadir.subdir("copies") == wide / "copies"
    assert stat.S_IMODE(wide.stat().st_mode) == 0o700
    assert stat.S_IMODE((wide / "copies").stat().st_mode) == 0o700


@pytest.mark.docker
def test_the_docker_agent_socket_is_private() -> None:
    from sandbox.backends.docker.links import Listener

    listener = Listener((os.geteuid(), os.getegid()))
    try:
        assert stat.S_IMODE(listener.folder.stat().st_mode) == 0o700
        assert stat.S_IMODE(listener.path.stat().st_mode) == 0o600
    finally:
        listener.close()


# -- 8: links judged by where they lead --------------------------------------------------------

LEAVING = ("x", "cfg", "late", "l1", "l2", "l3")
HONEST = ("ok", "src/up", "d/up")


async def _kept_after(box: Sandbox, command: str) -> Changeset:
    ran = await box.call("Bash", {"command": command})
    assert ran.ok, ran
    return await box.changes()


async def test_links_that_leave_when_followed_are_flagged_and_never_applied(
    backend: base.Backend, workspace: Path, tmp_path: Path, private_mode: str
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "passwd").write_text("host secret\n")
    (workspace / "vendor").symlink_to(outside)  # a host link that was there before the session
    box = await Sandbox.create(workspace, profile=mode_profile(private_mode, backend=backend.name), mode="auto")
    try:
        (workspace / "hostmade").symlink_to(outside)  # the host makes one during the session
        command = (
            "mkdir d && ln -s .. d/up && ln -s d/up/../outside/passwd x"  # lexically ws/d/outside/passwd
            " && ln -s vendor/passwd cfg && ln -s hostmade/passwd late"
            " && ln -s l2 l1 && ln -s l1 l2 && ln -s l1/x l3"  # a loop: undecidable
            " && ln -s src/app.py ok && ln -s ../README.md src/up"
        )
        changeset = await _kept_after(box, command)
        flags = {c.path: c.flags for c in changeset.changes}
        for name in LEAVING:
            assert "symlink-outside" in flags[name], (name, flags)
        for name in HONEST:
            assert "symlink-outside" not in flags[name], (name, flags)
        tree = box.jail.tree
        assert tree is not None
        report = await tree.apply(changeset, include_flagged=True)
    finally:
        await box.aclose()
    for name in LEAVING:
        assert not os.path.lexists(workspace / name), name
    assert {"ok", "src/up"} <= set(report.applied)


# -- 9: names are data --------------------------------------------------------------------------

HOSTILE = ("a\nM  fake.py", "\x1b[2Jcleared", "x\u202etxt.exe")
SHOWN = ("a\\nM  fake.py", "\\x1b[2Jcleared", "x\\u202etxt.exe")
MAKE_HOSTILE = (
    "printf 1 > \"$(printf 'a\\nM  fake.py')\"; printf 2 > \"$(printf '\\033[2Jcleared')\";"
    " printf 3 > \"$(printf 'x\\342\\200\\256txt.exe')\"; printf 'ok\\033[31m\\rred\\n' >> src/app.py"
)


def assert_safe(text: str) -> None:
    """No raw control or bidi character survives except line ends; no forged line; each name shown escaped."""
    assert not {c for c in text if not c.isprintable() and c not in "\n\t"}, repr(text)
    assert not any(line.startswith("M  fake.py") for line in text.splitlines()), text
    for shown in SHOWN:
        assert shown in text, (shown, text)


async def _hostile_session(backend: base.Backend, workspace: Path, mode: str = "copy") -> str:
    box = await Sandbox.create(workspace, profile=mode_profile(mode, backend=backend.name), mode="auto")
    try:
        changeset = await _kept_after(box, MAKE_HOSTILE)
        assert {c.path for c in changeset.changes} >= set(HOSTILE)  # the raw names are the data
    finally:
        await box.aclose()
    assert box.changeset_id is not None
    return box.changeset_id


def test_hostile_names_cannot_forge_review_lines_in_the_cli(
    backend: base.Backend, workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cid = anyio.run(_hostile_session, backend, workspace)  # sync: `changes apply` runs its own loop
    capsys.readouterr()
    assert cli_main(["changes", "show", cid]) == 0
    text = capsys.readouterr().out
    assert_safe(text)
    entry_lines = [line for line in text.splitlines() if line.startswith(("added ", "modified "))]
    assert len(entry_lines) == 4, text  # one line per change: three names and src/app.py
    assert cli_main(["changes", "show", cid, "--json"]) == 0
    raw = capsys.readouterr().out
    assert not {c for c in raw if not c.isprintable() and c != "\n"}, repr(raw)
    shown = json.loads(raw)
    assert {c["path"] for c in shown["changes"]} >= set(HOSTILE)  # JSON keeps the raw name
    assert_safe(shown["diff"])
    assert cli_main(["changes", "apply", cid]) == 0
    assert_safe(capsys.readouterr().out)


def test_hostile_names_cannot_forge_the_run_summary(
    backend: base.Backend, workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["run", "--backend", backend.name, "--workspace", str(workspace), "--mount", "copy", "--apply"]
    cli_main([*argv, "--", "/bin/sh", "-c", MAKE_HOSTILE])
    text = capsys.readouterr().err
    assert_safe(text)
    change_lines = [line for line in text.splitlines() if line.startswith(("  A ", "  M "))]
    assert len(change_lines) == 4, text


async def test_hostile_names_cannot_forge_review_lines_over_json_rpc_and_mcp(
    backend: base.Backend, workspace: Path, private_mode: str
) -> None:
    from sandbox.mcp import review
    from sandbox.server import Server
    from sandbox.server_messages import ChangesShowParams

    cid = await _hostile_session(backend, workspace, private_mode)
    shown = await Server(cast("Any", None)).changes_show(ChangesShowParams(changeset_id=cid))
    assert_safe(shown["diff"] + "\n".join(shown["git_lines"]))
    box = await Sandbox.create(workspace, profile=mode_profile(private_mode, backend=backend.name), mode="auto")
    try:
        await _kept_after(box, MAKE_HOSTILE)
        call = review.ReviewCall(box, cast("Any", None), cast("Any", None), "SandboxChanges", {})
        assert_safe((await review._changes(call)).content)
        call.args = {"changeset_id": cid}
        assert_safe((await review._show(call)).content)
    finally:
        await box.aclose()
    assert changes.load(cid).id == cid
