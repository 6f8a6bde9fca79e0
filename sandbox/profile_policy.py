"""The ``[policy]`` table of a profile: the permission layer's settings (:mod:`sandbox.policy`).

Kept apart from the tables that shape the jail (:mod:`sandbox.profile_tables`): the jail never
reads these; the gate, the classifier and the approvals do, before a call reaches it. Its
``exemptions`` and ``trusted`` tables say what runs without a model call once the classifier is on.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator, Field

from sandbox.profile_tables import EgressPattern, Table

# Run-time imports: pydantic reads the fields' types (ruff cannot see that Table is a BaseModel).
from sandbox.vocabulary import ClassifierMode, MediumRisk, OperatingMode, PermissionMode, ProjectTrust, Unattended  # noqa: TC001


class Exemptions(Table):
    """Seed 004's ``allowExceptions``: what runs without a model call once the classifier is on
    (``policy.classifier`` ``rules`` or ``auto``); with it off, the permission mode decides as before."""

    in_project_writes: bool = True  # Write, Edit (and Bash redirects) inside the workspace
    read_only_commands: bool = True  # ls, cat, git status … (the built-in exempt.read-only)
    declared_dependencies: bool = True  # npm ci, pip install -r requirements.txt, uv sync …
    read_only_web_fetch: bool = True  # a fetch tool's public http(s) URL; private addresses are judged


def _trusted_path(value: str) -> str:
    """A ``trusted.paths`` entry: a directory (``~/``, absolute, or relative to the workspace)."""
    text = value.strip()
    if not text or "\x00" in text:
        raise ValueError("a trusted path must name a directory")
    import posixpath

    home_as_root = "/~" + text[1:] if text.startswith("~") else text  # "~/.." names /home's level
    if posixpath.normpath(home_as_root) in ("/", "//", "/~"):
        raise ValueError(f"{value!r} would trust every write under / or a whole home; name a directory inside it")
    return text


class Trusted(Table):
    """Seed 004's ``trusted`` (exempt from the classifier once it is on).

    ``paths``: writes (Write, Edit, a Bash redirect) whose canonical target lies in one of these
    directories (``~/`` at the home, a relative one in the workspace; each resolved through its
    symlinks, and the target too, so a link out of a trusted directory is judged where it lands).
    The sandbox state, protected paths and the deny layer still apply, and the jail persists writes
    only in the workspace and the scratch directory: a trusted directory elsewhere cannot be written.
    ``domains``: egress patterns (``host``, ``*.host``, ``host:port``, an address or a CIDR), a
    fetch tool's URL admitted by one is exempt, and the ``allowlist`` network mode allows them too
    (:func:`sandbox.network.egress.for_profile`). ``git_remotes``: a remote's name or URL; a plain
    push to one is exempt, a forced or deleting one is still judged.
    """

    paths: tuple[Annotated[str, AfterValidator(_trusted_path)], ...] = ()
    domains: tuple[EgressPattern, ...] = ()
    git_remotes: tuple[str, ...] = ()


class Policy(Table):
    """Permission-layer settings; the policy package reads them (see sandbox/policy)."""

    mode: PermissionMode | None = None
    operating_mode: OperatingMode = "agent"
    unattended: Unattended = "deny"
    approval_timeout_s: float = Field(120, gt=0, le=3600)
    deny_read: tuple[str, ...] = ()
    deny_write: tuple[str, ...] = ()
    confirm_write: tuple[str, ...] = ()
    remove_rules: tuple[str, ...] = ()
    rules: tuple[dict[str, Any], ...] = ()
    # Seed 003 §6: a medium-risk plugin tool (low-risk network or metadata) in agent mode.
    medium_risk: MediumRisk = "confirm"
    # Seed 004's askTools: tools (built-in names or plugin tools' exposed names) always confirmed,
    # never covered by an allow-session grant nor by auto mode; a deny still wins.
    ask_tools: tuple[str, ...] = ()
    # Seed 000 §10's defaultProjectTrust: a project with a policy file and no stored decision.
    default_project_trust: ProjectTrust = "never"
    # Seed 004's classifier layer (sandbox.policy.classifier). None: the user's global setting
    # (``sandbox policy classifier``), else "off".
    classifier: ClassifierMode | None = None
    ask_on_block: bool = True  # a block is asked with the model's reason (False: refused silently)
    # Seed 003 §8: a Bash result's credentials (a private key block, a URL's password, a token of a
    # known format) are redacted before the result is returned, kept or shown (details.redacted counts them).
    redact_output: bool = True
    classifier_timeout_s: float = Field(30, gt=0, le=600)
    # The built-in client (CLI, MCP, a library session without a callable): an OpenAI-compatible
    # chat-completions endpoint, its model, and the environment variable holding its API key.
    classifier_endpoint: str | None = None
    classifier_model: str | None = None
    classifier_key_env: str | None = None
    exemptions: Exemptions = Exemptions()
    trusted: Trusted = Trusted()
