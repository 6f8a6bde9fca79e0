"""Bounded capture keeps a head and a tail and counts everything."""

from __future__ import annotations

import os
import time

import anyio
import pytest

from sandbox import calls
from sandbox import exec as executor
from sandbox import profile as profiles
from sandbox.backends.child import FdReceiveStream
from sandbox.errors import InvalidArgument


def test_small_output_kept_whole() -> None:
    cap = executor.Capture(1024)
    for part in (b"hello ", b"world"):
        cap.feed(part)
    assert (cap.text(), cap.total, cap.truncated) == ("hello world", 11, False)


def test_large_output_keeps_head_and_tail() -> None:
    cap = executor.Capture(1024)
    cap.feed(b"H" * 600)
    for _ in range(1000):
        cap.feed(b"m" * 1000)
    cap.feed(b"T" * 100)
    text = cap.text()
    assert cap.truncated and cap.total == 600 + 1_000_000 + 100
    assert text.startswith("H" * 512) and text.endswith("T" * 100)
    assert f"{cap.total} bytes in all" in text
    assert len(text) < 1024 + 100


def test_tail_memory_is_bounded() -> None:
    cap = executor.Capture(4096)
    for _ in range(10_000):
        cap.feed(b"x" * 4096)
    assert cap.tail_size <= 4096 + 2048


def test_one_huge_chunk() -> None:
    cap = executor.Capture(1000)
    cap.feed(b"a" * 10_000 + b"END")
    assert cap.text().endswith("END") and cap.text().startswith("a" * 500)


@pytest.mark.parametrize("bad", [0, 0.5, 3601, -1, True])
def test_timeout_bounds(bad: float) -> None:
    """From 1 s to the profile's own timeouts.max_s (default: an hour), named in the refusal."""
    with pytest.raises(InvalidArgument, match="between 1 and 3600 .*timeouts.max_s"):
        calls.check_timeout(bad, profiles.load("default"))


def test_timeout_default_and_override() -> None:
    prof = profiles.load("default")
    assert calls.check_timeout(None, prof) == 60
    assert calls.check_timeout(1, prof) == 1 and calls.check_timeout(3600, prof) == 3600


class _Endless(FdReceiveStream):
    """/dev/zero: always readable, never at its end; gives up loudly rather than spin forever."""

    def __init__(self) -> None:
        super().__init__(os.open("/dev/zero", os.O_RDONLY))
        self.reads = 0
        self.give_up = time.monotonic() + 10

    def receive_ready(self, max_bytes: int = 1 << 18) -> bytes | None:
        self.reads += 1
        if time.monotonic() > self.give_up:
            raise AssertionError(f"the pump never let the event loop run in {self.reads} reads")
        return super().receive_ready(max_bytes)


def test_a_pipe_that_never_runs_dry_still_lets_a_deadline_in() -> None:
    """The pump reads what is there without awaiting, so it must yield now and then on its own."""

    async def main() -> int:
        stream = _Endless()
        try:
            with anyio.move_on_after(0.05):
                await executor._pump(stream, executor.Capture(1024), None)
            return stream.reads
        finally:
            stream.close()

    assert anyio.run(main) > 0
