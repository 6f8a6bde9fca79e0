"""The file tools' half that runs inside the jail: standard library only, one request per run.

A warm jail's agent carries this module and serves small requests in its own process
(:func:`serve_inline`, within bounds); everywhere else it runs as a program, as below.

``sandbox.tools.run`` sends this module, with the glob translator it imports, to
``python3 -I -S -c`` in the jail (see :func:`sandbox._jailside.program`), writes one JSON request
to its stdin and reads one JSON response from its stdout. Running here, a tool sees exactly
what Bash sees: the jail's mounts, its read-only paths, its private copy under a ``copy`` mount.
Nothing here trusts the host's resolution of a path: the path is resolved again in the jail and
returned, so the caller can refuse a target that differs from the approved one.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import stat
import sys

TYPE_CHECKING = False  # typing's import costs each jail's start about 3 ms: annotations need none
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator
    from typing import Any

READ_LINES = 2000
READ_BYTES = 256 * 1024
RAW_BYTES = 32 * 1024 * 1024
LINE_CHARS = 2000
SNAPSHOT_BYTES = 8 * 1024 * 1024
LIST_LIMIT = 1000
# Windows (the winjob backend runs this under a Windows Python): no O_NOFOLLOW or O_NONBLOCK
# there (the realpath check in main() is the guard), and O_BINARY keeps the C runtime from
# translating line ends.
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_BINARY = getattr(os, "O_BINARY", 0)
SKIP_DIRS = {".git", "node_modules", "__pycache__", ".venv", ".mypy_cache", ".pytest_cache"}


class Failure(Exception):
    def __init__(self, code: str, message: str, **details: Any) -> None:
        super().__init__(message)
        self.code, self.message, self.details = code, message, details


def _real(path: str) -> str:
    return os.path.realpath(path)


def _is_binary(head: bytes) -> bool:
    return b"\0" in head[:8192]


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _read_bytes(path: str) -> bytes:
    fd = os.open(path, os.O_RDONLY | _NOFOLLOW | _NONBLOCK | _BINARY)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise Failure("INVALID_ARGUMENT", f"{path} is not a regular file")
        if _inline and st.st_size > INLINE_BYTES:
            raise TooBig(path)
        chunks, total = [], 0
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
            total += len(chunk)
            if _inline and total > INLINE_BYTES:  # it grew since the fstat
                raise TooBig(path)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _existing_file(path: str) -> bytes | None:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    if stat.S_ISDIR(st.st_mode):
        raise Failure("INVALID_ARGUMENT", f"{path} is a directory")
    if not stat.S_ISREG(st.st_mode):
        raise Failure("INVALID_ARGUMENT", f"{path} is not a regular file")
    return _read_bytes(path)


def _atomic_write(path: str, data: bytes, mode: int | None) -> None:
    parent = os.path.dirname(path) or "."
    os.makedirs(parent, exist_ok=True)
    tmp = os.path.join(parent, f".{os.path.basename(path)}.sandbox-tmp-{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _BINARY, 0o644 if mode is None else mode)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        if mode is not None:
            os.fchmod(fd, mode)
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        os.unlink(tmp)
        raise
    os.close(fd)
    os.replace(tmp, path)  # rename(2)'s semantics; Windows' os.rename refuses an existing target


def _snapshot(before: bytes | None) -> dict[str, Any]:
    if before is None:
        return {"before": None, "existed": False}
    keep = len(before) <= SNAPSHOT_BYTES
    return {
        "existed": True,
        "before_size": len(before),
        "before_sha256": _sha(before),
        "before": base64.b64encode(before).decode() if keep else None,
        "before_kept": keep,
    }


def op_read(req: dict[str, Any]) -> dict[str, Any]:
    path = req["path"]
    if os.path.isdir(path):
        raise _directory_read(path, req.get("given") or path)
    if not os.path.exists(path):
        raise Failure("TOOL_FAILED", f"{path} does not exist")
    data = _read_bytes(path)
    if req.get("raw"):
        if len(data) > RAW_BYTES:
            raise Failure("TOOL_FAILED", f"{path} is {len(data)} bytes; a raw read returns at most {RAW_BYTES}")
        return {
            "content": f"read {len(data)} bytes from {path}",
            "details": {"data_base64": base64.b64encode(data).decode(), "size": len(data), "binary": _is_binary(data)},
        }
    if _is_binary(data):
        return {
            "content": f"{path} is a binary file ({len(data)} bytes); not shown",
            "details": {"binary": True, "size": len(data)},
        }
    lines = data.decode("utf-8", errors="replace").splitlines()
    start = (req.get("offset") or 1) - 1
    limit = req.get("limit") or READ_LINES
    window, size, out = lines[start : start + limit], 0, []
    for number, line in enumerate(window, start + 1):
        text = line if len(line) <= LINE_CHARS else line[:LINE_CHARS] + " [line truncated]"
        size += len(text) + 8
        if size > READ_BYTES:
            break
        out.append(f"{number:6}\t{text}")
    last = start + len(out)
    content = "\n".join(out)
    truncated = last < len(lines)
    if truncated:
        content += f"\n[showing lines {start + 1}-{last} of {len(lines)}; call Read with offset={last + 1} to continue]"
    return {
        "content": content,
        "details": {"lines": len(lines), "first": start + 1, "last": last, "truncated": truncated, "size": len(data)},
    }


def _directory_read(path: str, given: str) -> Failure:
    # ADR 0057: a directory is not a failed read but a wrong tool; say which call lists it, in the
    # caller's own spelling of the path, so a model can retry without guessing.
    args = {"pattern": "*", "path": given}
    return Failure(
        "INVALID_ARGUMENT",
        f"{path} is a directory, not a file; Read takes a file. To list it, call Glob with "
        f'pattern "*" and path {json.dumps(given)} (pattern "**/*" lists everything below it).',
        suggestion={"tool": "Glob", "args": args},
    )


def op_write(req: dict[str, Any]) -> dict[str, Any]:
    path = req["path"]
    before = _existing_file(path)
    mode = stat.S_IMODE(os.lstat(path).st_mode) if before is not None else None
    after = req["content"].encode()
    _atomic_write(path, after, mode)
    return {
        "content": f"wrote {len(after)} bytes to {path}",
        "details": {
            **_snapshot(before),
            "after_sha256": _sha(after),
            "after_size": len(after),
            "after": req["content"] if len(after) <= SNAPSHOT_BYTES else None,
        },
    }


def op_edit(req: dict[str, Any]) -> dict[str, Any]:
    path = req["path"]
    before = _existing_file(path)
    if before is None:
        raise Failure("TOOL_FAILED", f"{path} does not exist; use Write to create it")
    text = before.decode("utf-8", errors="strict") if not _is_binary(before) else None
    if text is None:
        raise Failure("TOOL_FAILED", f"{path} is a binary file; Edit works on text")
    for number, edit in enumerate(req["edits"], 1):
        count = text.count(edit["old_text"])
        if count != 1:
            found = "was not found" if count == 0 else f"matched {count} times"
            raise Failure(
                "TOOL_FAILED",
                f"edit {number}: old_text {found} in {path}; nothing was written. "
                "Read the file again and give an old_text that matches exactly once.",
                edit=number,
                matches=count,
            )
        text = text.replace(edit["old_text"], edit["new_text"], 1)
    after = text.encode()
    _atomic_write(path, after, stat.S_IMODE(os.lstat(path).st_mode))
    return {
        "content": f"applied {len(req['edits'])} edit(s) to {path}",
        "details": {
            **_snapshot(before),
            "after_sha256": _sha(after),
            "after_size": len(after),
            "after": text if len(after) <= SNAPSHOT_BYTES else None,
        },
    }


def _walk(root: str) -> Iterator[str]:
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS)
        for name in sorted(filenames):
            yield os.path.join(dirpath, name)


def op_glob(req: dict[str, Any]) -> dict[str, Any]:
    base = req["path"]
    pattern = req["pattern"]
    _must_exist(base)
    if not os.path.isdir(base):
        raise Failure("INVALID_ARGUMENT", f"{base} is not a directory")
    from sandbox._jailside.glob import glob_regex  # shipped only with Glob and Grep requests

    rel_pattern = os.path.relpath(pattern, base) if os.path.isabs(pattern) else pattern
    regex = glob_regex(rel_pattern)
    matches = [p for p in _walk(base) if regex.fullmatch(os.path.relpath(p, base))]
    limit = min(req.get("limit") or LIST_LIMIT, LIST_LIMIT)
    truncated = len(matches) > limit
    return {"content": "", "details": {"paths": matches[:limit], "count": len(matches), "truncated": truncated}}


def op_grep(req: dict[str, Any]) -> dict[str, Any]:
    """Search in one of ADR 0057's output modes; ``head_limit`` bounds lines or files."""
    try:
        regex = re.compile(req["pattern"], re.IGNORECASE if req.get("case_insensitive") else 0)
    except re.error as exc:
        raise Failure("INVALID_ARGUMENT", f"invalid regular expression: {exc}") from exc
    from sandbox._jailside.glob import glob_regex  # shipped only with Glob and Grep requests

    include = glob_regex(req["include"]) if req.get("include") else None
    root = req["path"]
    _must_exist(root)
    files = [root] if os.path.isfile(root) else _walk(root)
    wanted = (p for p in files if include is None or include.fullmatch(os.path.basename(p)))
    mode = req.get("mode") or "content"
    if mode not in GREP_MODES:
        raise Failure("INVALID_ARGUMENT", f"unknown Grep output mode {mode!r}")
    details = GREP_MODES[mode](wanted, regex, req.get("head_limit") or 100, req.get("context") or 0)
    return {"content": "", "details": {"mode": mode, **details}}


