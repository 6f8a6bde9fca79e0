"""The file-tool runner's reply, as the host reads it.

The runner (:mod:`sandbox._jailside.runner`) is standard library only and answers with one JSON
object; this is that object's shape on the host side, and :func:`runner_reply` reads a decoded
reply into it. A reply is data from inside the jail: a missing field reads as its empty value and
an error code outside the vocabulary as ``TOOL_FAILED``, so nothing the jail prints can put an
unknown code into a result. :func:`decode_reply` reads the runner's output with a bound on its
depth (:mod:`sandbox.jsonbound`): a jail that prints an array nested 100,000 deep gets a failed
call, not a ``RecursionError`` in the server.

:func:`grep_text` turns a Grep reply, in any of ADR 0057's output modes, into the model's text,
leaving out every path the policy does not let the caller read.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NotRequired, TypedDict

from sandbox import jsonbound
from sandbox.vocabulary import ERROR_CODES

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from sandbox.vocabulary import ErrorCode


class RunnerReply(TypedDict):
    ok: bool
    content: str
    error_code: ErrorCode | None
    details: dict[str, Any]  # per operation: paths, hits, existed/before/after for a write ...
    resolved: NotRequired[str | None]  # the path the runner acted on


REPLY_DEPTH = 16  # a reply nests four deep (details, hits, a hit): room to grow, none to recurse
REPLY_BYTES = 64 * 1024 * 1024  # above the runner's capture: the capture is what bounds it


def decode_reply(stdout: str) -> dict[str, Any] | None:
    """The runner's output as a JSON object, or ``None`` when it is none (not JSON, too deep, a list)."""
    try:
        raw = jsonbound.loads(stdout, max_bytes=REPLY_BYTES, max_depth=REPLY_DEPTH)
    except ValueError:
        return None
    return raw if isinstance(raw, dict) else None


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


def grep_text(details: dict[str, Any], readable: Callable[[str], bool], pattern: str) -> tuple[str, dict[str, Any]]:
    """The content of a Grep result and its details, without the hits in unreadable paths."""
    mode = details.get("mode")
    if mode == "filesWithMatches":
        return _files_text(details, readable, pattern)
    if mode == "count":
        return _count_text(details, readable, pattern)
    return _content_text(details, readable, pattern)


def _more(details: dict[str, Any], shown: int, what: str) -> str:
    if not details.get("truncated"):
        return ""
    return f"\n[more than {shown} {what}; showing the first ones; narrow the search or raise headLimit]"


def _content_text(details: dict[str, Any], readable: Callable[[str], bool], pattern: str) -> tuple[str, dict[str, Any]]:
    allowed: dict[str, bool] = {}
    lines = []
    kept = []
    for path, number, is_match, text in details.get("hits", []):
        if allowed.setdefault(path, readable(path)):
            sep = ":" if is_match else "-"
            lines.append(f"{path}{sep}{number}{sep}{text}")
            kept.append([path, number, is_match, text])
    details["hits"] = kept
    content = "\n".join(lines) if lines else f"no matches for /{pattern}/"
    return content + _more(details, details.get("matches", 0), "matches"), details


def _files_text(details: dict[str, Any], readable: Callable[[str], bool], pattern: str) -> tuple[str, dict[str, Any]]:
    found = details.get("files", [])
    details["files"] = [path for path in found if readable(path)]
    content = "\n".join(details["files"]) if details["files"] else f"no files match /{pattern}/"
    return content + _more(details, len(found), "files match"), details


def _count_text(details: dict[str, Any], readable: Callable[[str], bool], pattern: str) -> tuple[str, dict[str, Any]]:
    counted = details.get("counts", [])
    details["counts"] = [[path, count] for path, count in counted if readable(path)]
    details["matches"] = sum(count for _, count in details["counts"])
    if not details["counts"]:
        return f"no matches for /{pattern}/" + _more(details, len(counted), "files match"), details
    lines = [f"{path}:{count}" for path, count in details["counts"]]
    lines.append(f"[{details['matches']} matching lines in {len(details['counts'])} files]")
    return "\n".join(lines) + _more(details, len(counted), "files match"), details
