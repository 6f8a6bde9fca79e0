"""What "allow this kind for the session" covers once the classifier has blocked a call.

A grant must be wider than the one call (else it is no grant) and narrower than the tool (else
one approved ``git status`` would allow every command). Apart from the gate, which only stamps the
kind on the decision it hands over, because it reads the command line again to name it.
"""

from __future__ import annotations

import os

from sandbox.policy.shell import Unparseable, parse

# Tools with several verbs: "allow this kind for the session" covers the verb, not the whole tool.
VERBED = frozenset({"git", "npm", "yarn", "pnpm", "bun", "cargo", "pip", "pip3", "uv", "docker", "kubectl", "gh"})


def grant_kind(tool: str, resource: str, targeted: bool) -> str:
    """For Bash the commands' names (and the verb of git, npm …); for another tool the tool and the
    directory of its target (``targeted``: the call has a path target; ``resource`` is that path)."""
    if tool != "Bash":
        where = os.path.dirname(resource) if targeted else ""
        return f"{tool}:{where}"
    try:
        script = parse(resource)
    except Unparseable:
        return f"Bash:={resource}"  # only the very same text
    names: list[str] = []
    for cmd in script.commands:
        words = [w.text for w in cmd.words]
        if not words or cmd.words[0].dynamic:
            return f"Bash:={resource}"
        name = os.path.basename(words[0])
        verb = next((w for w in words[1:] if not w.startswith("-")), None) if name in VERBED else None
        names.append(f"{name} {verb}" if verb else name)
    if script.nested:
        return f"Bash:={resource}"
    return "Bash:" + " | ".join(dict.fromkeys(names))
