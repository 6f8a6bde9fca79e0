"""Commands that run another command: wrappers (sudo, env, timeout, xargs …), shells, interpreters.

The command judge (:mod:`sandbox.policy.commands`) never judges a wrapper by its own name: it
unwraps it and judges the command inside, so ``sudo rm -rf /`` is ``rm -rf /`` (and asked for the
sudo). These tables say which names run something else and how many words to skip to find it;
they are apart because they are a vocabulary of programs, not a judgement.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Sequence

    from sandbox.policy.shell import Word

SHELLS = frozenset({"bash", "sh", "zsh", "dash", "ksh", "ash", "mksh", "fish", "csh", "tcsh", "rbash"})
INTERPRETERS = frozenset(
    {
        "python",
        "python2",
        "python3",
        "perl",
        "ruby",
        "node",
        "nodejs",
        "php",
        "lua",
        "deno",
        "bun",
        "tclsh",
        "osascript",
        "pwsh",
        "powershell",
    }
)
ESCALATION = frozenset({"sudo", "doas", "su", "pkexec", "run0"})
# Wrappers that run their operand as a command: name -> positionals to skip before it.
WRAPPERS: dict[str, int] = {
    "env": 0,
    "nice": 0,
    "ionice": 0,
    "timeout": 1,
    "nohup": 0,
    "stdbuf": 0,
    "time": 0,
    "setsid": 0,
    "command": 0,
    "builtin": 0,
    "exec": 0,
    "xargs": 0,
    "chrt": 1,
    "taskset": 1,
    "flock": 1,
    "busybox": 0,
    "sudo": 0,
    "doas": 0,
    "pkexec": 0,
    "run0": 0,
    "unbuffer": 0,
    "watch": 0,
    "strace": 0,
    "ltrace": 0,
    "chroot": 1,
    "firejail": 0,
    "caffeinate": 0,
    "script": 0,
    "torsocks": 0,
    "proxychains": 0,
}

# Wrappers' short options whose value is the next word.
WRAPPER_OPTIONS: dict[str, str] = {
    "sudo": "ugUhpCrtD",
    "doas": "uC",
    "env": "uCS",
    "nice": "n",
    "ionice": "cnp",
    "timeout": "sk",
    "stdbuf": "ioe",
    "xargs": "IinPdLsaE",
    "flock": "wE",
    "exec": "a",
    "watch": "nd",
    "strace": "oepsu",
}


def unwrap(name: str, args: list[Word]) -> tuple[list[str], list[Word]]:
    """The assignments ``env`` makes, and the inner command of a wrapper: its options, assignments
    and fixed operands skipped."""
    takes = WRAPPER_OPTIONS.get(name, "")
    assignments: list[str] = []
    index = 0
    while index < len(args):
        text = args[index].text
        if text == "--":
            index += 1
            break
        if name == "env" and "=" in text and not text.startswith("-"):
            assignments.append(text)
        elif not text.startswith("-") or text == "-":
            break
        elif len(text) == 2 and text[1] in takes:
            index += 1
        index += 1
    skip = WRAPPERS[name]
    return assignments, args[index + skip :]


def program_reader(words: Sequence[Word]) -> str | None:
    """The shell or interpreter ``words`` run (behind sudo, env …) when it reads its program from
    standard input: fed by a pipeline, it runs the data as code."""
    words = list(words)
    while words and os.path.basename(words[0].text) in ESCALATION | {"env", "command", "exec"}:
        words = [w for w in words[1:] if not w.text.startswith("-")]
    if not words:
        return None
    name = os.path.basename(words[0].text)
    args = [w.text for w in words[1:]]
    program_from_stdin = not [a for a in args if not a.startswith("-")] or "-" in args or "-s" in args
    return name if name in SHELLS | INTERPRETERS and program_from_stdin and "-c" not in args else None
