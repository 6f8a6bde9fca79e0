"""Seed 003 §4d's global mutation slots: one mutation at a time per session, at most N across
sessions, and a mutation queued behind its own session's edit holds no slot while it waits."""

from __future__ import annotations

import hashlib
import time
from typing import TYPE_CHECKING

import anyio
import pytest

from sandbox.backends.fake import Call, Script
from sandbox.session import Sandbox, mutations

if TYPE_CHECKING:
    from pathlib import Path

    from sandbox.backends.fake import FakeBackend

pytestmark = pytest.mark.anyio

WRITE_S = 0.3  # how long each fake Write takes


def slow_writes(log: list[tuple[str, str, float]]) -> object:
    """Every file tool is a Write that takes WRITE_S and logs when it ran, by its file's name."""

    def handler(call: Call) -> Script:
        name = str(call.request().get("path", "")).rsplit("/", 1)[-1]
        log.append(("start", name, time.monotonic()))
        reply = {
            "ok": True,
            "content": f"wrote {name}",
            "details": {
                "existed": False,
                "before": None,
                "after": "x",
                "after_sha256": hashlib.sha256(b"x").hexdigest(),
            },
        }
        return Script((WRITE_S, ("stdout", Script.reply(reply).steps[0][1])), 0)  # type: ignore[index]

    return handler


async def test_two_sessions_share_one_slot_and_a_queued_edit_holds_none(
    fake: FakeBackend, workspace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(mutations.SLOTS_ENV, "1")
    log: list[tuple[str, str, float]] = []
    fake.handler = slow_writes(log)  # type: ignore[assignment]
    other = tmp_path / "other"
    other.mkdir()
    done: list[str] = []
    async with (
        Sandbox.open(workspace, backend="fake", mode="auto") as one,
        Sandbox.open(other, backend="fake", mode="auto") as two,
    ):

        async def write(session: Sandbox, name: str, after: float) -> None:
            await anyio.sleep(after)
            result = await session.call("Write", {"path": name, "content": "x"})
            assert result.ok, result
            done.append(name)

        async with anyio.create_task_group() as tg:
            tg.start_soon(write, one, "a1.txt", 0)  # runs first, holding the one slot
            tg.start_soon(write, one, "a2.txt", 0.05)  # queued behind a1 on its session's permit
            tg.start_soon(write, two, "b1.txt", 0.1)  # queued on the slot while a1 runs
    # One at a time across both sessions (one slot), and b1 before a2: a2 waited for its own
    # session's permit without a slot, so b1, which waited for the slot since a1 ran, came first.
    assert done == ["a1.txt", "b1.txt", "a2.txt"]
    starts = [t for event, _, t in log if event == "start"]
    assert all(later - earlier >= WRITE_S * 0.9 for earlier, later in zip(starts, starts[1:], strict=False))


async def test_without_a_limit_sessions_mutate_at_once(fake: FakeBackend, workspace: Path, tmp_path: Path) -> None:
    log: list[tuple[str, str, float]] = []
    fake.handler = slow_writes(log)  # type: ignore[assignment]
    other = tmp_path / "other"
    other.mkdir()
    peak = 0

    async def watch() -> None:
        nonlocal peak
        while True:
            peak = max(peak, int(mutations.slots().borrowed_tokens))
            await anyio.sleep(0.01)

    async with (
        Sandbox.open(workspace, backend="fake", mode="auto") as one,
        Sandbox.open(other, backend="fake", mode="auto") as two,
        anyio.create_task_group() as outer,
    ):
        outer.start_soon(watch)
        async with anyio.create_task_group() as tg:
            tg.start_soon(one.call, "Write", {"path": "a.txt", "content": "x"})
            tg.start_soon(two.call, "Write", {"path": "b.txt", "content": "x"})
        outer.cancel_scope.cancel()
    assert (mutations.slots().total_tokens, peak) == (mutations.DEFAULT_SLOTS, 2)  # both held a slot at once
