"""Unified diffs with a bound on their cost, for reviewing what a jail wrote.

``difflib``'s matcher is quadratic in the worst case: two files of many unique lines that share
every other one take seconds at 5,000 lines and minutes at 100,000, and a hostile repository
chooses what a review compares. :func:`unified` gives ``difflib.unified_diff``'s lines, the same
ones for the files a review usually meets, but refuses, with :class:`TooCostly`, a comparison
past its bounds:

* size: the lines both sides share at their start and end (beyond the context) are left out of
  the comparison first, as an edit of a long file touches a few lines; what remains may have at
  most :data:`MAX_LINES` lines and :data:`MAX_BYTES` bytes on each side;
* time: the matcher checks a deadline before each of its searches (each one linear in what
  remains), so a comparison ends at most one search past it.

A comparison of more than :data:`IN_PROCESS_LINES` lines runs in a child process (``python -I``,
niced, killed at the deadline): in a thread it would hold the GIL the server's event loop needs
on every wake-up. A smaller one runs here, handing the GIL over between searches. A caller shows a
summary in place of the diff (:meth:`TooCostly.summary`); the call itself is still the caller's
to keep off an event loop (a worker thread).
"""

from __future__ import annotations

import difflib
import json
import os
import subprocess
import sys
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Sequence

MAX_LINES = 20_000
IN_PROCESS_LINES = 2_000  # a comparison this small takes well under a second even at worst
MAX_BYTES = 2 << 20
DEADLINE_S = 2.0
"""The default time a comparison may take; a caller reviewing many files shares one deadline."""


# The child's program: standard library only, its own priority lowered (the server's loop first).
_CHILD = """
import difflib, json, os, sys
os.nice(10)
old, new, n = json.load(sys.stdin)
json.dump(list(difflib.SequenceMatcher(None, old, new).get_grouped_opcodes(n)), sys.stdout)
"""


class TooCostly(Exception):
    """The comparison passed a bound: ``removed``/``added`` count the lines that differ (at most)."""

    def __init__(self, removed: int, added: int, why: str) -> None:
        super().__init__(why)
        self.removed, self.added, self.why = removed, added, why

    def summary(self) -> str:
        return f"{self.removed} lines removed and {self.added} added at most; diff omitted: {self.why}"


class _Matcher(difflib.SequenceMatcher[str]):
    """A matcher that gives up once ``deadline`` (a ``time.monotonic()`` value) has passed."""

    def __init__(self, old: Sequence[str], new: Sequence[str], deadline: float) -> None:
        self._deadline = deadline
        self._sizes = len(old), len(new)
        super().__init__(None, old, new)

    def find_longest_match(
        self, alo: int = 0, ahi: int | None = None, blo: int = 0, bhi: int | None = None
    ) -> difflib.Match:
        if time.monotonic() > self._deadline:
            raise TooCostly(*self._sizes, "too costly to compare in time")
        # Hand the GIL over between searches: an event loop in another thread then waits for it
        # one search at most, not the interpreter's switch interval (5 ms) on every wake-up.
        time.sleep(0)
        return super().find_longest_match(alo, ahi, blo, bhi)


