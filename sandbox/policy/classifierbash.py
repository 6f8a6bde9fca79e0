"""What turning the classifier on changes for a Bash command (seed 004).

Two things, both read by the gate once ``policy.classifier`` is not ``off``: the confirm findings
the classifier takes as hints rather than prompts, and the extra exemptions its switches
(``policy.exemptions``, ``policy.trusted``) hand to the command judge. Apart from the gate because
they are the classifier's vocabulary, not the flow of a decision.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sandbox.policy import exemptions

if TYPE_CHECKING:
    from collections.abc import Sequence

    from sandbox.policy.commands import Exemption, WriteExemption

# Seed 004: the older confirm rules are hints handed to the classifier, not prompts, once it is on
# (``policy.classifier = "auto"``); so are the findings that mark a command as not knowable
# statically. A user's ask rule and a protected path stay in the ask layer: the model cannot waive them.
HINT_RULES: frozenset[str] = frozenset(
    {
        "ask.delete-system-dir",
        "ask.sudo",
        "ask.git-force-push",
        "ask.publish",
        "ask.pipe-to-shell",
        "path.external-write",  # seed 004: a write outside the project is the classifier's to judge
        "shell.dynamic-command",
        "shell.dynamic-code",
        "shell.dynamic-delete",
        "shell.too-deep",
        "parse.unparseable",
    }
)


def bash_exemptions(
    settings: Any, trusted: Sequence[str], workspace: str
) -> tuple[Exemption | None, WriteExemption | None]:
    """The classifier's extra exemptions for a command, and for a path it writes.

    ``settings`` is a ``sandbox.profile_policy.Policy``; ``trusted`` its trusted directories, resolved.
    """
    switches = settings.exemptions
    writes = exemptions.write_check(trusted, switches.in_project_writes)
    declared = exemptions.declared_dependencies if switches.declared_dependencies else None
    local = exemptions.local_git if switches.in_project_writes else None
    pushes = exemptions.trusted_push(settings.trusted.git_remotes, workspace)
    check: Exemption | None = exemptions.combine(declared, local, pushes if settings.trusted.git_remotes else None)
    return check, writes
