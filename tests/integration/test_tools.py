"""The agent tools through a real jail, per backend: the seed's semantics and the attacks on them."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import pytest

from sandbox import profile as profiles
from sandbox.policy.approvals import CallbackApprover
from sandbox.session import Sandbox
from tests.conftest import survivors

if TYPE_CHECKING:
    from sandbox.backends import base

pytestmark = pytest.mark.anyio


def _profile(backend: base.Backend, name: str = "default", **overrides: Any) -> profiles.Profile:
    return profiles.load(name).with_overrides(backend=backend.name, **overrides)


@pytest.fixture
async def session(backend: base.Backend, workspace: Path) -> Any:
    async with Sandbox.open(workspace, profile=_profile(backend), mode="auto") as s:
        yield s


async def test_read_write_edit_roundtrip_with_review(session: Sandbox, workspace: Path) -> None:
    wrote = await session.call("Write", {"path": "notes/todo.txt", "content": "a\nb\nc\n"})
    assert wrote.ok and wrote.root == "workspace", wrote
    assert (workspace / "notes" / "todo.txt").read_text() == "a\nb\nc\n"
    assert wrote.review is not None and wrote.review["status"] == "added" and wrote.review["additions"] == 3
    assert wrote.review["path"] == "notes/todo.txt"  # ADR 0043: relative to the root, whatever the backend
    edited = await session.call("Edit", {"path": "notes/todo.txt", "edits": [{"old_text": "b", "new_text": "B"}]})
    assert edited.ok and edited.review is not None
    assert (edited.review["additions"], edited.review["deletions"]) == (1, 1)
    read = await session.call("Read", {"path": "notes/todo.txt", "offset": 2, "limit": 1})
    assert read.ok and "B" in read.content and "offset=3" in read.content


async def test_read_directory_and_binary(session: Sandbox, workspace: Path) -> None:
    (workspace / "blob.bin").write_bytes(b"\0\1\2" * 100)
    directory = await session.call("Read", {"path": "src"})
    assert (directory.ok, directory.error_code) == (False, "INVALID_ARGUMENT") and "Glob" in directory.content
    assert directory.details["suggestion"] == {"tool": "Glob", "args": {"pattern": "*", "path": "src"}}
    binary = await session.call("Read", {"path": "blob.bin"})
    assert binary.ok and binary.details["binary"] and "\0" not in binary.content


async def test_edit_with_non_unique_match_writes_nothing(session: Sandbox, workspace: Path) -> None:
    (workspace / "dup.txt").write_text("x = 1\nx = 1\n")
    result = await session.call("Edit", {"path": "dup.txt", "edits": [{"old_text": "x = 1", "new_text": "y"}]})
    assert (result.ok, result.error_code) == (False, "TOOL_FAILED")
    assert "Read the file again" in result.content and result.review is None
    assert (workspace / "dup.txt").read_text() == "x = 1\nx = 1\n"


async def test_rollback_restores_and_refuses_after_a_later_change(session: Sandbox, workspace: Path) -> None:
    first = await session.call("Write", {"path": "README.md", "content": "v2\n"})
    assert first.review is not None
    rolled = await session.rollback(first.review["snapshot_id"])
    assert rolled.ok and (workspace / "README.md").read_text() == "# sample\n"
    second = await session.call("Write", {"path": "README.md", "content": "v3\n"})
    assert second.review is not None
    (workspace / "README.md").write_text("the user's own edit\n")
    from sandbox.errors import Conflict

    with pytest.raises(Conflict):
        await session.rollback(second.review["snapshot_id"])
    assert (workspace / "README.md").read_text() == "the user's own edit\n"


async def test_rollback_of_a_created_file_removes_it(session: Sandbox, workspace: Path) -> None:
    made = await session.call("Write", {"path": "new.txt", "content": "x"})
    assert made.review is not None
    await session.rollback(made.review["snapshot_id"])
    assert not (workspace / "new.txt").exists()


async def test_glob_grep_ls(session: Sandbox, workspace: Path) -> None:
    (workspace / "src" / "deep").mkdir()
    (workspace / "src" / "deep" / "mod.py").write_text("def needle():\n    return 1\n")
    globbed = await session.call("Glob", {"pattern": "**/*.py"})
    assert globbed.ok and globbed.content.splitlines() == [
        str(workspace / "src/app.py"),
        str(workspace / "src/deep/mod.py"),
    ]
    grep = await session.call("Grep", {"pattern": "need+le", "include": "*.py", "context": 1})
    assert grep.ok and f"{workspace}/src/deep/mod.py:1:def needle():" in grep.content
    assert f"{workspace}/src/deep/mod.py-2-    return 1" in grep.content
    listing = await session.call("LS", {"path": "src"})
    assert listing.content.splitlines() == ["app.py", "deep/"]


async def test_what_is_too_big_for_the_agent_gives_the_same_replies(session: Sandbox, workspace: Path) -> None:
    """Past the warm agent's bounds (a 1 MiB file, 4000 names, a 64 KiB request) a forked runner serves the call."""
    (workspace / "big.txt").write_text("".join(f"line {n}\n" for n in range(200_000)))  # about 2.2 MiB
    read = await session.call("Read", {"path": "big.txt", "offset": 150_000, "limit": 2})
    assert read.ok and read.content.splitlines()[:2] == ["150000\tline 149999", "150001\tline 150000"], read
    assert read.details["lines"] == 200_000
    edited = await session.call("Edit", {"path": "big.txt", "edits": [{"old_text": "line 7\n", "new_text": "seven\n"}]})
    assert edited.ok and (workspace / "big.txt").read_text().startswith("line 0\nline 1\n"), edited
    assert "\nseven\nline 8\n" in (workspace / "big.txt").read_text()
    (workspace / "many").mkdir()
    for n in range(5000):
        (workspace / "many" / f"f{n:04}").touch()
    listing = await session.call("LS", {"path": "many"})
    assert listing.ok and listing.details["count"] == 5000 and listing.details["truncated"], listing
    content = "".join(f"{n}\n" for n in range(30_000))  # about 170 KiB
    wrote = await session.call("Write", {"path": "large.txt", "content": content})
    assert wrote.ok and (workspace / "large.txt").read_text() == content, wrote
    small = await session.call("Read", {"path": "large.txt", "limit": 1})
    assert small.ok and small.content.startswith("     1\t0"), small


