"""What ``sandbox serve`` can say before it has imported anything heavy: the ``initialize`` answer.

An agent starts the server and waits for ``initialize`` before it does anything else, so that
reply is the server's start-up time as the agent sees it. Importing the server (pydantic, the
policy layer, bashlex, the backends) takes most of a second on a slow host; this module is
standard library only, answers a well-formed ``initialize`` at once, and the full server imports
while the agent reads the reply. Anything else on the first line goes to the full server as is.
"""

from __future__ import annotations

import json
import os
import select
from typing import Any

from sandbox import __version__

PROTOCOL = 1
# The registry's names (``sandbox.tools.params.REGISTRY``); a test keeps the two equal.
TOOL_NAMES: tuple[str, ...] = ("Bash", "Edit", "Glob", "Grep", "LS", "Read", "Write")
MAX_FIRST_LINE = 1 << 16


def initialize_result() -> dict[str, Any]:
    return {"server": "sandbox", "version": __version__, "protocol": PROTOCOL, "tools": list(TOOL_NAMES)}


def early_reply(line: bytes) -> bytes | None:
    """The reply to ``line`` when it is a well-formed ``initialize`` request, else ``None``.

    Well-formed means what the full server would accept: JSON-RPC 2.0, an id, and params that
    are absent or hold at most ``client`` (a string or null); anything else is the server's to
    answer, with its own errors.
    """
    try:
        message = json.loads(line)
    except (ValueError, RecursionError):  # a line nested too deep is the full server's to refuse
        return None
    if not isinstance(message, dict) or message.get("method") != "initialize" or message.get("jsonrpc") != "2.0":
        return None
    rid, params = message.get("id"), message.get("params") or {}
    if isinstance(rid, bool) or not isinstance(rid, str | int) or not isinstance(params, dict):
        return None
    if set(params) - {"client"} or not isinstance(params.get("client"), str | None):
        return None
    body = {"jsonrpc": "2.0", "id": rid, "result": initialize_result()}
    return (json.dumps(body, separators=(",", ":")) + "\n").encode()


def read_first_line(fd: int) -> tuple[bytes, bytes]:
    """Block until one line (or EOF, or ``MAX_FIRST_LINE`` bytes) arrives: ``(line, the rest read)``."""
    data = b""
    while b"\n" not in data and len(data) < MAX_FIRST_LINE:
        try:
            chunk = os.read(fd, MAX_FIRST_LINE)
        except BlockingIOError:  # a client may hand us a non-blocking pipe
            select.select([fd], [], [])
            continue
        if not chunk:
            break
        data += chunk
    line, newline, rest = data.partition(b"\n")
    return line + newline, rest


def write_all(fd: int, data: bytes) -> bool:
    """Write ``data`` to a blocking ``fd``; ``False`` when the reader has gone."""
    view = memoryview(data)
    try:
        while view:
            view = view[os.write(fd, view) :]
    except OSError:
        return False
    return True
