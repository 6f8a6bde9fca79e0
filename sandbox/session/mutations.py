"""The global mutation slots (seed 003 §4d): how many mutations run at once across every session.

A session runs one Write or Edit at a time (its own lock); different sessions may mutate their
roots at the same time, up to the process's slots. A session takes its own permit first and a
slot after, so a mutation queued behind its session's earlier edit holds no slot while it waits:
the slots go to the sessions that can use them. The slots belong to one event loop's run (a
server's, a library user's), as :class:`anyio.lowlevel.RunVar` keeps them.
"""

from __future__ import annotations

import contextlib
import os
from typing import TYPE_CHECKING

import anyio
from anyio.lowlevel import RunVar

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

DEFAULT_SLOTS = 4
SLOTS_ENV = "SANDBOX_MUTATION_SLOTS"  # a positive integer: the slots of every run in this process

_SLOTS: RunVar[anyio.CapacityLimiter] = RunVar("sandbox_mutation_slots")


def configured() -> int:
    """The slots this process runs with: ``$SANDBOX_MUTATION_SLOTS`` when it is a positive integer."""
    try:
        given = int(os.environ.get(SLOTS_ENV, ""))
    except ValueError:
        return DEFAULT_SLOTS
    return given if given > 0 else DEFAULT_SLOTS


def slots() -> anyio.CapacityLimiter:
    """This run's slots (made at first use)."""
    try:
        return _SLOTS.get()
    except LookupError:
        limiter = anyio.CapacityLimiter(configured())
        _SLOTS.set(limiter)
        return limiter


@contextlib.asynccontextmanager
async def mutation(permit: anyio.Lock) -> AsyncIterator[None]:
    """Hold the session's ``permit``, then one of the run's slots, for one mutation."""
    async with permit, slots():
        yield
