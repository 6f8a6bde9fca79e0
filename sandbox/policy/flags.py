"""Flag normalisation: ``rm -fr`` = ``rm -rf`` = ``rm -r -f`` = ``rm --recursive --force``.

Short clusters split into letters; long options map to their short letter where the program
has one, so a rule or a check written one way matches every spelling.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Sequence

_LONG: dict[str, dict[str, str]] = {
    "rm": {"recursive": "r", "force": "f", "dir": "d", "interactive": "i", "verbose": "v"},
    "cp": {"recursive": "r", "force": "f", "archive": "a", "target-directory": "t"},
    "mv": {"force": "f", "target-directory": "t"},
    "chmod": {"recursive": "R"},
    "chown": {"recursive": "R"},
    "git": {"force": "f", "delete": "d", "all": "a"},
    "shred": {"remove": "u", "zero": "z", "force": "f"},
    "sort": {"output": "o"},
    "sed": {"in-place": "i"},
}
# Upper-case letters that mean the same as the lower-case one for a program.
_FOLD: dict[str, dict[str, str]] = {"rm": {"R": "r"}, "cp": {"R": "r"}}
# Short options whose value is the next word (so the value is not a positional).
_TAKES_VALUE: dict[str, str] = {
    "grep": "efmABCd",
    "egrep": "efmABC",
    "fgrep": "efmABC",
    "rg": "efgmtTABCM",
    "head": "nc",
    "tail": "nc",
    "cut": "dfcb",
    "sort": "ktSo",
    "du": "d",
    "tree": "LIPo",
    "find": "",
    "ls": "IwT",
    "git": "Cc",
    "xargs": "IinPdLsaE",
    "timeout": "sk",
    "nice": "n",
    "env": "uCS",
    "sudo": "ugUhpCrtD",
    "doas": "uC",
    "ionice": "cnp",
    "stdbuf": "ioe",
    "jq": "f",
    "wc": "",
    "diff": "xXIF",
    "tee": "",
    "cat": "",
    "nl": "bdfhilnsvw",
}


@dataclass(frozen=True, slots=True)
class Shape:
    """A simple command reduced to what rules look at."""

    name: str
    flags: frozenset[str]  # "-r", "--no-preserve-root"
    positionals: tuple[str, ...]
    values: tuple[str, ...]  # option values ("--output=x", "-o x"): may be paths too


def shape(name: str, args: Sequence[str]) -> Shape:
    flags: set[str] = set()
    positionals: list[str] = []
    values: list[str] = []
    takes = _TAKES_VALUE.get(name, "")
    index, ended = 0, False
    while index < len(args):
        arg = args[index]
        index += 1
        if ended or arg == "-" or not arg.startswith("-"):
            positionals.append(arg)
        elif arg == "--":
            ended = True
        elif arg.startswith("--"):
            flags.add(_long(name, arg, values))
        else:
            index += _short(name, arg, takes, args, index, flags, values)
    return Shape(name, frozenset(flags), tuple(positionals), tuple(values))


def _long(name: str, arg: str, values: list[str]) -> str:
    option, eq, value = arg[2:].partition("=")
    if eq:
        values.append(value)
    letter = _LONG.get(name, {}).get(option)
    return f"-{letter}" if letter else f"--{option}"


def _short(name: str, arg: str, takes: str, args: Sequence[str], index: int, flags: set[str], values: list[str]) -> int:
    """Add the letters of one ``-abc`` cluster; returns how many following words it consumed."""
    fold = _FOLD.get(name, {})
    for position, letter in enumerate(arg[1:]):
        flags.add("-" + fold.get(letter, letter))
        if letter in takes:
            rest = arg[position + 2 :]
            if rest:
                values.append(rest)
                return 0
            if index < len(args):
                values.append(args[index])
                return 1
    return 0
