"""JSON from a peer we do not trust, read with bounds on its size and its depth.

A JSON-RPC client's line, the file-tool runner's reply and a warm agent's exit report all come
from the other side of a boundary. ``json.loads`` alone is linear in time but not safe: an array
nested 100,000 deep raises ``RecursionError`` (not a ``ValueError``, so a caller's ``except
ValueError`` lets it through and it ends the task, or the process, that parsed it), and a value
nested a few hundred deep parses but breaks the next recursive walk over it (``json.dumps``,
pydantic, redaction). :func:`loads` turns both into :class:`Refused`, a ``ValueError``, before
the value goes anywhere, and refuses input over its size bound without parsing it.
"""

from __future__ import annotations

import json
from typing import Any

MAX_DEPTH = 64
"""Deeper than any message of ours (a tool's arguments, a runner's reply) nests."""


class Refused(ValueError):
    """The input is too large or nested too deep to be read."""


def loads(data: bytes | str, *, max_bytes: int, max_depth: int = MAX_DEPTH) -> Any:
    """``json.loads(data)``, or :class:`Refused` past ``max_bytes`` or ``max_depth`` (a bare
    scalar has depth 0, ``[]`` depth 1); a syntax error is ``json.JSONDecodeError``, a ``ValueError``
    too."""
    if len(data) > max_bytes:
        raise Refused(f"{len(data)} bytes, more than the {max_bytes} this reader takes")
    try:
        value = json.loads(data)
    except RecursionError:
        raise Refused(f"nested deeper than {max_depth} levels") from None
    if too_deep(value, max_depth):
        raise Refused(f"nested deeper than {max_depth} levels")
    return value


def too_deep(value: object, max_depth: int) -> bool:
    """Whether ``value`` nests lists and objects more than ``max_depth`` deep (walked without
    recursion, once over each container)."""
    stack: list[tuple[object, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        if depth + 1 > max_depth:
            return True
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return False
