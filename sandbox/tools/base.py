"""One tool, one object: what a built-in tool is, and what it is lent by the session that runs it.

A :class:`Tool` takes an approved call (:class:`Invocation`: its validated parameters, the target
the policy approved, the root it lies in, the call's streams and abort) and runs it over the
session's jail, shaping its own result. The session (:class:`ToolHost`) only binds and dispatches:
it authorises the call, hands it to the tool named, guards the repair loop and audits. Adding a
tool is a module with its :class:`Tool` and an entry in :data:`sandbox.tools.builtin.TOOLS`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Protocol

if TYPE_CHECKING:
    from pathlib import Path

    import anyio
    from pydantic import BaseModel

    from sandbox.backends.base import Jail
    from sandbox.exec import OutputCallback
    from sandbox.review import SnapshotStore
    from sandbox.tools.run import ToolResult
    from sandbox.vocabulary import Root


@dataclass(frozen=True)
class Invocation:
    """One approved call, as its tool runs it: ``target`` is the canonical path the policy approved
    (``None`` for a command), ``root`` where it lies (workspace, scratch, outside)."""

    params: BaseModel
    target: str | None
    root: Root | None
    tool_call_id: str
    turn_id: str
    on_stdout: OutputCallback | None = None
    on_stderr: OutputCallback | None = None
    abort: anyio.Event | None = None


class ToolHost(Protocol):
    """What a session lends the tools it runs."""

    jail: Jail
    workspace: Path
    scratch: Path
    snapshots: SnapshotStore

    def readable(self, path: str) -> bool:
        """Whether a path a tool found may be shown (the policy's read rules: a secret is not)."""

    def scratch_env(self) -> dict[str, str]:
        """What a command gets beyond the scrubbed environment (the scratch directory)."""

    def shell_for(self, turn_id: str, requested: str | None) -> str:
        """The shell id a Bash call of ``turn_id`` runs in: the turn's pinned one (COMMAND_SHELL_CHANGED
        when the effective shell changed since, or ``requested`` names another)."""


class Tool(ABC):
    """A built-in tool: its name, whether its target is a path the policy resolved, and its run."""

    name: ClassVar[str]
    params: ClassVar[type[BaseModel]]  # its arguments' model (sandbox.tools.params)
    needs_target: ClassVar[bool] = True  # a file tool acts on the approved path; a command on none
    runs_commands: ClassVar[bool] = False  # its calls run the user's commands (network denials are theirs)

    @abstractmethod
    async def run(self, host: ToolHost, call: Invocation) -> ToolResult:
        """Run ``call`` over ``host``'s jail and shape its result for the model and the audit."""
