"""Project trust: a workspace's own policy file loads only when the user trusts that directory.

Decisions are stored per canonical directory; the nearest ancestor with a decision applies; a
one-run override (``--trust-project`` / ``--no-trust-project``) beats both. Where neither
decides, the profile's ``policy.default_project_trust`` does (seed 000 §10's
``defaultProjectTrust``): ``never`` (the default) ignores the file, ``always`` loads it, ``ask``
puts the question to the session's approver when it opens (:func:`ask_trust`); only a user's yes
trusts, for that session alone, and nothing is stored (``sandbox trust DIR`` stores it). A project file can
add rules and protected paths, never change the mode, the unattended answer or the approval
timeout: cloning a repository must not grant it a permission upgrade. Trust never widens what
the OS boundary allows; it only decides whether the file is read.
"""

from __future__ import annotations

import json
import os
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sandbox import datadir
from sandbox.errors import InvalidArgument
from sandbox.policy.approvals import ApprovalRequest, Approver, decide
from sandbox.policy.rules import BUILTIN_IDS, RuleSet, parse_rules

if TYPE_CHECKING:
    from sandbox.vocabulary import Notice, ProjectTrust

PROJECT_POLICY = Path(".sandbox") / "policy.toml"
_PROJECT_KEYS = frozenset({"rules", "deny_read", "deny_write", "confirm_write", "remove_rules"})


@dataclass(frozen=True, slots=True)
class TrustDecision:
    directory: str
    trusted: bool
    source: str  # "override" | "handler" | "asked" | the directory whose stored decision applied | "default"

    def explain(self, default: ProjectTrust) -> dict[str, Any]:
        """The decision and where it came from, as ``sandbox policy show``, ``sandbox trust --show``
        and a session's ``trust`` say it (``default``: the profile's ``default_project_trust``)."""
        if self.source == "override":
            why = "decided for this session by its caller (trust_project)"
        elif self.source == "handler":
            why = "decided for this session by its pre-trust handler"
        elif self.source == "asked":
            why = "the user allowed it for this session when asked"
        elif self.source == "default":
            asked = " (a session asks when it opens)" if default == "ask" else ""
            why = f"no stored decision: the profile's default_project_trust = {default}{asked}"
        else:
            why = f"the stored decision for {self.source}"
        return {
            "directory": self.directory,
            "trusted": self.trusted,
            "trusted_word": "trusted" if self.trusted else "untrusted",
            "source": self.source,
            "why": why,
        }


class TrustStore:
    def __init__(self, path: Path | None = None) -> None:
        self.path = path or datadir.subdir("policy") / "trust.json"

    def _load(self) -> dict[str, dict[str, Any]]:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            raise InvalidArgument(f"cannot read the trust store {self.path}: {exc}", file=str(self.path)) from exc
        return data if isinstance(data, dict) else {}

    def set(self, directory: str | os.PathLike[str], trusted: bool) -> str:
        canonical = os.path.realpath(directory)
        if not os.path.isdir(canonical):
            raise InvalidArgument(f"not a directory: {directory}", path=str(directory))
        data = self._load()
        data[canonical] = {"trusted": trusted, "at": time.time()}
        datadir.atomic_write(self.path, json.dumps(data, indent=2, sort_keys=True) + "\n")
        return canonical

    def entries(self) -> dict[str, bool]:
        return {path: bool(entry.get("trusted")) for path, entry in sorted(self._load().items())}

    def decision(
        self, directory: str | os.PathLike[str], override: bool | None = None, default: bool = False
    ) -> TrustDecision:
        """The override, else the nearest stored decision, else ``default`` (source ``"default"``)."""
        canonical = os.path.realpath(directory)
        if override is not None:
            return TrustDecision(canonical, override, "override")
        entries = self.entries()
        current = canonical
        while True:
            if current in entries:
                return TrustDecision(canonical, entries[current], current)
            parent = os.path.dirname(current)
            if parent == current:
                return TrustDecision(canonical, default, "default")
            current = parent


