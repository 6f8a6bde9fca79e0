"""Delegates (seed 003 §10.2): a bounded file/search/shell worker calling tools for its session.

A delegate's tools are its definition's, never its session's, drawn only from
:data:`DELEGATE_TOOLS` (the seed's Read, Glob, Grep, Bash, Edit, Write, plus LS, this sandbox's
extra read tool; BrowserPreview is not an executor tool). None declared: the read tools; ``"*"``:
all of them; an unknown name (a plugin tool included) is dropped with a warning.

A builtin or user definition may declare a permission; the issue makes it a narrowing only: the
call is decided under the narrower of the declared mode and the session's effective mode
(``ask`` < ``accept-edits`` < ``auto``), so a delegate is never wider than its owner's session. A
project definition's declaration is dropped with a warning: it arrived with the repository.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from sandbox.vocabulary import DelegatePermission, DelegateSource, PermissionMode

DELEGATE_TOOLS: tuple[str, ...] = ("Read", "Glob", "Grep", "LS", "Bash", "Edit", "Write")
DEFAULT_TOOLS: tuple[str, ...] = ("Read", "Glob", "Grep", "LS")
_WIDTH: dict[PermissionMode, int] = {"ask": 0, "accept-edits": 1, "auto": 2}


class Delegate(BaseModel):
    """A delegate as ``tool.call`` names it (its definition's name, source, tools and permission)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, max_length=200)
    source: DelegateSource
    tools: list[str] | Literal["*"] | None = None
    permission: DelegatePermission = "inherit"

    def resolve(self) -> ResolvedDelegate:
        warnings: list[str] = []
        if self.tools is None:
            tools = DEFAULT_TOOLS
        elif self.tools == "*":
            tools = DELEGATE_TOOLS
        else:
            tools = tuple(dict.fromkeys(name for name in self.tools if name in DELEGATE_TOOLS))
            warnings += [
                f"delegate {self.name}: tool {name!r} dropped: a delegate may call only {', '.join(DELEGATE_TOOLS)}"
                for name in dict.fromkeys(self.tools)
                if name not in DELEGATE_TOOLS
            ]
        permission: PermissionMode | None = None if self.permission == "inherit" else self.permission
        if permission is not None and self.source == "project":
            warnings.append(
                f"delegate {self.name}: its permission {permission!r} was dropped: a project-defined delegate "
                "cannot declare one; it runs under the session's mode"
            )
            permission = None
        return ResolvedDelegate(self.name, self.source, frozenset(tools), permission, tuple(warnings))


@dataclass(frozen=True, slots=True)
class ResolvedDelegate:
    name: str
    source: DelegateSource
    tools: frozenset[str]
    permission: PermissionMode | None  # None: the session's effective mode
    warnings: tuple[str, ...] = ()

    def mode(self, session_mode: PermissionMode) -> PermissionMode:
        """The mode a call of this delegate is decided under: never wider than the session's."""
        if self.permission is None:
            return session_mode
        return min(self.permission, session_mode, key=_WIDTH.__getitem__)

    def allows(self, tool: str) -> bool:
        return tool in self.tools

    def listing(self) -> str:
        return ", ".join(name for name in DELEGATE_TOOLS if name in self.tools) or "none"
