"""What a session is opened with, and what is settled from it before any jail exists.

:class:`SessionOptions` are the keywords ``Sandbox.open`` and ``Sandbox.create`` take; from them
come the profile with their overrides, the session's id, the plugins it declares and the
classifier; and the notices a session opens with. Apart from :mod:`sandbox.session` because
these are pure decisions on what the caller gave: each refusal comes before a scratch directory
or a jail is made, and none needs the session itself.
"""

from __future__ import annotations

import inspect
import uuid
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, TypedDict

from sandbox import plugins as plugin_tools
from sandbox import profile as profiles
from sandbox.errors import InvalidArgument
from sandbox.policy.classifier import CallbackClassifier, ChatClassifier, Classifier
from sandbox.policy.trust import TrustDecision, TrustStore, ask_trust

if TYPE_CHECKING:
    from pathlib import Path

    from sandbox.policy.approvals import Approver
    from sandbox.policy.classifier import Callback as ClassifierCallback
    from sandbox.vocabulary import (
        BackendChoice,
        MountStrategy,
        NetworkMode,
        Notice,
        OperatingMode,
        PermissionMode,
        ProjectTrust,
    )


TrustHandler = Callable[["Path"], bool | None | Awaitable[bool | None]]
"""A pre-trust handler: True or False decides the project's trust for the session; None defers."""


class SessionOptions(TypedDict, total=False):
    """How to open a session; every key may be left out.

    ``profile`` is a shipped profile's name, a TOML path or a :class:`~sandbox.profile.Profile`
    (``default`` when absent); ``backend``, ``mount`` and ``operating_mode`` override its values,
    validated as the profile's own. ``mode`` is the session's permission mode (else the profile's,
    else the user's global one, else ``ask``); ``approver`` answers confirmations (else the
    profile's unattended answer); ``trust_project`` overrides the stored trust of the workspace
    for this session; ``trust_handler`` (a pre-trust handler: an extension or a client deciding
    first) is called with the workspace when ``trust_project`` is not given, and its True or False
    decides for this session (None: the stored decision, then the profile's default, decide);
    ``session_id`` names the session (letters, digits and dashes). ``network``
    overrides the profile's mode; ``allow_hosts`` adds allowlist patterns (and implies
    ``allowlist``), as ``sandbox run --allow-host`` does; ``allow_indexes`` adds package indexes
    (``pypi``, ``npm=URL`` ...) as ``--allow-index`` does. ``plugins`` are plugin manifests
    (:mod:`sandbox.plugins`) whose directories the jail shows read-only; their tools are callable once
    registered (:meth:`Sandbox.register_plugin` asks the approver), or at once for the ids in
    ``granted_plugins`` (the user granted them up front). ``classifier`` judges the calls the
    rules leave open when ``policy.classifier`` is ``auto`` (seed 004): a
    :class:`~sandbox.policy.classifier.Classifier` or a function of a
    :class:`~sandbox.policy.classifier.ClassifyRequest` returning ``{"verdict", "reason"}``; absent,
    the profile's built-in client (``policy.classifier_endpoint``), else none (each such call is asked).
    ``from_snapshot`` starts the session from a session snapshot of the same workspace (its files,
    scratch and modes; :meth:`Sandbox.fork`), in the snapshot's line of sessions.
    """

    profile: str | profiles.Profile
    backend: BackendChoice | None
    mount: MountStrategy | None
    mode: PermissionMode | None
    operating_mode: OperatingMode | None
    network: NetworkMode | None
    allow_hosts: list[str] | None
    allow_indexes: list[str] | None
    approver: Approver | None
    session_id: str | None
    trust_project: bool | None
    trust_handler: TrustHandler | None
    plugins: list[str | Path] | None
    granted_plugins: list[str] | None
    from_snapshot: str | None
    classifier: Classifier | ClassifierCallback | None


