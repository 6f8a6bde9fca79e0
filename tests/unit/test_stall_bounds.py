"""The bounds that keep one session from stalling the server, piece by piece (issue 31, category 4).

``tests/attack/test_server_stall.py`` attacks them through ``sandbox serve``; here each bound is
checked where it lives: the review diff's size and deadline, the JSON readers' depth and size, the
agent link's frame length, the server's line reader and its last-resort error mapping.
"""

from __future__ import annotations

import difflib
import errno
import json
import os
import random
import time
from typing import TYPE_CHECKING

import anyio
import pytest

from sandbox import diffbound, jsonbound, jsonrpc, review
from sandbox._jailside.channel import HEADER as AGENT_HEADER
from sandbox.backends.agentlink import FrameError, Link, _report
from sandbox.backends.child import FdReceiveStream
from sandbox.errors import Conflict
from sandbox.mounts import kept as changes
from sandbox.tools.replies import decode_reply

if TYPE_CHECKING:
    from collections.abc import Sequence

DEEP = "[" * 100_000 + "]" * 100_000


def interleaved(lines: int) -> tuple[list[str], list[str]]:
    """Two files that share every other line: difflib's quadratic case."""
    old = [f"line {n}\n" for n in range(lines)]
    return old, [f"changed {n}\n" if n % 2 else line for n, line in enumerate(old)]


def test_the_bounded_diff_is_difflibs_own_for_ordinary_files() -> None:
    rng = random.Random(31)
    for _ in range(500):
        alphabet = "abcde"[: rng.randint(1, 5)]
        old = [rng.choice(alphabet) + "\n" for _ in range(rng.randint(0, 40))]
        new = [line for line in old if rng.random() < 0.85] + [rng.choice(alphabet) + "\n" for _ in range(3)]
        n = rng.choice([0, 1, 3])
        assert diffbound.unified(old, new, "a", "b", n=n) == list(difflib.unified_diff(old, new, "a", "b", n=n))


def test_the_bounded_diff_gives_up_past_its_size_and_its_deadline() -> None:
    old, new = interleaved(diffbound.MAX_LINES + 10)
    with pytest.raises(diffbound.TooCostly, match="lines differ"):
        diffbound.unified(old, new)
    old, new = interleaved(4_000)
    started = time.monotonic()
    with pytest.raises(diffbound.TooCostly, match="in time") as caught:
        diffbound.unified(old, new, deadline=time.monotonic() + 0.05)
    assert time.monotonic() - started < 5  # one search past the deadline, not difflib's seconds
    assert "diff omitted" in caught.value.summary()


def test_a_large_comparison_runs_in_a_child_and_a_small_one_checks_its_deadline_here() -> None:
    old, new = interleaved(diffbound.IN_PROCESS_LINES + 500)  # the child's difflib: the same diff
    assert diffbound.unified(old, new, deadline=time.monotonic() + 60) == list(difflib.unified_diff(old, new))
    with pytest.raises(diffbound.TooCostly, match="in time"):
        diffbound.unified(*interleaved(1000), deadline=time.monotonic() - 1)


def test_a_shared_head_and_tail_are_left_out_of_a_large_comparison() -> None:
    old = [f"line {n}\n" for n in range(diffbound.MAX_LINES * 2)]
    new = [*old[:1000], "inserted\n", *old[1000:]]
    diff = diffbound.unified(old, new, "a", "b")
    assert diff == list(difflib.unified_diff(old, new, "a", "b"))


def test_a_review_record_past_the_bound_is_a_summary() -> None:
    old, new = interleaved(diffbound.MAX_LINES + 10)
    found = review._diff("".join(old).encode(), "".join(new), existed=True)
    assert found["hunks"] == [] and found["truncated"] is True and "diff omitted" in found["omitted"]
    assert found["deletions"] >= diffbound.MAX_LINES // 2


def test_a_kept_changesets_file_past_the_bound_is_a_summary() -> None:
    old, new = interleaved(diffbound.MAX_LINES + 10)
    before, after = "".join(old).encode(), "".join(new).encode()
    lines = changes.file_diff("big.txt", (len(before), before), (len(after), after), time.monotonic() + 5)
    assert len(lines) == 1 and "diff omitted" in lines[0]


