"""``sandbox snapshot list|show|diff|discard`` through the installed console script, on snapshots a
real bubblewrap session of a ``copy`` mount took (``Sandbox.snapshot``)."""

from __future__ import annotations

import hashlib
import json
import re
from typing import TYPE_CHECKING, Any

import pytest

from sandbox import snapshots
from sandbox.mounts import CopyTree
from sandbox.session import Sandbox
from tests.conftest import backend_or_skip
from tests.integration._cli import sandbox

if TYPE_CHECKING:
    import subprocess
    from pathlib import Path

pytestmark = [pytest.mark.anyio, pytest.mark.bwrap]
UNKNOWN = "snap-0123456789abcdef"
HOSTILE = "evil\x1b]0;owned\x07\x1b[2J.txt"  # a name that would retitle and clear a terminal


async def two_snapshots(workspace: Path) -> tuple[str, str]:
    """A session that edits, snapshots, edits more and snapshots again: the two ids."""
    backend_or_skip("bwrap")
    async with Sandbox.open(workspace, backend="bwrap", mount="copy", mode="auto") as s:
        done = await s.call("Bash", {"command": "echo one > src/app.py && rm README.md && mkdir -p new"})
        assert done.ok, done
        first = await s.snapshot()
        done = await s.call("Bash", {"command": "echo two > src/app.py && echo n > new/n.txt && ln -s n.txt new/l"})
        assert done.ok, done
        second = await s.snapshot()
    assert (workspace / "README.md").exists() and not (workspace / "new").exists()  # the host is untouched
    return first, second


def ok(*args: str) -> subprocess.CompletedProcess[str]:
    done = sandbox("snapshot", *args, text=True)
    assert done.returncode == 0, (done.stdout, done.stderr)
    return done


def as_json(*args: str) -> Any:
    done = ok(*args, "--json")
    lines = done.stdout.splitlines()
    assert len(lines) == 1, done.stdout  # one JSON object
    return json.loads(lines[0])


def sha(data: bytes) -> str:
    return f"file sha256:{hashlib.sha256(data).hexdigest()}"


async def test_list_show_diff_and_discard(workspace: Path, tmp_path: Path) -> None:
    first, second = await two_snapshots(workspace)

    listed = as_json("list", "--workspace", str(workspace))["snapshots"]
    assert [s["id"] for s in listed] == [first, second]
    one, two = listed
    assert (one["kind"], one["backend"], one["mount"], one["parent"]) == ("scan", "bwrap", "copy", None)
    assert two["parent"] == first and two["lineage"] == one["lineage"] and one["settings"]["mode"] == "auto"
    assert (one["changed"], one["deleted"], two["changed"], two["deleted"]) == (1, 1, 3, 1)
    assert one["bytes"] == len(b"one\n") and "delta" not in one
    assert [s["id"] for s in as_json("list")["snapshots"]] == [first, second]
    assert as_json("list", "--workspace", str(tmp_path / "elsewhere"))["snapshots"] == []
    text = ok("list", "--workspace", str(workspace)).stdout.splitlines()
    assert [line.split()[0] for line in text] == [first, second]
    assert "scan" in text[0] and "bwrap/copy" in text[0] and str(workspace.resolve()) in text[0]
    assert "1 changed, 1 deleted" in text[0] and "3 changed, 1 deleted" in text[1]

    shown = as_json("show", second)
    assert shown["id"] == second and shown["changed"] == 3 and shown["workspace"] == str(workspace.resolve())
    assert shown["paths"] == {"present": ["new/l", "new/n.txt", "src/app.py"], "deleted": ["README.md"], "replaced": []}
    page = ok("show", second).stdout.splitlines()
    assert page[0].startswith(second) and f"parent {first}" in page[1] and "mode auto" in page[2]
    assert re.search(r"^deleted\s+README\.md$", "\n".join(page), re.M)
    assert [line.split()[-1] for line in page if line.startswith("written")] == ["new/l", "new/n.txt", "src/app.py"]

    differences = as_json("diff", first, second)
    assert differences == {
        "a": first,
        "b": second,
        "paths": [
            {"path": "new/l", "a": "host", "b": "symlink -> n.txt"},
            {"path": "new/n.txt", "a": "host", "b": sha(b"n\n")},
            {"path": "src/app.py", "a": sha(b"one\n"), "b": sha(b"two\n")},
        ],
    }
    lines = ok("diff", first, second).stdout.splitlines()
    n, one_, two_ = sha(b"n\n"), sha(b"one\n"), sha(b"two\n")
    assert lines == ["new/l  host -> symlink -> n.txt", f"new/n.txt  host -> {n}", f"src/app.py  {one_} -> {two_}"]
    same = ok("diff", first, first)
    assert same.stdout == "" and "show the same files" in same.stderr

    gone = ok("discard", first)
    assert gone.stdout == "" and f"discarded {first}" in gone.stderr
    assert as_json("discard", second) == {"discarded": [second]}
    assert as_json("list", "--workspace", str(workspace)) == {"snapshots": []}
    refused = sandbox("snapshot", "show", first, "--json", text=True)
    assert refused.returncode == 2 and json.loads(refused.stdout)["error"]["code"] == "INVALID_ARGUMENT"


async def test_a_name_the_jail_chose_is_printed_escaped(workspace: Path) -> None:
    tree = await CopyTree.prepare(workspace)  # the private copy a jail writes, written here directly
    (tree.root / HOSTILE).write_text("x")
    (tree.root / "src" / "app.py").unlink()
    snap = snapshots.take(
        tree,
        None,
        lineage="s-x",
        session_id="s-x",
        backend="bwrap",
        mount="copy",
        parent=None,
        settings={},
        caps=(32, 1 << 30),
    )
    tree.remove()
    page = ok("show", snap.id).stdout
    assert "\x1b" not in page and "\x07" not in page and "evil\\x1b]0;owned\\x07\\x1b[2J.txt" in page
    assert re.search(r"^deleted\s+src/app\.py$", page, re.M)
    assert as_json("show", snap.id)["paths"]["present"] == [HOSTILE]  # raw: data, escaped by JSON
    assert "\x1b" not in ok("list").stdout


@pytest.mark.parametrize("template", [["show", "ID"], ["discard", "ID"], ["diff", "ID", UNKNOWN]])
@pytest.mark.parametrize("snapshot_id", [UNKNOWN, "../etc"])
def test_an_unknown_id_is_a_structured_refusal(template: list[str], snapshot_id: str) -> None:
    what = "no snapshot" if snapshot_id == UNKNOWN else "not a snapshot id"
    command = [snapshot_id if word == "ID" else word for word in template]
    plain = sandbox("snapshot", *command, text=True)
    assert (plain.returncode, plain.stdout) == (2, "")
    assert plain.stderr.startswith("sandbox: INVALID_ARGUMENT: ") and what in plain.stderr
    assert len(plain.stderr.splitlines()) == 1
    structured = sandbox("snapshot", *command, "--json", text=True)
    assert structured.returncode == 2
    error = json.loads(structured.stdout)["error"]
    assert error["code"] == "INVALID_ARGUMENT" and what in error["message"]
    assert error["data"] == {"snapshot_id": snapshot_id}


def test_bad_usage_is_refused_with_the_usage_status() -> None:
    done = sandbox("snapshot", "diff", UNKNOWN, text=True)
    assert done.returncode == 2 and "snapshot diff: the following arguments are required: B" in done.stderr
    done = sandbox("snapshot", text=True)
    assert done.returncode == 2 and done.stderr.startswith("sandbox: snapshot: ")