def _grep_content(files: Iterable[str], regex: re.Pattern[str], limit: int, context: int) -> dict[str, Any]:
    hits: list[tuple[str, int, bool, str]] = []
    matches = 0
    for path in files:
        for number, is_match, text in _grep_file(path, regex, context):
            if is_match:
                matches += 1
                if matches > limit:
                    return {"hits": hits, "matches": limit, "truncated": True}
            hits.append((path, number, is_match, text))
    return {"hits": hits, "matches": matches, "truncated": False}


def _grep_files(files: Iterable[str], regex: re.Pattern[str], limit: int, _context: int) -> dict[str, Any]:
    found: list[str] = []
    for path in files:
        if any(regex.search(line) for line in _text_lines(path)):
            if len(found) == limit:
                return {"files": found, "truncated": True}
            found.append(path)
    return {"files": found, "truncated": False}


def _grep_count(files: Iterable[str], regex: re.Pattern[str], limit: int, _context: int) -> dict[str, Any]:
    counts: list[tuple[str, int]] = []
    for path in files:
        count = sum(1 for line in _text_lines(path) if regex.search(line))
        if count:
            if len(counts) == limit:
                return {"counts": counts, "truncated": True}
            counts.append((path, count))
    return {"counts": counts, "truncated": False}


GREP_MODES: dict[str, Callable[[Iterable[str], re.Pattern[str], int, int], dict[str, Any]]] = {
    "content": _grep_content,
    "filesWithMatches": _grep_files,
    "count": _grep_count,
}


