"""The one glob dialect: what a pattern means to the policy and to the Glob and Grep tools.

The policy reads protected-path lists and path rules with it on the host; the file-tool runner
reads Glob patterns and Grep's ``include`` with it inside the jail. One translator means a rule
cannot protect one set of files while the tool it guards lists another.

Over ``/``-separated paths:

- ``*`` matches any run of characters within one component, ``?`` exactly one;
- ``**/`` matches zero or more whole directories (``**/*.py``, ``src/**/test_*.py``); any other
  ``**`` matches anything, ``/`` included, so ``src/**`` is everything below ``src``;
- ``[abc]``, ``[a-z]``, ``[!abc]`` (or ``[^abc]``) match one character of a set, a negated set
  never a ``/``; a ``]`` first in the set is a member, a ``\\`` an ordinary character; a ``[``
  that opens no valid set is literal;
- ``{a,b}`` matches either alternative; each is a glob of its own and may nest
  (``*.{pem,key}``, ``{src,test}/**/*.{py,pyi}``); a ``{`` without its ``}`` is literal.

Everything else is literal; there is no backslash escape (``[*]`` matches a ``*``). The result
is unanchored: a caller fullmatches it, or wraps it in its own anchors.

Standard library only, and kept to what the jail's ``python3`` can run: the runner carries
this module into the jail (see :func:`sandbox._jailside.program`).
"""

from __future__ import annotations

import re

_ANY_DIRS = "(?:[^/]*/)*"
# Escaped inside a set: the regex meta-characters there, and the pairs ("&&", "~~", "||", "[[")
# that Python reserves for future set operations.
_SET_SPECIAL = frozenset("\\[]^&~|")


def translate(pattern: str) -> str:
    """The regular expression, unanchored, that matches what ``pattern`` matches."""
    out: list[str] = []
    i = 0
    while i < len(pattern):
        piece, i = _token(pattern, i)
        out.append(piece)
    return "".join(out)


def glob_regex(pattern: str) -> re.Pattern[str]:
    """``pattern`` compiled, for ``fullmatch`` against a relative ``/``-path."""
    return re.compile(translate(pattern))


def _token(pattern: str, i: int) -> tuple[str, int]:
    """The regex for the token at ``i`` and the index after it."""
    if pattern.startswith("**/", i):
        return _ANY_DIRS, i + 3
    if pattern.startswith("**", i):
        return ".*", i + 2
    char = pattern[i]
    if char == "*":
        return "[^/]*", i + 1
    if char == "?":
        return "[^/]", i + 1
    if char in "[{":
        found = _charset(pattern, i) if char == "[" else _braces(pattern, i)
        if found is not None:
            return found
    return re.escape(char), i + 1


def _charset(pattern: str, i: int) -> tuple[str, int] | None:
    negate = pattern[i + 1 : i + 2] in ("!", "^")
    start = i + 2 if negate else i + 1
    # A "]" right after the opening (or the negation) is a member, not the end.
    end = pattern.find("]", start + 1 if pattern[start : start + 1] == "]" else start)
    if end == -1:
        return None
    members = "".join("\\" + c if c in _SET_SPECIAL else c for c in pattern[start:end])
    regex = f"[^/{members}]" if negate else f"[{members}]"
    try:
        re.compile(regex)
    except re.error:  # a set the engine refuses (a reversed range such as [z-a]): "[" is literal
        return None
    return regex, end + 1


def _braces(pattern: str, i: int) -> tuple[str, int] | None:
    parts: list[str] = []
    depth, start = 0, i + 1
    for j in range(i, len(pattern)):
        char = pattern[j]
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                parts.append(pattern[start:j])
                return "(?:" + "|".join(translate(part) for part in parts) + ")", j + 1
        elif char == "," and depth == 1:
            parts.append(pattern[start:j])
            start = j + 1
    return None