def profile_for(options: SessionOptions) -> profiles.Profile:
    """The options' profile with their overrides, validated as the profile's own values."""
    unknown = sorted(set(options) - SessionOptions.__optional_keys__)
    if unknown:  # what Python says of a keyword no signature names
        raise TypeError(f"Sandbox.open() got an unexpected keyword argument {unknown[0]!r}")
    named = options.get("profile", "default")
    profile = named if isinstance(named, profiles.Profile) else profiles.load(named)
    hosts, index_specs = options.get("allow_hosts") or [], options.get("allow_indexes") or []
    network = options.get("network")
    asked = "allow_indexes" if index_specs else "allow_hosts" if hosts else None
    if asked and network not in (None, "allowlist"):
        raise InvalidArgument(f"{asked} needs the allowlist network, not {network!r}", network=network)
    overrides = {
        "backend": options.get("backend"),
        "mount.strategy": options.get("mount"),
        "policy.operating_mode": options.get("operating_mode"),
        "network.mode": "allowlist" if asked else network,
        "network.allow": [*profile.network.allow, *hosts] if hosts else None,
        "network.indexes": [*profile.network.indexes, *index_specs] if index_specs else None,
    }
    labels = {"network.indexes": "allow_indexes"}  # a refusal names the option, not the profile's file
    if asked and network is None:
        labels["network.mode"] = asked
    return profile.override(overrides, labels)


def session_id_for(given: str | None) -> str:
    sid = given or uuid.uuid4().hex[:16]
    if not sid.replace("-", "").isalnum():
        raise InvalidArgument(f"session id {sid!r} must be letters, digits and dashes", session_id=sid)
    return sid


def classifier_for(given: Classifier | ClassifierCallback | None, prof: profiles.Profile) -> Classifier | None:
    if isinstance(given, Classifier):
        return given
    if given is not None:
        return CallbackClassifier(given)
    return ChatClassifier.from_settings(prof.policy)


async def project_trust(
    options: SessionOptions, workspace: Path, prof: profiles.Profile, approver: Approver, session_id: str
) -> TrustDecision:
    """Whether the session loads the project's policy file, and who decided: the caller
    (``trust_project``), the pre-trust handler, the user asked (``default_project_trust = "ask"``),
    a stored decision, or the profile's default. Only the first three are fixed for the session;
    a stored decision is re-read as the store changes."""
    directory = str(workspace)  # canonical already: the session resolved it
    given = options.get("trust_project")
    if given is not None:
        return TrustDecision(directory, given, "override")
    handler = options.get("trust_handler")
    if handler is not None:
        decided = handler(workspace)
        if inspect.isawaitable(decided):
            decided = await decided
        if decided is not None:
            return TrustDecision(directory, bool(decided), "handler")
    default = prof.policy.default_project_trust
    if default == "ask":  # seed 000 §10
        timeout = float(prof.policy.approval_timeout_s)
        if await ask_trust(workspace, approver, session_id=session_id, timeout=timeout):
            return TrustDecision(directory, True, "asked")
    return TrustStore().decision(workspace, default=default == "always")


FIXED_TRUST = frozenset({"override", "handler", "asked"})
"""Trust decided for the session as it opened, whatever the store says later."""


def project_trusted(workspace: Path, override: bool | None, default: ProjectTrust) -> bool:
    """Whether the project is trusted for this session (an override, a stored decision, the default)."""
    return TrustStore().decision(workspace, override, default == "always").trusted


def declared_plugins(options: SessionOptions, workspace: Path, trusted: bool) -> list[plugin_tools.Plugin]:
    """The options' plugin manifests, loaded; a granted id must name one of them; what the project
    declares is checked (:func:`plugin_tools.check_declared`)."""
    declared = plugin_tools.load_all(options.get("plugins") or [])
    ids = {p.id for p in declared}
    granted = options.get("granted_plugins") or []
    for plugin_id in granted:
        if plugin_id not in ids:
            raise InvalidArgument(f"granted plugin {plugin_id!r} was not declared", plugin=plugin_id)
    plugin_tools.check_declared(declared, workspace, trusted=trusted, granted=granted)
    return declared


def recovered_notice(line: str) -> Notice:
    """What a session says of the work of a killed executor it kept as a changeset as it opened."""
    changeset = line.split()[0]
    return {
        "code": "changes.recovered",
        "message": f"the work of a sandbox that was killed was kept as changeset {line}: "
        f"review it with `sandbox changes show {changeset}`, apply it with `sandbox changes apply {changeset}`",
        "changeset_id": changeset,
    }
