"""Where a file tool's call lands, and which of the user's path rules decides it.

Apart from the gate because it is about paths and patterns, not modes or grants: the directory a
Glob pattern starts in (the path it is judged by), and the strongest path rule matching a target.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sandbox.policy.paths import ResolvedPath
    from sandbox.policy.rules import CompiledRule
    from sandbox.vocabulary import Level, RuleAction

GLOB_CHARS = frozenset("*?[{")
RULE_LEVEL: dict[RuleAction, Level] = {"allow": "allow", "block": "deny", "ask": "confirm"}


def glob_base(pattern: str, path: str | None) -> str:
    """The fixed leading components of a glob: ``../../etc/*.conf`` searches ``../../etc``."""
    parts = pattern.split("/")
    fixed: list[str] = []
    for part in parts[:-1]:
        if GLOB_CHARS & set(part):
            break
        fixed.append(part)
    prefix = "/".join(fixed) if fixed != [""] else "/"
    if pattern.startswith("/") or pattern.startswith("~"):
        return prefix or "/"
    return os.path.join(path or ".", prefix) if prefix else (path or ".")


def first_rule(rules: list[CompiledRule], tool: str, target: ResolvedPath) -> CompiledRule | None:
    """The path rule for ``tool`` matching ``target`` (as resolved or as written): block, then ask, then allow."""
    order = {"block": 0, "ask": 1, "allow": 2}
    matching = [
        r
        for r in rules
        if r.rule.tool in (tool, "*")
        and r.paths is not None
        and (r.paths.matches(target.canonical) or r.paths.matches(target.lexical))
    ]
    return min(matching, key=lambda r: order[r.rule.action]) if matching else None
