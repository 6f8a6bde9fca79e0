"""The changeset under fuzzing: random trees through review and apply (issue 31, categories 8 and 9).

A jail leaves its private tree in any shape: links (chains, loops, through host links, absolute),
hard links, FIFOs, names with newlines, escape sequences, bidi overrides, ``..``-looking names and
names of 255 bytes. Whatever it is, :meth:`CopyTree.changes` and an apply with every flag
consented must not crash (a refusal is a :class:`SandboxError`), must write nothing outside the
workspace, and every link they apply must resolve inside it. The renderings of each change are
one printable line.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import anyio
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from sandbox import textsafe
from sandbox.errors import SandboxError
from sandbox.mounts import CopyTree

NAME_BITS = ["a", "b", ".", "..", "-", " ", "\n", "\r", "\x1b[2J", "\u202e", "\\", "é"]
names = st.one_of(
    st.lists(st.sampled_from(NAME_BITS), min_size=1, max_size=4).map("".join),
    st.just("n" * 255),
).filter(lambda n: n not in (".", "..") and len(n.encode()) <= 255)
link_parts = st.sampled_from(["..", ".", "a", "b", "d", "up", "vendor", "hostlink", "outside", "x", ""])
link_targets = st.one_of(
    st.lists(link_parts, min_size=1, max_size=6).map("/".join),
    st.lists(link_parts, min_size=1, max_size=4).map(lambda p: "/" + "/".join(p)),
    st.just("OUTSIDE/secret"),  # replaced by the absolute outside directory
    # Lexically inside, outside when followed: through ``up -> ..`` (made first) or the host's ``vendor``.
    st.sampled_from(["up/outside/secret", "d/../up/outside", "vendor/secret", "a/../vendor", "b/../up/ws/../outside"]),
)
operation = st.one_of(
    st.tuples(st.just("file"), st.sampled_from(["", "d/"]), names),
    st.tuples(st.just("dir"), st.sampled_from(["", "d/"]), names),
    st.tuples(st.just("link"), st.sampled_from(["", "d/"]), st.tuples(names, link_targets)),
    st.tuples(st.just("hardlink"), st.sampled_from(["", "d/"]), names),
    st.tuples(st.just("fifo"), st.sampled_from(["", "d/"]), names),
)


def _perform(root: Path, outside: Path, op: tuple[str, str, object]) -> None:
    kind, where, arg = op
    folder = root / where
    if kind != "link" and os.path.lexists(folder / str(arg)):
        return  # never through a link or into a FIFO: the jail writes in its own tree only
    try:
        if kind == "file":
            (folder / str(arg)).write_bytes(b"data \x1b[31m\n")
        elif kind == "dir":
            (folder / str(arg)).mkdir()
        elif kind == "link":
            assert isinstance(arg, tuple)
            os.symlink(str(arg[1]).replace("OUTSIDE", str(outside)), folder / str(arg[0]))
        elif kind == "hardlink":
            os.link(root / "README.md", folder / str(arg))
        else:
            os.mkfifo(folder / str(arg))
    except OSError:
        pass  # a name taken already, a parent that is a link or a file: the tree stays as it is


def _outside_state(top: Path, skip: set[Path]) -> dict[str, bytes | str]:
    """Everything under ``top`` except the workspace and the copies: names, contents, link targets."""
    state: dict[str, bytes | str] = {}
    for dirpath, dirs, files in os.walk(top):
        dirs[:] = [d for d in dirs if Path(dirpath, d) not in skip]
        for name in files + dirs:
            path = Path(dirpath, name)
            state[str(path)] = os.readlink(path) if path.is_symlink() else path.read_bytes() if path.is_file() else b""
    return state


def _links_inside(workspace: Path, applied: list[str]) -> None:
    real = Path(os.path.realpath(workspace))
    for rel in applied:
        path = workspace / rel
        if path.is_symlink():
            assert Path(os.path.realpath(path)).is_relative_to(real), (rel, os.readlink(path))


async def _review_and_apply(top: Path, ops: list[tuple[str, str, object]]) -> None:
    ws, outside = top / "ws", top / "outside"
    (ws / "d").mkdir(parents=True)
    (ws / "README.md").write_text("readme\n")
    outside.mkdir()
    (outside / "secret").write_text("host secret\n")
    (ws / "vendor").symlink_to(outside)  # a host link that leads out, there before the run
    (top / "copies").mkdir()
    tree = await CopyTree.prepare(ws, top / "copies")
    try:
        os.symlink("..", tree.root / "up")
        for op in ops:
            _perform(tree.root, outside, op)
        before = _outside_state(top, {ws, top / "copies"})
        changeset = await tree.changes()
        for change in changeset.changes:
            line = textsafe.printable(f"{change.status} {change.path} {change.target or ''}")
            assert line.isprintable(), repr(line)
        try:
            report = await tree.apply(changeset, include_flagged=True)
        except SandboxError:
            return  # refused as a whole: fine, as long as nothing escaped (checked by the caller's state)
        finally:
            assert _outside_state(top, {ws, top / "copies"}) == before
        _links_inside(ws, report.applied)
    finally:
        tree.remove()


@settings(
    max_examples=int(os.environ.get("FUZZ_N", "60")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(st.lists(operation, min_size=1, max_size=12))
@example([("link", "", ("a", "vendor/secret"))])  # through the host's link
@example([("link", "", ("x", "up/outside/secret"))])  # through the tree's own ``up -> ..``
@example([("link", "", ("l1", "l2")), ("link", "", ("l2", "l1")), ("link", "d/", ("y", "../l1/x"))])  # a loop
def test_random_trees_through_review_and_apply(ops: list[tuple[str, str, object]]) -> None:
    with tempfile.TemporaryDirectory() as top:
        anyio.run(_review_and_apply, Path(top), ops)


@pytest.mark.anyio
async def test_apply_reads_the_tree_without_following_a_swapped_link(tmp_path: Path) -> None:
    """A warm jail swaps a directory of its tree for a link to a host directory after the review:
    the apply must not copy the host file it now leads to into the workspace."""
    ws, outside = tmp_path / "ws", tmp_path / "outside"
    (ws / "d").mkdir(parents=True)
    (ws / "d" / "x").write_text("a\n")
    outside.mkdir()
    (outside / "x").write_text("host secret\n")
    (tmp_path / "copies").mkdir()
    tree = await CopyTree.prepare(ws, tmp_path / "copies")
    (tree.root / "d" / "x").write_text("b\n")
    changeset = await tree.changes()
    (tree.root / "d" / "x").unlink()
    (tree.root / "d").rmdir()
    (tree.root / "d").symlink_to(outside)
    with pytest.raises(SandboxError):
        await tree.apply(changeset)
    assert (ws / "d" / "x").read_text() == "a\n"
    tree.remove()


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        ("a\nM  fake.py", "a\\nM  fake.py"),
        ("\x1b[2Jcleared", "\\x1b[2Jcleared"),
        ("x\u202etxt.exe", "x\\u202etxt.exe"),
        ("tab\there\r", "tab\\there\\r"),
        ("zero\u200bwidth\u2028line", "zero\\u200bwidth\\u2028line"),
        ("\x7f\x85\udc80", "\\x7f\\x85\\udc80"),
        ("plain/é ok", "plain/é ok"),
    ],
)
def test_printable_escapes_what_a_terminal_would_obey(raw: str, shown: str) -> None:
    assert textsafe.printable(raw) == shown
    assert textsafe.printable_lines([raw]) == [shown.replace("\\t", "\t")]