def project_rules(
    workspace: str | os.PathLike[str],
    store: TrustStore | None = None,
    override: bool | None = None,
    default: ProjectTrust = "never",
) -> RuleSet:
    """The workspace's policy file as a RuleSet, or an empty one with a notice saying why not.

    ``default`` is the profile's ``default_project_trust``; ``ask`` counts as ``never`` here: its
    question was put when the session opened, and a yes arrives as ``override``."""
    path = Path(os.path.realpath(workspace)) / PROJECT_POLICY
    if not path.is_file():
        return RuleSet()
    decision = (store or TrustStore()).decision(workspace, override, default == "always")
    if not decision.trusted:
        return RuleSet(notices=(ignored_message(path, decision.directory),))
    return _load_project(path)


def ignored_message(path: Path, directory: str) -> str:
    return f"ignored {path}: the project is not trusted (run `sandbox trust {directory}` to load it)"


def ignored_notice(
    workspace: str | os.PathLike[str],
    store: TrustStore | None = None,
    override: bool | None = None,
    default: ProjectTrust = "never",
) -> Notice | None:
    """What a session says when the workspace's policy file is ignored because the project is not
    trusted (``session.open``'s ``notices``): ``{code, message, file}``; None when it is not."""
    path = Path(os.path.realpath(workspace)) / PROJECT_POLICY
    if not path.is_file():
        return None
    decision = (store or TrustStore()).decision(workspace, override, default == "always")
    if decision.trusted:
        return None
    return {"code": "policy.project-ignored", "message": ignored_message(path, decision.directory), "file": str(path)}


async def ask_trust(
    workspace: str | os.PathLike[str],
    approver: Approver,
    *,
    session_id: str,
    timeout: float,
    store: TrustStore | None = None,
) -> bool | None:
    """``default_project_trust = "ask"``: put the question to the session's approver when the
    workspace has a policy file and no stored decision. True when a user allowed it (for this
    session only: nothing is stored); None otherwise, so the file stays ignored (no one to ask,
    unattended, a timeout, a refusal)."""
    request = trust_question(workspace, session_id, store)
    if request is None or approver.who != "user":  # unattended: no one decides, the project stays untrusted
        return None
    outcome = await decide(approver, request, timeout)
    return True if outcome.allowed and outcome.decided_by == "user" else None


def trust_question(
    workspace: str | os.PathLike[str], session_id: str, store: TrustStore | None = None
) -> ApprovalRequest | None:
    """The question :func:`ask_trust` puts; None when there is nothing to ask (no policy file, or
    a stored decision applies)."""
    directory = os.path.realpath(workspace)
    path = Path(directory) / PROJECT_POLICY
    if not path.is_file() or (store or TrustStore()).decision(workspace).source != "default":
        return None
    return ApprovalRequest(
        session_id=session_id,
        turn_id="",
        tool_call_id="",
        tool="ProjectTrust",
        operation="read",
        resource=str(path),
        reason=f"the project {directory} has a policy file and no trust decision: load its rules for this session? "
        f"(`sandbox trust {directory}` remembers a yes)",
        rule_id="trust.ask",
        root="workspace",
        allow_session=True,
    )


def _load_project(path: Path) -> RuleSet:
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise InvalidArgument(f"invalid project policy {path}: {exc}", file=str(path)) from exc
    section = data.get("policy", data)
    notices = [
        f"ignored key {key!r} in {path}: a project cannot set it" for key in sorted(set(section) - _PROJECT_KEYS)
    ]
    removed = [rid for rid in section.get("remove_rules", ()) if rid in BUILTIN_IDS and not rid.startswith("deny.")]
    notices += [
        f"ignored remove_rules entry {rid!r} in {path}: a project cannot remove it"
        for rid in section.get("remove_rules", ())
        if rid not in removed
    ]
    return RuleSet(
        user=tuple(parse_rules(section.get("rules", ()), str(path))),
        removed=frozenset(removed),
        deny_read=tuple(section.get("deny_read", ())),
        deny_write=tuple(section.get("deny_write", ())),
        confirm_write=tuple(section.get("confirm_write", ())),
        notices=tuple(notices),
    )
