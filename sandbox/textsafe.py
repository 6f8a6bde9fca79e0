"""Names and diffs a jail chose, made safe to show: review output is data, never terminal control.

A jail names its files and writes their content, and a reviewer reads both in a terminal, an
MCP client or pi. A name like ``"a\\nM  fake.py"`` would forge a second line of a change list,
``"\\x1b[2J"`` clears the screen, and ``"x\\u202etxt.exe"`` (a right-to-left override) shows as
``xexe.txt``. :func:`printable` is the one escape every text renderer uses (``sandbox changes``,
``sandbox run``'s summary, the MCP review tools, the diff text JSON-RPC and pi show; pi's
``printable`` in ``integrations/pi/src/review.ts`` is its port, tested on the same cases): every
character Python does not call printable (C0 and C1 controls, DEL, format characters such as the
bidi overrides and zero-width ones, line and paragraph separators, unpaired surrogates from an
undecodable name, private-use and unassigned code points, spaces other than U+0020) becomes a
backslash escape: ``\\n``, ``\\r``, ``\\t``, ``\\xNN``, ``\\uNNNN`` or ``\\UNNNNNNNN``.

Structured output keeps the raw name: a JSON ``path`` is data, escaped by JSON itself, and what a
program does with it is its own. A backslash is not doubled (a diff of code stays readable), so a
name made of the characters ``\\x1b`` shows like one holding ESC: ambiguous to the eye, but it
cannot forge or hide a line.
"""

from __future__ import annotations

_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(char: str) -> str:
    code = ord(char)
    if char in _NAMED:
        return _NAMED[char]
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def printable(text: str, *, keep: str = "") -> str:
    """``text`` with every non-printable character (except those in ``keep``) escaped: one line, shown as is."""
    if text.isprintable():  # the common case, at C speed
        return text
    return "".join(c if c.isprintable() or c in keep else _escape(c) for c in text)


def printable_lines(lines: list[str]) -> list[str]:
    """Lines of a diff or a summary, each escaped on its own (a tab, common in code, kept)."""
    return [printable(line, keep="\t") for line in lines]
