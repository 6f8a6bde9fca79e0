"""The end of a repair loop (seed 003 §4d): failed mutations counted per turn, and the note they get.

The second failed Edit of one path in a turn, or the second failed shell patch command
(``apply_patch``, ``git apply``, ``patch``), ends the loop: the result says so in its text and
carries ``terminate`` with ``mutationFailureKind`` and ``mutationFailureAttempt``. Apart from
:mod:`sandbox.session` because it only reads a call's outcome after the fact: it decides nothing
about the call and runs nothing.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from typing import TYPE_CHECKING, Literal

from sandbox.policy import shell
from sandbox.tools import params as tool_params

if TYPE_CHECKING:
    from sandbox.policy.authorize import Authorization
    from sandbox.policy.gate import ToolCall
    from sandbox.tools.run import ToolResult

MutationKind = Literal["edit", "patch"]
MUTATION_ATTEMPTS = 2  # the failed attempt in a turn that ends the repair loop (seed 003 §4d)
_TURNS_KEPT = 64  # turns whose failures are remembered when nobody ends them
_PATCH_TOOLS = frozenset({"patch", "apply_patch"})
_WRAPPERS = frozenset({"sudo", "doas", "env", "command", "exec", "time", "nice", "nohup"})
# Only for a command the shell parser cannot read (bashlex reads no quoted here-document, the usual
# form of apply_patch): its first line, before any here-document body.
_PATCH_LINE = re.compile(r"(?:^|[;&|(]|\bsudo)\s*(?:apply_patch|patch|git(?:\s+-[Cc]\s*\S+)*\s+apply)(?:\s|$)")


def is_patch_command(command: str) -> bool:
    """Whether a Bash command runs ``apply_patch``, ``git apply`` or ``patch``."""
    try:
        simples = shell.parse(command).commands
    except shell.Unparseable:
        return _PATCH_LINE.search(command.split("\n", 1)[0]) is not None
    return any(_runs_patch([word.text for word in simple.words]) for simple in simples)


def _runs_patch(words: list[str]) -> bool:
    index = 0  # past wrappers, their options and env's assignments
    while index < len(words) and (
        os.path.basename(words[index]) in _WRAPPERS or words[index].startswith("-") or "=" in words[index]
    ):
        index += 1
    if index == len(words):
        return False
    name, args = os.path.basename(words[index]), words[index + 1 :]
    if name in _PATCH_TOOLS:
        return True
    index = 0  # past git's global options: -C DIR, -c NAME=VALUE, --no-pager …
    while index < len(args) and args[index].startswith("-"):
        index += 2 if args[index] in ("-C", "-c") else 1
    return name == "git" and args[index : index + 1] == ["apply"]


class MutationGuard:
    """A session's failed mutations, counted per turn: Edits per path, shell patch commands together."""

    def __init__(self) -> None:
        self._turns: dict[str, Counter[tuple[MutationKind, str]]] = {}

    def failed(self, turn_id: str, kind: MutationKind, key: str) -> int:
        """Count one failure; the attempt it is (1 for the first of its kind and key in the turn)."""
        counts = self._turns.setdefault(turn_id, Counter())
        counts[kind, key] += 1
        if len(self._turns) > _TURNS_KEPT:  # a client that never ends its turns
            del self._turns[next(iter(self._turns))]
        return counts[kind, key]

    def end_turn(self, turn_id: str) -> None:
        self._turns.pop(turn_id, None)

    def guard(self, call: ToolCall, auth: Authorization, result: ToolResult) -> None:
        """Seed 003 §4d: the second failed Edit of a path in a turn, or the second failed shell patch
        command, ends the repair loop: the result says so and carries ``terminate``."""
        failure = _mutation_failure(call, auth, result)
        if failure is None:
            return
        attempt = self.failed(call.turn_id, *failure)
        terminate = attempt >= MUTATION_ATTEMPTS
        result.details.update(mutationFailureKind=failure[0], mutationFailureAttempt=attempt, terminate=terminate)
        result.content += "\n" + _mutation_note(*failure, attempt)


def _mutation_failure(call: ToolCall, auth: Authorization, result: ToolResult) -> tuple[MutationKind, str] | None:
    """What a failed call counts against: an Edit its path, a patch command all of them; else None.

    Only a tool that ran and failed counts: a refusal, a timeout or an abort is no failed edit."""
    if result.ok or not auth.allowed or result.error_code != "TOOL_FAILED":
        return None
    if call.name == "Edit" and auth.decision.target is not None:
        return "edit", auth.decision.target.canonical
    if isinstance(call.params, tool_params.BashParams) and is_patch_command(call.params.command):
        return "patch", ""
    return None


def _mutation_note(kind: MutationKind, path: str, attempt: int) -> str:
    what, target = (f"Edit of {path}", "the file") if kind == "edit" else ("patch command", "the target files")
    if attempt < MUTATION_ATTEMPTS:
        return (
            f"[a failed {what}: Read {target} once more and regenerate the change; "
            "a second failure in this turn stops the attempt]"
        )
    what = "a patch command (apply_patch, git apply or patch)" if kind == "patch" else f"the {what}"
    return (
        f"[stop: {what} failed again in this turn (failure {attempt}). Do not retry it, nor hand-edit the change: "
        f"Read {target} again before any other change, or stop and ask the user, saying exactly what did not match]"
    )
