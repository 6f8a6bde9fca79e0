"""The test world: real directories, real symlinks, a private HOME and data directory."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from sandbox.policy.gate import Gate, ToolCall
from sandbox.profile import Policy
from sandbox.tools.params import validate

if TYPE_CHECKING:
    from pathlib import Path

    from sandbox.policy.rules import RuleSet


@dataclass
class World:
    root: Path
    home: Path
    ws: Path
    app2: Path
    outside: Path
    scratch: Path
    data: Path

    def placeholders(self) -> dict[str, str]:
        return {
            "ws": str(self.ws),
            "home": str(self.home),
            "app2": str(self.app2),
            "outside": str(self.outside),
            "scratch": str(self.scratch),
        }

    def gate(
        self, mode: str | None = "ask", plan: bool = False, rules: RuleSet | None = None, **policy: object
    ) -> Gate:
        settings = Policy.model_validate({"mode": mode, "operating_mode": "plan" if plan else "agent", **policy})
        return Gate(self.ws, self.scratch, settings, rules, data_dir=self.data)

    def call(self, tool: str, args: dict[str, object], session: str = "s1", turn: str = "t1") -> ToolCall:
        return ToolCall(session, turn, "c1", tool, validate(tool, args))
