"""The CLI's own stdio: non-blocking writes that notice a gone reader, stdin read as it arrives."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import anyio
import pytest

from sandbox.cli import stdio as cli_stdio

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = pytest.mark.anyio


async def _drain(fd: int, into: bytearray) -> None:
    while True:
        await anyio.wait_readable(fd)
        chunk = os.read(fd, 65536)
        if not chunk:
            return
        into += chunk


@pytest.mark.parametrize("polled", [False, True])
async def test_a_full_pipe_waits_in_the_loop_and_loses_nothing(polled: bool) -> None:
    read_end, write_end = os.pipe()
    os.set_blocking(read_end, False)
    got = bytearray()
    sink = cli_stdio.Sink(write_end, lambda: None)
    if polled:  # the path for a pipe we may not reopen (someone else's): PIPE_BUF writes
        assert sink._own is not None
        os.close(sink._own)
        sink._own, sink._poll = None, True
    data = os.urandom(3 * 2**20)
    async with anyio.create_task_group() as tg:
        tg.start_soon(_drain, read_end, got)
        await sink.write(data)
        sink.close()
        os.close(write_end)
    os.close(read_end)
    assert bytes(got) == data


async def test_a_gone_reader_is_reported_once_and_later_writes_are_dropped() -> None:
    read_end, write_end = os.pipe()
    calls: list[int] = []
    sink = cli_stdio.Sink(write_end, lambda: calls.append(1))
    os.close(read_end)
    await sink.write(b"x" * 100)
    await sink.write(b"y")
    sink.close()
    os.close(write_end)
    assert calls == [1] and sink.closed


async def test_stdin_from_a_pipe_and_from_a_file(tmp_path: Path) -> None:
    read_end, write_end = os.pipe()
    os.write(write_end, b"hello")
    os.close(write_end)
    stream = cli_stdio.StdinStream(read_end, pollable=True)
    assert [chunk async for chunk in stream] == [b"hello"]
    os.close(read_end)
    path = tmp_path / "in.txt"
    path.write_bytes(b"file data")
    fd = os.open(path, os.O_RDONLY)
    try:
        source = cli_stdio.stdin_source(fd)
        assert source is not None and not source.pollable
        assert b"".join([chunk async for chunk in source]) == b"file data"
    finally:
        os.close(fd)
