"""Blocking work off the event loop: the bottom layer every layer above uses.

:func:`off_loop` runs a blocking function in a worker thread (or inline when no thread can
start: a fork bomb may leave none to spare); :func:`soon` skips the hop when the caller knows the
work is quicker than one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeVar

import anyio.to_thread

if TYPE_CHECKING:
    from collections.abc import Callable

T = TypeVar("T")


async def off_loop(fn: Callable[..., T], *args: object) -> T:
    """Run blocking ``fn`` in a worker thread, or inline when no thread can start.

    A fork bomb can leave this user no process to spare, and a thread is one: the work is done
    anyway (blocking the loop a while) rather than lost to ``can't start new thread``.
    """
    try:
        return await anyio.to_thread.run_sync(fn, *args)
    except RuntimeError as exc:
        if "can't start new thread" not in str(exc):
            raise
        return fn(*args)


async def soon(fn: Callable[[], T], *, inline: bool) -> T:
    """``fn()`` on the loop when ``inline`` (known to be quicker than a thread hop), else :func:`off_loop`."""
    return fn() if inline else await off_loop(fn)
