"""The permission layer: decides before anything runs whether a tool call is allowed,
must be confirmed, or is denied. Pure Python; independent of every backend.

``paths`` (roots, canonical resolution, protected paths) · ``shell`` (parsing) · ``commands``
(Bash rules) · ``rules`` (built-in and user rules) · ``gate`` (modes, grants, decisions) ·
``approvals`` (fail-closed asking) · ``authorize`` (both together) · ``trust`` (project files).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sandbox.policy.rules import RuleSet, RuleStore
from sandbox.policy.trust import TrustStore, project_rules

if TYPE_CHECKING:
    import os


def load_ruleset(
    settings: Any,
    workspace: str | os.PathLike[str],
    *,
    store: RuleStore | None = None,
    trust: TrustStore | None = None,
    trust_override: bool | None = None,
) -> RuleSet:
    """Profile settings + the user's rules store + the workspace's file when the project is trusted."""
    rules = RuleSet.from_settings(settings).merged((store or RuleStore()).ruleset())
    return rules.merged(project_rules(workspace, trust, trust_override))
