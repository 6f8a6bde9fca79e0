"""How a server ends on a signal: SIGTERM, SIGHUP and SIGINT end it as a closed stdin does.

Clients end the servers they start in different ways (issue 33): Codex, Gemini CLI and opencode
send SIGTERM, a closing terminal SIGHUP, Claude Code SIGINT then SIGTERM, others close stdin. Each
must end ``sandbox serve`` and ``sandbox mcp`` the same way: calls killed, sessions closed, a copy
session's work kept as a changeset and its id said. Left to their default actions, SIGTERM and
SIGHUP would end the process before any of that.
"""

from __future__ import annotations

import signal
import sys
from typing import TYPE_CHECKING

import anyio

if TYPE_CHECKING:
    from collections.abc import Callable

ENDING_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT) if sys.platform != "win32" else ()


async def end_on_signal(end: Callable[[], object]) -> None:
    """Wait for one of :data:`ENDING_SIGNALS`, then call ``end`` (once); a later one is ignored
    while the server closes, so a second SIGINT cannot cut a changeset's keep short."""
    if not ENDING_SIGNALS:
        return  # Windows: no signal receiver; the console's Ctrl-C ends the process
    with anyio.open_signal_receiver(*ENDING_SIGNALS) as signals:
        async for _signum in signals:
            end()
            break
        else:
            return
        await anyio.sleep_forever()  # keep the handlers installed (later signals swallowed) until cancelled
