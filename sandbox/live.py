"""A call's output as a client sees it live: bounded, coalesced, never in the command's way.

The executor keeps each stream's capture (head and tail, byte counts) whatever this does. What a
client is *sent* while the call runs is a separate, smaller thing: :class:`LiveOutput` takes the
chunks as they arrive (:meth:`LiveOutput.feed`, which never waits), keeps at most the profile's
budget (``limits.live_stream_bytes`` per stream, ``limits.live_total_bytes`` for both), and a task
of its own sends what arrived in the last :data:`INTERVAL_S`, up to :data:`CHUNK` bytes per
message. Past the budget nothing more is kept; one notice says so (:meth:`withheld` counts grow
until the end). A client that reads slowly holds up only this task: the command's pipes are
drained by the executor at their own speed, and memory stays within the budget.

Used by ``sandbox serve`` (``tool.output`` notifications, one ``tool.output.withheld``) and meant
for every server that streams a call's output.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import anyio

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from sandbox.vocabulary import Stream

INTERVAL_S = 0.02
"""How long chunks gather before they are sent: one message for a burst of small writes."""
CHUNK = 64 * 1024
"""The most one message carries."""
STREAMS: tuple[Stream, ...] = ("stdout", "stderr")


class LiveOutput:
    """One call's live output: :meth:`feed` from the executor, :meth:`run` as a task, :meth:`finish`."""

    def __init__(
        self,
        send: Callable[[Stream, bytes], Awaitable[None]],
        notice: Callable[[dict[Stream, int]], Awaitable[None]],
        *,
        per_stream: int,
        total: int,
    ) -> None:
        self._send, self._notice = send, notice
        self.per_stream, self.total = per_stream, total
        self._pending: dict[Stream, bytearray] = {s: bytearray() for s in STREAMS}
        self.kept: dict[Stream, int] = dict.fromkeys(STREAMS, 0)  # taken for sending (sent or pending)
        self.sent: dict[Stream, int] = dict.fromkeys(STREAMS, 0)
        self.withheld: dict[Stream, int] = dict.fromkeys(STREAMS, 0)
        self._noticed = False
        self._wake = anyio.Event()
        self._finished = anyio.Event()
        self._flushing = anyio.Lock()  # run's sends and finish's, in order
        self._done = False

    def feed(self, stream: Stream, chunk: bytes) -> None:
        """Take what fits in the budget, count the rest; never waits (the executor calls it)."""
        room = max(0, min(self.per_stream - self.kept[stream], self.total - sum(self.kept.values())))
        taken = chunk[:room]
        if taken:
            self._pending[stream] += taken
            self.kept[stream] += len(taken)
        self.withheld[stream] += len(chunk) - len(taken)
        self._wake.set()

    def callback(self, stream: Stream) -> Callable[[bytes], None]:
        """``feed`` for one stream, as the executor's ``on_stdout``/``on_stderr``."""
        return lambda chunk: self.feed(stream, chunk)

    async def run(self) -> None:
        """Send what gathered, every :data:`INTERVAL_S` while output arrives, until :meth:`finish`."""
        while not self._done:
            await self._wake.wait()
            self._wake = anyio.Event()
            with anyio.move_on_after(INTERVAL_S):
                await self._finished.wait()  # the call's end does not wait out the gathering
            if self._done:
                return  # finish() sends the rest
            await self._flush()

    async def finish(self) -> None:
        """Send the rest of what was kept (and the notice, if any was withheld); stop :meth:`run`."""
        self._done = True
        self._wake.set()
        self._finished.set()
        await self._flush()

    async def _flush(self) -> None:
        async with self._flushing:
            await self._send_pending()

    async def _send_pending(self) -> None:
        for stream in STREAMS:
            pending = self._pending[stream]
            while pending:
                part = bytes(pending[:CHUNK])
                del pending[:CHUNK]
                await self._send(stream, part)
                self.sent[stream] += len(part)
        if not self._noticed and any(self.withheld.values()):
            self._noticed = True
            await self._notice(dict(self.withheld))

    def summary(self) -> dict[str, Any]:
        """For the call's result: per stream, the bytes sent live and those not sent."""
        return {
            "budget": {"per_stream": self.per_stream, "total": self.total},
            **{s: {"streamed": self.sent[s], "withheld": self.withheld[s]} for s in STREAMS},
        }