async def test_bash_streams_apart_and_reports_failure(session: Sandbox) -> None:
    out: list[bytes] = []
    err: list[bytes] = []
    result = await session.call(
        "Bash",
        {"command": "echo to-out; echo to-err >&2; echo $SANDBOX_SCRATCH_DIR; exit 4"},
        on_stdout=out.append,
        on_stderr=err.append,
    )
    assert (result.ok, result.error_code, result.details["exit_code"]) == (False, "TOOL_FAILED", 4)
    assert b"".join(out).decode().splitlines() == ["to-out", str(session.scratch)]
    assert b"".join(err) == b"to-err\n"


async def test_scratch_writes_need_no_approval_and_have_no_review(backend: base.Backend, workspace: Path) -> None:
    async with Sandbox.open(workspace, profile=_profile(backend)) as s:  # ask mode, unattended: confirm -> deny
        scratch = await s.call("Write", {"path": str(s.scratch / "tmp.txt"), "content": "x"})
        assert scratch.ok and scratch.root == "scratch" and scratch.review is None
        denied = await s.call("Write", {"path": "a.txt", "content": "x"})
        assert (denied.ok, denied.error_code) == (False, "TOOL_DENIED")
        assert not (workspace / "a.txt").exists()


async def test_planted_symlink_outside_is_external_for_every_file_tool(
    backend: base.Backend, workspace: Path, tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("s3cret needle\n")
    (workspace / "escape").symlink_to(outside)
    asked: list[str] = []

    async def deny(request: Any) -> str:
        asked.append(f"{request.tool}:{request.resource}")
        return "deny"

    async with Sandbox.open(
        workspace, profile=_profile(backend), mode="accept-edits", approver=CallbackApprover(deny)
    ) as s:
        calls: list[tuple[str, dict[str, Any]]] = [
            ("Read", {"path": "escape/secret.txt"}),
            ("Write", {"path": "escape/new.txt", "content": "x"}),
            ("Edit", {"path": "escape/secret.txt", "edits": [{"old_text": "s3cret", "new_text": "x"}]}),
            ("Grep", {"pattern": "needle", "path": "escape"}),
        ]
        for name, args in calls:
            result = await s.call(name, args)
            assert (result.ok, result.error_code) == (False, "TOOL_DENIED"), (name, result)
    # Reads are asked about; writes outside could not persist, so they are refused unasked (seed 003 §4a).
    assert [a.split(":")[0] for a in asked] == ["Read", "Grep"] and all(str(outside) in a for a in asked)
    assert sorted(p.name for p in outside.iterdir()) == ["secret.txt"]
    assert (outside / "secret.txt").read_text() == "s3cret needle\n"


async def test_file_tools_cannot_write_where_bash_cannot(backend: base.Backend, workspace: Path) -> None:
    async with Sandbox.open(workspace, profile=_profile(backend, "readonly"), mode="auto") as s:
        bash = await s.call("Bash", {"command": "echo x > README.md"})
        write = await s.call("Write", {"path": "README.md", "content": "x"})
        system = await s.call("Write", {"path": "/usr/evil.txt", "content": "x"})
    assert not bash.ok and not write.ok and not system.ok
    assert (workspace / "README.md").read_text() == "# sample\n" and not Path("/usr/evil.txt").exists()


async def test_copy_mount_tools_see_the_private_copy(backend: base.Backend, workspace: Path) -> None:
    async with Sandbox.open(workspace, profile=_profile(backend, "untrusted", requires=()), mode="auto") as s:
        wrote = await s.call("Write", {"path": "README.md", "content": "in the copy\n"})
        seen = await s.call("Bash", {"command": "cat README.md"})
        changes = await s.jail.changes()
    assert wrote.ok and seen.details["stdout"] == "in the copy\n"
    assert (workspace / "README.md").read_text() == "# sample\n"
    assert changes is not None and [c.path for c in changes.changes] == ["README.md"]


async def test_parallel_reads_run_during_a_serialised_write(session: Sandbox, workspace: Path) -> None:
    big = "line\n" * 200_000
    order: list[str] = []

    async def write() -> None:
        await session.call("Write", {"path": "big.txt", "content": big})
        order.append("write")

    async def read() -> None:
        result = await session.call("Read", {"path": "README.md"})
        assert result.ok
        order.append("read")

    async with anyio.create_task_group() as tg:
        tg.start_soon(write)
        tg.start_soon(write)
        for _ in range(4):
            tg.start_soon(read)
    assert order.count("write") == 2 and order.count("read") == 4
    assert (workspace / "big.txt").read_text() == big


async def test_cancellation_mid_bash_kills_what_it_started(session: Sandbox, marker: str) -> None:
    abort = anyio.Event()

    async def fire() -> None:
        deadline = time.monotonic() + 20
        while not survivors(marker) and time.monotonic() < deadline:
            await anyio.sleep(0.05)
        abort.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(fire)
        result = await session.call("Bash", {"command": f"setsid sleep {marker} & sleep {marker}"}, abort=abort)
    assert (result.ok, result.error_code) == (False, "ABORTED")
    assert survivors(marker) == []
    with anyio.move_on_after(1):
        await session.call("Bash", {"command": f"sleep {marker}"})
    assert survivors(marker) == []


async def test_unknown_tool_and_bad_arguments_run_nothing(session: Sandbox, workspace: Path) -> None:
    unknown = await session.call("rm_everything", {"path": "/"})
    bad = await session.call("Write", {"path": "x.txt", "content": 5, "mode": "0777"})
    assert (unknown.error_code, bad.error_code) == ("TOOL_DENIED", "INVALID_ARGUMENT")
    assert not (workspace / "x.txt").exists()
    rows = session.audit.rows()
    assert [r["error_code"] for r in rows[-2:]] == ["TOOL_DENIED", "INVALID_ARGUMENT"]


async def test_audit_never_stores_secrets(session: Sandbox) -> None:
    await session.call("Bash", {"command": "export GITHUB_TOKEN=ghp_abcdefghijklmnopqrstuvwxyz0123456789; true"})
    assert "ghp_abcdefghijklmnop" not in repr(session.audit.rows())


async def test_scratch_removed_with_the_session(backend: base.Backend, workspace: Path) -> None:
    async with Sandbox.open(workspace, profile=_profile(backend), mode="auto") as s:
        await s.call("Write", {"path": str(s.scratch / "x"), "content": "x"})
        scratch = s.scratch
        assert scratch.exists()
    assert not scratch.exists()


def test_old_orphan_scratch_dirs_are_swept(data_dir: Path) -> None:
    from sandbox.session import sweep_scratch

    old, fresh = data_dir / "scratch" / "old", data_dir / "scratch" / "fresh"
    for path in (old, fresh):
        path.mkdir(parents=True)
    os.utime(old, (time.time() - 8 * 86400,) * 2)
    assert sweep_scratch() == ["old"]
    assert fresh.exists() and not old.exists()


async def test_session_that_cannot_open_leaves_nothing_behind(
    backend: base.Backend, workspace: Path, data_dir: Path
) -> None:
    (data_dir / "audit").write_text("not a directory")  # the audit log cannot be opened
    from sandbox.errors import SandboxError

    with pytest.raises(SandboxError):
        async with Sandbox.open(workspace, profile=_profile(backend, "untrusted", requires=()), mode="auto"):
            pass
    assert list((data_dir / "scratch").iterdir()) == []
    assert not (data_dir / "copies").exists() or list((data_dir / "copies").iterdir()) == []


async def test_an_approved_external_read_names_its_canonical_path(backend: base.Backend, workspace: Path) -> None:
    """Seed 003 §4a: a file read outside the roots names the canonical absolute path it was read at
    (every link on the way resolved: the model's ``via/os-release`` is ``/etc/os-release``, itself a
    link to ``/usr/lib/os-release``), so the user and the model see where it really came from."""
    (workspace / "via").symlink_to("/etc")
    canonical = os.path.realpath("/etc/os-release")
    asked: list[str] = []

    async def allow(request: Any) -> str:
        asked.append(request.resource)
        return "allow-once"

    async with Sandbox.open(
        workspace, profile=_profile(backend), mode="accept-edits", approver=CallbackApprover(allow)
    ) as s:
        read = await s.call("Read", {"path": "via/os-release"})
    assert asked and canonical in asked[0], asked
    assert read.ok and read.root == "external" and read.details["path"] == canonical, read
    assert "ID=" in read.content


async def test_a_bash_results_credentials_are_redacted_before_it_is_returned(
    backend: base.Backend, workspace: Path
) -> None:
    """Seed 003 §8: sensitive information is redacted before the result is kept or shown; only what
    is unmistakably a credential, so hashes and ordinary text stay as printed."""
    token = "ghp_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8"
    (workspace / "creds.txt").write_text(f"GITHUB_TOKEN={token}\nurl=https://bot:hunter2@git.example.com/r.git\n")
    digest = "0123456789abcdef0123456789abcdef01234567"
    key = "-----BEGIN PRIVATE KEY-----\\nMIIEv\\n-----END PRIVATE KEY-----\\n"
    command = f"cat creds.txt; echo {digest}; printf -- '{key}' >&2"
    async with Sandbox.open(workspace, profile=_profile(backend), mode="auto") as s:
        shown = await s.call("Bash", {"command": command})
    assert shown.ok, shown
    for text in (shown.content, shown.details["stdout"], shown.details["stderr"]):
        assert token not in text and "hunter2" not in text and "MIIEv" not in text
    assert "https://bot:[REDACTED]@git.example.com" in shown.details["stdout"] and digest in shown.details["stdout"]
    assert "[REDACTED PRIVATE KEY]" in shown.details["stderr"] and shown.details["redacted"] == 3
    opted_out = _profile(backend).with_overrides(**{"policy.redact_output": False})
    async with Sandbox.open(workspace, profile=opted_out, mode="auto") as s:
        raw = await s.call("Bash", {"command": "cat creds.txt"})
    assert token in raw.details["stdout"] and "redacted" not in raw.details