def _text_lines(path: str) -> list[str]:
    """``path``'s lines, or none for a file that cannot be read or is binary (grep skips both)."""
    try:
        data = _read_bytes(path)
    except (OSError, Failure):
        return []
    if _is_binary(data):
        return []
    return data.decode("utf-8", errors="replace").splitlines()


def _grep_file(path: str, regex: re.Pattern[str], context: int) -> list[tuple[int, bool, str]]:
    lines = _text_lines(path)
    hits = [i for i, line in enumerate(lines) if regex.search(line)]
    keep: dict[int, bool] = {}
    for i in hits:
        for j in range(max(0, i - context), min(len(lines), i + context + 1)):
            keep[j] = keep.get(j, False) or j == i
    return [(i + 1, keep[i], lines[i][:LINE_CHARS]) for i in sorted(keep)]


def _entry_type(entry: os.DirEntry[str]) -> str:
    if entry.is_symlink():
        return "symlink-dir" if entry.is_dir() else "symlink"
    if entry.is_dir(follow_symlinks=False):
        return "dir"
    return "file" if entry.is_file(follow_symlinks=False) else "other"


def _must_exist(path: str) -> None:
    if not os.path.lexists(path):
        raise Failure("TOOL_FAILED", f"{path} does not exist")


def op_ls(req: dict[str, Any]) -> dict[str, Any]:
    path = req["path"]
    _must_exist(path)
    if not os.path.isdir(path):
        raise Failure("INVALID_ARGUMENT", f"{path} is not a directory")
    with os.scandir(path) as it:
        found = []
        for entry in it:
            found.append(entry)
            if _inline and len(found) > INLINE_ENTRIES:
                raise TooBig(path)
        entries = [{"name": e.name, "type": _entry_type(e)} for e in sorted(found, key=lambda e: e.name)]
    truncated = len(entries) > LIST_LIMIT
    marks = {"dir": "/", "symlink-dir": "@", "symlink": "@"}
    lines = [e["name"] + marks.get(e["type"], "") for e in entries[:LIST_LIMIT]]
    content = "\n".join(lines) or "(empty directory)"
    return {
        "content": content,
        "details": {"entries": entries[:LIST_LIMIT], "count": len(entries), "truncated": truncated},
    }


