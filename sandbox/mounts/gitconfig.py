"""A git config file read by a small strict parser of the keys' syntax, never by git.

The parser returns every key (``section[.subsection].name``) and its values in order, and raises
:class:`ConfigError` on anything it does not fully understand: a parser that disagrees with git
could hide a key from the review, so a file it cannot read is itself distrusted. ``include.path``
and ``includeIf.*.path`` are keys like any other, reported and never followed here. Apart from
:mod:`sandbox.mounts.gitreview` because two readers share it: the review compares the config
before and after a run, and :mod:`sandbox.mounts.gitobeyed` reads the host's to find what git obeys.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from sandbox.mounts.gitfiles import escape

if TYPE_CHECKING:
    from collections.abc import Iterator


class ConfigError(ValueError):
    """A config file this parser does not fully understand (and so does not trust)."""


_SECTION = re.compile(r'^\[\s*([A-Za-z0-9.-]+)(?:\s+"((?:[^"\\\n]|\\.)*)")?\s*\]\s*(?:[#;].*)?$')
_UNESCAPE = re.compile(r"\\(.)")
_KEY = re.compile(r"^([A-Za-z][A-Za-z0-9-]*)\s*(?:=(.*))?$")


def parse_config(data: bytes) -> dict[str, list[str]]:
    """The keys of a git config file (``section[.subsection].name``, lower case but the
    subsection) and their values in order. Includes are keys like any other, never followed."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError("not UTF-8") from exc
    found: dict[str, list[str]] = {}
    section: str | None = None
    lines = iter(text.split("\n"))
    for number, raw in enumerate(lines, 1):
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("["):
            section = _section(line, number)
            line = line[line.index("]") + 1 :].strip()
            if not line or line[0] in "#;":
                continue
        if section is None:
            raise ConfigError(f"line {number}: a key outside any section")
        name, value = _key_value(line, lines, number)
        found.setdefault(f"{section}.{name}", []).append(value)
    return found


def _section(line: str, number: int) -> str:
    close = line.find("]")
    match = _SECTION.match(line[: close + 1]) if close > 0 else None
    if match is None:
        raise ConfigError(f"line {number}: a section header this parser does not read")
    name, sub = match[1], match[2]
    if sub is None:
        head, _, rest = name.partition(".")  # the deprecated [section.sub] form
        return f"{head.lower()}.{rest.lower()}" if rest else head.lower()
    return name.lower() + "." + _UNESCAPE.sub(r"\1", sub)


def _key_value(line: str, lines: Iterator[str], number: int) -> tuple[str, str]:
    match = _KEY.match(line)
    if match is None:
        raise ConfigError(f"line {number}: not a key = value line")
    if match[2] is None:
        return match[1].lower(), "true"
    value = match[2]
    while value.endswith("\\") and not value.endswith("\\\\"):
        value = value[:-1] + next(lines, "")
    return match[1].lower(), _value(value, number)


def _value(raw: str, number: int) -> str:
    out, quoted, i = [], False, 0
    while i < len(raw):
        char = raw[i]
        if char == "\\":
            if i + 1 >= len(raw) or raw[i + 1] not in 'ntb"\\':
                raise ConfigError(f"line {number}: an escape this parser does not read")
            out.append({"n": "\n", "t": "\t", "b": "\b"}.get(raw[i + 1], raw[i + 1]))
            i += 2
            continue
        if char == '"':
            quoted = not quoted
        elif char in "#;" and not quoted:
            break
        else:
            out.append(char)
        i += 1
    if quoted:
        raise ConfigError(f"line {number}: an unclosed quote")
    return escape("".join(out).strip())
