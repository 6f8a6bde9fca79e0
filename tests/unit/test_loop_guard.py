"""The mutation loop guard (seed 003 §4d): the second failed Edit of one path in a turn, or the
second failed shell patch command, ends the repair loop. The result says so in its text and
carries ``terminate`` with ``mutationFailureKind`` and ``mutationFailureAttempt`` in its details.

Over the fake backend (the runner's replies scripted), over ``sandbox serve``, and once over
bubblewrap, where the runner really fails to match.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from sandbox.backends.fake import Call, FakeBackend, Script
from sandbox.session import Sandbox
from sandbox.session.repair import is_patch_command
from tests.conftest import backend_or_skip
from tests.unit import fake_support

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path

    from sandbox.tools.run import ToolResult

pytestmark = pytest.mark.anyio

EDIT = {"edits": [{"old_text": "not in the file", "new_text": "x"}]}
PATCH_FAILS = Script.output(stderr=b"error: patch failed: README.md:1\n", exit_code=1)
GUARD_KEYS = ("mutationFailureKind", "mutationFailureAttempt", "terminate")


def failing_runner(call: Call) -> Script:
    """Every file tool fails as Edit does when its old_text is not in the file."""
    path = call.request().get("path")
    return Script.reply(
        {"ok": False, "error_code": "TOOL_FAILED", "content": f"edit 1: old_text was not found in {path}"}
    )


@pytest.fixture
async def session(fake: FakeBackend, workspace: Path) -> AsyncIterator[Sandbox]:
    fake.handler = failing_runner
    fake.scripts.update({"git apply fix.diff": PATCH_FAILS, "patch -p1 -i fix.diff": PATCH_FAILS})
    fake.scripts["git apply good.diff"] = Script.output()
    async with Sandbox.open(workspace, profile="default", backend="fake", mode="auto") as s:
        yield s


def guard(result: ToolResult) -> tuple[Any, ...]:
    return tuple(result.details.get(key) for key in GUARD_KEYS)


async def test_the_second_failed_edit_of_a_path_in_a_turn_terminates(session: Sandbox) -> None:
    first = await session.call("Edit", {"path": "README.md", **EDIT}, turn_id="t1")
    other = await session.call("Edit", {"path": "src/app.py", **EDIT}, turn_id="t1")
    second = await session.call("Edit", {"path": "./src/../README.md", **EDIT}, turn_id="t1")  # the same file
    assert [guard(r) for r in (first, other, second)] == [("edit", 1, False), ("edit", 1, False), ("edit", 2, True)]
    assert "[a failed Edit of" in first.content and "[stop:" not in first.content
    assert (second.ok, second.error_code) == (False, "TOOL_FAILED")
    assert second.content.startswith("edit 1: old_text was not found")
    assert (
        "[stop: the Edit of" in second.content
        and "failed again in this turn (failure 2)" in second.content
        and "Do not retry it" in second.content
    )
    assert "Read the file again" in second.content and "ask the user" in second.content
    third = await session.call("Edit", {"path": "README.md", **EDIT}, turn_id="t1")
    assert guard(third) == ("edit", 3, True)  # a model that goes on is stopped again
    # The audit keeps the guard's fields with each call's row (null where the guard counted nothing).
    audited = [
        (row["mutation_failure_kind"], row["mutation_failure_attempt"], row["terminate"])
        for row in session.audit.rows()
        if row["tool"] == "Edit"
    ]
    assert audited == [("edit", 1, False), ("edit", 1, False), ("edit", 2, True), ("edit", 3, True)]
    read = await session.call("Read", {"path": "README.md"}, turn_id="t1")
    assert not read.ok and session.audit.rows()[-1]["terminate"] is None


async def test_a_new_turn_and_an_ended_turn_start_afresh(session: Sandbox) -> None:
    await session.call("Edit", {"path": "README.md", **EDIT}, turn_id="t1")
    in_t2 = await session.call("Edit", {"path": "README.md", **EDIT}, turn_id="t2")
    again_in_t2 = await session.call("Edit", {"path": "README.md", **EDIT}, turn_id="t2")
    session.end_turn("t2")
    after_end = await session.call("Edit", {"path": "README.md", **EDIT}, turn_id="t2")
    assert [guard(r) for r in (in_t2, again_in_t2, after_end)] == [
        ("edit", 1, False),
        ("edit", 2, True),
        ("edit", 1, False),
    ]


async def test_failed_patch_commands_count_together(session: Sandbox) -> None:
    first = await session.call("Bash", {"command": "git apply fix.diff"}, turn_id="t1")
    second = await session.call("Bash", {"command": "patch -p1 -i fix.diff"}, turn_id="t1")
    assert [guard(r) for r in (first, second)] == [("patch", 1, False), ("patch", 2, True)]
    assert second.content.startswith("[stderr]\nerror: patch failed")
    assert "[stop: a patch command (apply_patch, git apply or patch) failed again" in second.content
    assert "hand-edit" in second.content and second.details["exit_code"] == 1


async def test_refusals_successes_and_other_failures_do_not_count(session: Sandbox) -> None:
    calls: list[tuple[str, dict[str, Any]]] = [
        ("Edit", {"path": "/etc/hosts", **EDIT}),  # refused before it ran: no failed edit
        ("Bash", {"command": "false"}),  # a failure, but no patch
        ("Bash", {"command": "git apply good.diff"}),  # a patch that applied
        ("Bash", {"command": "rm -rf / && git apply fix.diff"}),  # refused by the policy
    ]
    for _ in range(2):
        for tool, args in calls:
            result = await session.call(tool, args, turn_id="t1")
            assert guard(result) == (None, None, None), (tool, args, result)
    first_real = await session.call("Bash", {"command": "git apply fix.diff"}, turn_id="t1")
    assert guard(first_real) == ("patch", 1, False)


async def test_the_guard_reaches_the_client_over_serve(workspace: Path) -> None:
    async with fake_support.serve() as client:
        opened = await client.call("session.open", {"workspace": str(workspace), "backend": "fake", "mode": "auto"})
        sid = opened["result"]["session_id"]
        # The served fake's toy shell knows no git: exit 127, a failed patch command all the same.
        call = {"session_id": sid, "tool": "Bash", "turn_id": "t1", "args": {"command": "git apply fix.diff"}}
        replies = [(await client.call("tool.call", {**call, "tool_call_id": f"c{n}"}))["result"] for n in (1, 2)]
    assert [tuple(r["details"].get(k) for k in GUARD_KEYS) for r in replies] == [
        ("patch", 1, False),
        ("patch", 2, True),
    ]
    assert "[stop:" in replies[1]["content"] and replies[1]["error_code"] == "TOOL_FAILED"


@pytest.mark.parametrize(
    ("command", "patches"),
    [
        ("git apply fix.diff", True),
        ("git apply --check fix.diff", True),
        ("cd sub && git -C repo -c core.whitespace=nowarn apply -p1 x.patch", True),
        ("git diff | git apply -R", True),
        ("patch -p1 < fix.diff", True),
        ("sudo patch -p0 -i fix.diff", True),
        ("env LC_ALL=C /usr/bin/patch -p1 -i x", True),
        ("(cd a; git apply x)", True),
        ("cat x.diff | patch -p1", True),
        ("apply_patch <<'EOF'\n*** Begin Patch\n*** Update File: a.py\n-x\n+y\n*** End Patch\nEOF", True),
        ("cd sub && apply_patch <<'EOF'\n*** Begin Patch\n*** End Patch\nEOF", True),
        ("echo patch", False),
        ("git diff > fix.patch", False),
        ("git am fix.patch", False),
        ("git applypatch", False),
        ("cat fix.patch", False),
        ("python apply_patch.py", False),
        ("cat <<'EOF'\npatch -p1\nEOF", False),  # the word is in the here-document's body, not run
    ],
)
def test_patch_commands_are_recognised(command: str, patches: bool) -> None:
    assert is_patch_command(command) is patches


@pytest.mark.bwrap
async def test_over_bubblewrap_a_real_mismatch_terminates_and_bash_knows_the_scratch_dir(workspace: Path) -> None:
    backend_or_skip("bwrap")
    async with Sandbox.open(workspace, profile="default", backend="bwrap", mode="auto") as s:
        results = [await s.call("Edit", {"path": "README.md", **EDIT}, turn_id="t1") for _ in range(2)]
        env = await s.call("Bash", {"command": 'echo "$PI_SCRATCH_DIR|$SANDBOX_SCRATCH_DIR"'})
    assert [guard(r) for r in results] == [("edit", 1, False), ("edit", 2, True)]
    assert "old_text was not found" in results[1].content and "[stop:" in results[1].content
    assert (workspace / "README.md").read_text() == "# sample\n"
    assert (env.ok, env.content) == (True, f"{s.scratch}|{s.scratch}")