def op_restore(req: dict[str, Any]) -> dict[str, Any]:
    """Rollback: only if the file still has the post-tool hash; restore or remove."""
    path = req["path"]
    try:
        current = _existing_file(path)
    except Failure as exc:
        raise Failure("CONFLICT", f"{path} changed since the tool ran ({exc.message}); left alone") from exc
    if current is None or _sha(current) != req["expect_sha256"]:
        raise Failure("CONFLICT", f"{path} changed since the tool ran; it was left alone")
    if req.get("before") is None:
        os.unlink(path)
        return {"content": f"removed {path} (the tool had created it)", "details": {}}
    _atomic_write(path, base64.b64decode(req["before"]), stat.S_IMODE(os.lstat(path).st_mode))
    return {"content": f"restored the previous content of {path}", "details": {}}


OPS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "read": op_read,
    "write": op_write,
    "edit": op_edit,
    "glob": op_glob,
    "grep": op_grep,
    "ls": op_ls,
    "restore": op_restore,
}


def handle(request: dict[str, Any], resolved: str | None = None) -> dict[str, Any]:
    """One request's reply: the path resolved again here (``resolved``: already), then the operation.

    Its failures are structured, as the reply's ``error_code``.
    """
    approved = request.get("path")
    if approved is not None:
        request["path"] = resolved if resolved is not None else _real(approved)
    try:
        if approved is not None and request["path"] != approved:
            # A symlink appeared (or moved) between the approval and now: do nothing.
            raise Failure(
                "TOOL_DENIED",
                f"the target changed after approval ({approved} now resolves to {request['path']}); nothing was done",
                approved=approved,
                now=request["path"],
            )
        body = OPS[request["op"]](request)
        reply = {"ok": True, "error_code": None, **body}
    except Failure as exc:
        reply = {"ok": False, "error_code": exc.code, "content": exc.message, "details": exc.details}
    except PermissionError as exc:
        reply = {
            "ok": False,
            "error_code": "TOOL_FAILED",
            "content": f"permission denied by the sandbox: {exc.filename or request.get('path')}",
            "details": {"errno": "EACCES"},
        }
    except OSError as exc:
        reply = {
            "ok": False,
            "error_code": "TOOL_FAILED",
            "content": f"{exc.strerror or exc}: {exc.filename}",
            "details": {"errno": exc.errno},
        }
    reply["resolved"] = request.get("path")
    return reply


# -- served inside the warm jail's agent (its PID 1), not in a process of the call's own

INLINE_OPS = frozenset({"read", "write", "edit", "ls", "restore"})  # bounded work; Glob and Grep walk trees
INLINE_BYTES = 1024 * 1024  # a file larger than this is read by a forked runner, in the call's cgroup
INLINE_ENTRIES = 4 * LIST_LIMIT  # likewise a directory with more entries
# Paths whose meaning depends on the process that opens them (/proc/self is the agent's own) or
# that reach devices: a forked runner, which is the call's process, opens those.
INLINE_REFUSED = ("/proc", "/sys", "/dev")
_inline = False


class TooBig(Exception):
    """An in-agent operation met more than it may hold in the agent's memory: a forked runner does it."""


def serve_inline(request: dict[str, Any]) -> dict[str, Any] | None:
    """``handle`` in the agent's process, within its bounds; ``None``: a forked runner must do it.

    The agent is outside the call's cgroup, so nothing here may hold more than ``INLINE_BYTES``
    of a file or ``INLINE_ENTRIES`` names of a directory, whatever the jail's commands left
    there; an operation that meets more gives up (``TooBig``) before anything was written.
    """
    global _inline
    if request.get("op") not in INLINE_OPS:
        return None
    path = request.get("path")
    real = _real(path) if isinstance(path, str) else "/proc"
    if any(real == top or real.startswith(top + "/") for top in INLINE_REFUSED):
        return None
    _inline = True
    try:
        return handle(request, real)
    except TooBig:
        return None
    finally:
        _inline = False


def main() -> None:
    sys.stdout.write(json.dumps(handle(json.loads(sys.stdin.buffer.read()))))


if __name__ == "__main__":
    main()