def unified(
    old: Sequence[str],
    new: Sequence[str],
    fromfile: str = "",
    tofile: str = "",
    *,
    n: int = 3,
    lineterm: str = "\n",
    deadline: float | None = None,
    trim: bool | None = None,
) -> list[str]:
    """``difflib.unified_diff(old, new, fromfile, tofile, n=n, lineterm=lineterm)`` as a list, or
    :class:`TooCostly` past the bounds; ``deadline`` defaults to :data:`DEADLINE_S` from now.

    ``trim``: leave the shared start and end out of the comparison (the ``@@`` lines still count
    them); ``None`` does so only past the size bounds, so an ordinary diff is difflib's own (the
    matcher may align ambiguous lines differently once the ends are gone: still a correct diff).
    """
    if trim is None:
        trim = _too_large(old, new) is not None
    skip, tail = _shared_ends(old, new, n) if trim else (0, 0)
    middle_old, middle_new = old[skip : len(old) - tail], new[skip : len(new) - tail]
    _check_size(middle_old, middle_new)
    when = deadline if deadline is not None else time.monotonic() + DEADLINE_S
    lines: list[str] = []
    for group in _groups(middle_old, middle_new, n, when):
        if not lines:
            lines += [f"--- {fromfile}{lineterm}", f"+++ {tofile}{lineterm}"]
        first, last = group[0], group[-1]
        old_range = _range(first[1] + skip, last[2] + skip)
        new_range = _range(first[3] + skip, last[4] + skip)
        lines.append(f"@@ -{old_range} +{new_range} @@{lineterm}")
        for tag, i1, i2, j1, j2 in group:
            if tag == "equal":
                lines += [" " + line for line in middle_old[i1:i2]]
                continue
            lines += ["-" + line for line in middle_old[i1:i2]] if tag in ("replace", "delete") else []
            lines += ["+" + line for line in middle_new[j1:j2]] if tag in ("replace", "insert") else []
    return lines


Group = list[tuple[str, int, int, int, int]]


def _groups(old: Sequence[str], new: Sequence[str], n: int, deadline: float) -> list[Group]:
    """The matcher's grouped opcodes: here for a small comparison, in a child process otherwise."""
    if max(len(old), len(new)) <= IN_PROCESS_LINES:
        return list(_Matcher(old, new, deadline).get_grouped_opcodes(n))
    return _groups_in_child(old, new, n, deadline)


def _groups_in_child(old: Sequence[str], new: Sequence[str], n: int, deadline: float) -> list[Group]:
    """A large comparison in a niced child: no GIL shared with the server's event loop, the child
    killed at the deadline. No child to be had (no process or descriptor to spare) is a summary."""
    request = json.dumps([list(old), list(new), n]).encode()
    try:
        done = subprocess.run(
            [sys.executable, "-I", "-S", "-c", _CHILD],
            input=request,
            capture_output=True,
            timeout=max(0.0, deadline - time.monotonic()),
            check=True,
        )
        groups: list[Group] = json.loads(done.stdout)
    except subprocess.TimeoutExpired:
        raise TooCostly(len(old), len(new), "too costly to compare in time") from None
    except (OSError, ValueError, subprocess.CalledProcessError) as exc:
        raise TooCostly(len(old), len(new), f"cannot compare: {exc}") from None
    return groups


def _shared_ends(old: Sequence[str], new: Sequence[str], n: int) -> tuple[int, int]:
    """How many lines to leave out at the start and at the end: what both share, less the context."""
    head = len(os.path.commonprefix([list(old), list(new)]))  # commonprefix compares lists too
    limit = min(len(old), len(new)) - head
    tail = 0
    while tail < limit and old[len(old) - 1 - tail] == new[len(new) - 1 - tail]:
        tail += 1
    return max(0, head - n), max(0, tail - n)


def _check_size(old: Sequence[str], new: Sequence[str]) -> None:
    why = _too_large(old, new)
    if why is not None:
        raise TooCostly(len(old), len(new), why)


def _too_large(old: Sequence[str], new: Sequence[str]) -> str | None:
    if max(len(old), len(new)) > MAX_LINES:
        return f"more than {MAX_LINES} lines differ"
    if max(sum(map(len, old)), sum(map(len, new))) > MAX_BYTES:
        return f"more than {MAX_BYTES} bytes differ"
    return None


def _range(start: int, stop: int) -> str:
    """A unified diff's range, as difflib writes it: ``start,length`` (1-based; an empty one names
    the line before it, and a one-line range has no length)."""
    length = stop - start
    if length == 1:
        return str(start + 1)
    return f"{start if length == 0 else start + 1},{length}"
