"""The file-tool runner's reply, as the host reads it.

The runner (:mod:`sandbox._jailside.runner`) is standard library only and answers with one JSON
object; this is that object's shape on the host side, and :func:`runner_reply` reads a decoded
reply into it. A reply is data from inside the jail: a missing field reads as its empty value and
an error code outside the vocabulary as ``TOOL_FAILED``, so nothing the jail prints can put an
unknown code into a result.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NotRequired, TypedDict

from sandbox.vocabulary import ERROR_CODES

if TYPE_CHECKING:
    from collections.abc import Mapping

    from sandbox.vocabulary import ErrorCode


class RunnerReply(TypedDict):
    ok: bool
    content: str
    error_code: ErrorCode | None
    details: dict[str, Any]  # per operation: paths, hits, existed/before/after for a write ...
    resolved: NotRequired[str | None]  # the path the runner acted on


def runner_reply(raw: Mapping[str, Any]) -> RunnerReply:
    """``raw`` (a decoded runner reply) with every field typed; see the module docstring."""
    details = raw.get("details")
    reply = RunnerReply(
        ok=bool(raw.get("ok")),
        content=str(raw.get("content", "")),
        error_code=known_code(raw.get("error_code")),
        details=dict(details) if isinstance(details, dict) else {},
    )
    if "resolved" in raw:
        reply["resolved"] = raw["resolved"]
    return reply


def known_code(value: object) -> ErrorCode | None:
    """``value`` as an :data:`ErrorCode`: ``None`` stays ``None``, anything unknown is ``TOOL_FAILED``."""
    if value is None:
        return None
    for code in ERROR_CODES:
        if value == code:
            return code
    return "TOOL_FAILED"
