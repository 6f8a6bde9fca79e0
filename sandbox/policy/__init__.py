"""The permission layer: decides before anything runs whether a tool call is allowed,
must be confirmed, or is denied. Pure Python; independent of every backend.

``paths`` (roots, canonical resolution, protected paths) · ``shell`` (parsing) · ``commands``
(Bash rules) · ``rules`` (built-in and user rules) · ``gate`` (modes, grants, decisions) ·
``approvals`` (fail-closed asking) · ``authorize`` (both together) · ``trust`` (project files).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from sandbox.policy.liverules import LiveRules
from sandbox.policy.rules import RuleSet, RuleStore
from sandbox.policy.trust import PROJECT_POLICY, TrustStore, project_rules

if TYPE_CHECKING:
    import os

    from sandbox.vocabulary import PermissionMode, ProjectTrust


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
    default: ProjectTrust = getattr(settings, "default_project_trust", "never")
    return rules.merged(project_rules(workspace, trust, trust_override, default))


def live_rules(
    settings: Any,
    workspace: str | os.PathLike[str],
    *,
    store: RuleStore | None = None,
    trust: TrustStore | None = None,
    trust_override: bool | None = None,
) -> LiveRules:
    """:func:`load_ruleset` and the user's global mode, re-read by a session's gate whenever the
    rules store, the trust store or the project's policy file changes."""
    store, trust = store or RuleStore(), trust or TrustStore()

    def load() -> tuple[RuleSet, PermissionMode | None]:
        rules = load_ruleset(settings, workspace, store=store, trust=trust, trust_override=trust_override)
        return rules, store.mode()

    return LiveRules(load, (store.path, trust.path, Path(workspace) / PROJECT_POLICY))
