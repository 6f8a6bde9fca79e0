"""The test world: real directories, real symlinks, a private HOME and data directory."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, get_args

from pydantic import BaseModel, ConfigDict

from sandbox.policy.gate import Gate, ToolCall
from sandbox.profile_policy import Policy
from sandbox.profile_tables import Env
from sandbox.tools.params import ToolSpec, lookup, validate
from sandbox.vocabulary import PluginRisk

if TYPE_CHECKING:
    from collections.abc import Mapping
    from pathlib import Path

    from sandbox.policy.delegates import ResolvedDelegate
    from sandbox.policy.rules import RuleSet


class PluginArgs(BaseModel):
    """A demo plugin tool's arguments: anything (its manifest's schema is the plugin's business)."""

    model_config = ConfigDict(extra="allow", frozen=True)


PLUGIN_TOOLS: dict[str, ToolSpec] = {
    f"plugin_demo_{risk or 'unrated'}": ToolSpec(
        f"plugin_demo_{risk or 'unrated'}", PluginArgs, "execute", "a demo plugin tool", plugin=True, plugin_risk=risk
    )
    for risk in (*get_args(PluginRisk), None)
}


def tools(name: str) -> ToolSpec:
    """The built-ins and the demo plugin tools (a session's registry, as the gate sees it)."""
    return PLUGIN_TOOLS[name] if name in PLUGIN_TOOLS else lookup(name)


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
            "tmp": str(self.root / "tmp"),
        }

    def gate(
        self,
        mode: str | None = "ask",
        plan: bool = False,
        rules: RuleSet | None = None,
        settings_table: dict[str, object] | None = None,
        **policy: object,
    ) -> Gate:
        """``settings_table`` is more of the profile's ``[policy]`` (its own ``rules`` included)."""
        policy = {"operating_mode": "plan" if plan else "agent", **(settings_table or {}), **policy}
        settings = Policy.model_validate({"mode": mode, **policy})
        gate = Gate(self.ws, self.scratch, settings, rules, data_dir=self.data, programs=Env().workspace_path)
        gate.tools = tools
        return gate

    def call(
        self,
        tool: str,
        args: Mapping[str, object],
        session: str = "s1",
        turn: str = "t1",
        delegate: ResolvedDelegate | None = None,
    ) -> ToolCall:
        params = PLUGIN_TOOLS[tool].params.model_validate(args) if tool in PLUGIN_TOOLS else validate(tool, args)
        return ToolCall(session, turn, "c1", tool, params, delegate)