@pytest.mark.parametrize("data", [DEEP, json.dumps({"a": json.loads("[" * 100 + "]" * 100)})])
def test_json_nested_too_deep_is_refused_as_a_value_error(data: str) -> None:
    with pytest.raises(jsonbound.Refused, match="nested deeper"):
        jsonbound.loads(data, max_bytes=1 << 20)


def test_json_over_its_size_is_refused_unread() -> None:
    with pytest.raises(jsonbound.Refused, match="bytes"):
        jsonbound.loads("[1]" + " " * 100, max_bytes=10)
    assert jsonbound.loads('{"a": [[1]]}', max_bytes=100, max_depth=3) == {"a": [[1]]}


def test_a_runner_reply_nested_too_deep_is_no_reply() -> None:
    assert decode_reply(DEEP) is None
    assert decode_reply('{"ok": true, "details": {"hits": [["a", 1, true, "x"]]}}') is not None


class _Recorder(Link):
    stream = "test"

    @property
    def diagnostics(self) -> bytes:
        return b""

    def send(self, message: dict[str, object], fds: Sequence[int] = ()) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass


@pytest.mark.anyio
async def test_an_agent_frame_longer_than_any_ends_the_link() -> None:
    link = _Recorder()
    with pytest.raises(FrameError):
        link._parse(bytearray(AGENT_HEADER.pack(b"o", 1, 1 << 30)))
    assert _report(DEEP.encode()) == {} and _report(b"[1]") == {} and _report(b'{"code": 0}') == {"code": 0}


class _Call:
    def __init__(self) -> None:
        self.lost_told = 0

    def frame(self, kind: bytes, payload: bytes) -> None:
        raise AssertionError(f"no frames here ({kind!r}, {len(payload)} bytes)")

    def lost(self) -> None:
        self.lost_told += 1


@pytest.mark.anyio
async def test_a_call_registered_after_its_link_ended_learns_it_there() -> None:
    """The race behind a call that waited for ever: the agent died between the jail choosing its
    link and the call registering with it. ``ended`` told the calls it had; a later one hears it
    from ``register`` instead."""
    link = _Recorder()
    before = _Call()
    assert link.register(link.next_id(), before)
    await anyio.to_thread.run_sync(link.ended)  # the reader thread's end
    assert before.lost_told == 1
    after = _Call()
    assert not link.register(link.next_id(), after)
    assert after.lost_told == 0  # never told by the link: the call ends itself as lost


@pytest.mark.anyio
async def test_the_line_reader_skips_an_overlong_line_and_reads_on() -> None:
    read, write = os.pipe()
    lines = jsonrpc.Lines(FdReceiveStream(read), 1000, b"first\n")
    async with anyio.create_task_group() as tg:

        async def feed() -> None:
            for data in (b"x" * 600, b"y" * 600, b"z" * 600, b"\nsecond\n"):
                await anyio.wait_writable(write)
                os.write(write, data)
            os.close(write)

        tg.start_soon(feed)
        assert await lines.receive() == b"first"
        assert await lines.receive() is None
        assert await lines.receive() == b"second"
        with pytest.raises(anyio.EndOfStream):
            await lines.receive()
    os.close(read)


def test_running_out_of_a_resource_is_that_requests_structured_error() -> None:
    error = jsonrpc.unexpected(ExceptionGroup("call", [OSError(errno.EMFILE, "Too many open files")]), "tool.call")
    assert error.code == jsonrpc.SANDBOX_ERROR and error.data["data"]["errno"] == "EMFILE"
    assert jsonrpc.unexpected(MemoryError(), "tool.call").data["data"]["errno"] == "ENOMEM"
    ours = jsonrpc.unexpected(ExceptionGroup("call", [Conflict("changed meanwhile")]))
    assert ours.code == jsonrpc.SANDBOX_ERROR and ours.data["code"] == "CONFLICT"
