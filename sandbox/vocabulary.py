"""The product's words, declared once.

Every name a user, a profile, the CLI, the JSON-RPC schema or an audit row can carry is one of
the ``Literal`` types below. Everything else derives from them: argparse ``choices`` and the
tuples the code iterates (``typing.get_args``), the pydantic models of profiles and of the
server (so ``sandbox serve --schema`` emits enums), and the pi client's list of error codes,
which a test checks against :data:`ErrorCode`.

Standard library only: the CLI's quick path imports this module.
"""

from __future__ import annotations

import sys
from typing import Literal, NotRequired, TypedDict, get_args

EXIT_SANDBOX = 125
"""The exit status of ``sandbox run``/``compare``/``tool`` when the sandbox itself refused or
failed (as ``docker run`` and ``env`` use 125), so it never passes for the command's own."""

# -- errors ---------------------------------------------------------------------------------
ErrorCode = Literal[
    "INVALID_ARGUMENT",
    "TOOL_DENIED",
    "TOOL_FAILED",
    "TIMEOUT",
    "ABORTED",
    "SHELL_NOT_FOUND",
    "BACKEND_UNAVAILABLE",
    "GUARANTEE_UNAVAILABLE",
    "CONFLICT",
    "PLUGIN_DISABLED_IN_PLAN",
    "COMMAND_SHELL_CHANGED",
    "COMMAND_SHELL_INVALID",
]

# -- backends and what they enforce -----------------------------------------------------------
BackendName = Literal["bwrap", "docker", "landlock", "microvm", "host", "winjob", "fake"]
"""Every loadable backend. ``fake`` is the scripted one shipped for protocol tests: loadable by
name (``session.open``), never chosen by ``auto``, not offered by the CLI nor listed by ``check``."""
BackendChoice = Literal["auto", BackendName]
"""A backend as a profile or a call names it: ``auto`` picks bwrap, then docker, never host."""
MountStrategy = Literal["ro", "rw", "copy", "overlay"]
NetworkMode = Literal["none", "allowlist", "host"]
"""``allowlist``: the jail keeps no network of its own and reaches named hosts through the filtering proxy."""
DenialReason = Literal[
    "not-allowed",
    "denied",
    "private-address",
    "sni-mismatch",
    "host-mismatch",
    "bad-request",
    "resolve-failed",
    "connect-failed",
    "upstream-failed",
    "ask-denied",
    "ask-timeout",
    "ask-unavailable",
    "over-limit",
    "request-refused",
    "secret-misplaced",
    "certificate-invalid",
]
"""Why a connection was refused; stable codes, shown to users and recorded in the audit.

``not-allowed``: no rule names the destination; ``denied``: a deny rule does; ``private-address``:
the name resolves to a loopback, private, link-local, metadata, multicast or reserved address
not allowed explicitly; ``sni-mismatch``: the TLS ClientHello names another host than the tunnel;
``host-mismatch``: an HTTP request's Host header disagrees with its URI; ``bad-request``: not a
request the proxy understands; ``resolve-failed``, ``connect-failed``, ``upstream-failed``: the
name did not resolve, no checked address accepted the connection, the upstream proxy refused;
``ask-denied``, ``ask-timeout``, ``ask-unavailable``: the approver said no, did not answer in
time, or there was none (or it failed); ``over-limit``: the session's proxy already held as many
connections (or unfinished requests) as it takes at once; ``request-refused``: on a host whose TLS
the proxy terminates, no request rule allows the request's method and path (or the git push's
repository or refs); ``secret-misplaced``: a secret's placeholder was sent where the secret is not
substituted (another host, the URL, the body, an undeclared header); ``certificate-invalid``: the
real server of a terminated host failed the proxy's certificate check."""
VerdictReason = Literal["allowed", DenialReason]
EgressRuleKind = Literal["name", "subdomains", "address"]
ProxyProtocol = Literal["connect", "http", "socks5", "transparent-http", "transparent-tls"]
Lifecycle = Literal["session", "call"]
Guarantee = Literal[
    "fs-readonly-root",
    "fs-write-confined",
    "fs-hidden-home",
    "net-none",
    "net-confined",
    "net-allowlist",
    "net-transparent",
    "tree-kill",
    "memory-limit",
    "pids-limit",
    "cpu-limit",
    "fsize-limit",
    "tmp-size-limit",
    "no-new-privs",
    "non-root",
    "no-caps",
    "env-scrubbed",
    "new-session",
    "seccomp",
    "overlay",
    "kernel-isolated",
]
GUARANTEE_DESCRIPTIONS: dict[Guarantee, str] = {
    "fs-readonly-root": "system directories are mounted read-only",
    "fs-write-confined": "writes land only in the workspace (per mount strategy) and a private /tmp",
    "fs-hidden-home": "home directories, /root, /var/run and host secrets are absent",
    "net-none": "no network but a private loopback",
    "net-confined": "no network but a private loopback, or only the hosts an allowlist names (network.mode "
    "none or allowlist, never host)",
    "net-transparent": "network.transparent: programs that ignore the proxy variables are filtered too (a veth "
    "pair whose TCP 80/443 and DNS lead only to the proxy and a filtering DNS server; all else dropped)",
    "net-allowlist": "network.mode = allowlist: no route out but the host-side filtering proxy, which lets "
    "through only the allowed hosts (checked by name and address, never TLS-intercepted)",
    "tree-kill": "every process a call starts is killed on timeout, abort or close (pid namespace)",
    "memory-limit": "the call's memory use is capped as a whole (cgroup)",
    "pids-limit": "the call's number of processes is capped as a whole (cgroup, or RLIMIT_NPROC in its user namespace)",
    "cpu-limit": "CPU time (rlimit) and CPU share (cgroup quota) are capped",
    "fsize-limit": "the size of a written file is capped (rlimit)",
    "tmp-size-limit": "/tmp is a tmpfs of bounded size",
    "no-new-privs": "setuid binaries cannot raise privileges (PR_SET_NO_NEW_PRIVS)",
    "non-root": "commands run as a non-root uid",
    "no-caps": "commands hold no capabilities",
    "env-scrubbed": "only allowlisted environment variables reach the command",
    "new-session": "a new session: no TIOCSTI into the caller's terminal",
    "seccomp": "a seccomp filter restricts system calls",
    "overlay": "an overlay (copy-on-write) mount of the workspace is possible",
    "kernel-isolated": "commands do not make system calls to the host's kernel: a guest kernel of their own "
    "(a microVM) or a user-space kernel (gVisor's Sentry) serves them",
}
Stream = Literal["stdout", "stderr"]
LimitScope = Literal["call", "process", ""]
"""Over what one limit is enforced: each call as a whole, or each process; ``""`` where nothing
enforces it on this host."""

# -- the permission layer ---------------------------------------------------------------------
PermissionMode = Literal["ask", "accept-edits", "auto"]
OperatingMode = Literal["agent", "plan", "goal"]
"""Seed 003 §10: ``plan`` and ``goal`` are the contract modes; both hard-deny Write, Edit and plugin tools."""
PluginRisk = Literal["low", "medium", "high"]
"""A plugin tool's registered risk (seed 003 §6, §11): low is allowed like a read, medium is decided by
``policy.medium_risk``, high by the permission mode like Bash; a missing or invalid risk is medium."""
MediumRisk = Literal["confirm", "allow"]
"""How a medium-risk tool (low-risk network or metadata) is decided in agent mode (``policy.medium_risk``)."""
ProjectTrust = Literal["never", "always", "ask"]
"""Seed 000 §10's ``defaultProjectTrust``: what an untrusted, undecided project with a policy file gets."""
DelegateSource = Literal["builtin", "user", "project"]
"""Where a delegate's definition comes from (seed 003 §10.2); a project's cannot declare a permission."""
DelegatePermission = Literal["inherit", PermissionMode]
Unattended = Literal["deny", "allow"]
Level = Literal["allow", "confirm", "deny"]
"""What the policy says of a call before anyone is asked."""
Layer = Literal["exempt", "mode", "ask", "deny"]
ClassifierMode = Literal["off", "rules", "auto"]
"""Seed 004's ``mode`` (``policy.classifier``, ``sandbox policy classifier``): what decides the calls the
deterministic layers leave open. ``off``: the permission mode (as before the classifier existed);
``rules``: rules only, what no rule decides runs; ``auto``: a model judges it (allow runs, block asks)."""
ClassifierVerdict = Literal["allow", "block", "failed"]
"""What the classifier said of a call; ``failed``: no classifier, an error, a timeout or a malformed
answer, which never allows (the call is asked, or refused where nobody can be asked)."""
RuleAction = Literal["allow", "block", "ask"]
Answer = Literal["allow-once", "allow-session", "deny"]
Decision = Literal["allow", "allow-once", "allow-session", "deny"]
"""The final word on a call, as the audit records it."""
GateDecidedBy = Literal["rule", "mode", "grant", "turn-denial", "classifier"]
ApprovalDecidedBy = Literal["user", "client", "unattended", "timeout", "error", "disconnected", "cancelled", "invalid"]
"""``client``: the client program answered for the user, faster than anyone could read the question
(``codex exec`` declines every elicitation, Claude Code's ``-p`` dismisses it): no one was asked."""
DecidedBy = Literal[GateDecidedBy, ApprovalDecidedBy]
Risk = Literal["read", "write", "execute"]
Operation = Literal["read", "write", "execute", "connect", "register"]
"""``connect``: a jail's connection to a host no network rule names (``network.ask``); ``register``: a
plugin's tools registered in a session (seed 003 §11: the user grants ``agent.tool.register``)."""
Root = Literal["workspace", "scratch", "external"]
Escape = Literal["absolute", "parent", "symlink", "home"]
"""How a path left the session roots."""
External = Literal[Escape, "command", "none"]
"""What the audit says of a call that reached outside the roots: the path's escape, ``command``
for a Bash command that names an outside path, ``none`` when it stayed inside."""

# -- changesets and review snapshots ----------------------------------------------------------
ChangeStatus = Literal["added", "modified", "deleted"]
EntryKind = Literal["file", "dir", "symlink", "special"]
CacheMode = Literal["off", "project"]
"""``[mount] environment_cache`` and ``download_cache``: none, or one per project (:mod:`sandbox.mounts.envdirs`,
:mod:`sandbox.downloads`)."""
ChangesetState = Literal["kept", "partial", "applied"]
"""A kept changeset (:mod:`sandbox.changes`): nothing applied yet, some entries applied (others
held back or refused), every applicable entry applied."""
ChangesetSource = Literal["run", "session", "recovered"]
"""What kept a changeset: ``sandbox run``, a server session's copy mount, or ``recovered`` from the
private copy of an executor that was killed (``sandbox gc``, or the next session to open)."""
NoticeCode = Literal[
    "policy.project-ignored",
    "changes.recovered",
    "changes.private-copy",
    "changes.waiting",
    "mode.bash-may-write",
    "backend.fallback",
]
"""What a session says as it opens (``session.open``'s ``notices``, MCP log messages and the first
result's trailer): the project's policy file ignored (not trusted), a killed executor's work kept as
a changeset, this session's writes going to a private copy, kept changesets of the workspace waiting
for review; and, as it opens or changes mode, that plan or goal under ``auto`` still lets Bash
change files unasked (seed 003: the UI must make that trade-off visible); ``backend.fallback``: the
``auto`` backend is Landlock, because bubblewrap (and Docker) cannot run here."""


class Notice(TypedDict):
    """One thing a session says as it opens: its code, the words, and what it is about."""

    code: NoticeCode
    message: str
    file: NotRequired[str]  # policy.project-ignored: the ignored file
    changeset_id: NotRequired[str]  # changes.recovered: the changeset kept


ReviewOperation = Literal["write", "edit", "delete"]
"""The tool call a review snapshot was kept for (Write or Edit, in the workspace); ``delete``, a
deletion, is modelled for seed 003 §4c's records but no tool makes one yet."""
SnapshotState = Literal["active", "rolledBack"]

ERROR_CODES: tuple[ErrorCode, ...] = get_args(ErrorCode)
# The real ones: offered, checked.
BACKENDS: tuple[BackendName, ...] = ("bwrap", "docker", "landlock", "microvm", "host", "winjob")
# host is never chosen by auto; winjob (Windows job objects) only on Windows, where it is the one
# (elsewhere `sandbox check` lists it as unavailable, with the reason); landlock last, where
# namespaces cannot be had (it shares more of the host: see sandbox.backends.landlock).
AUTO_ORDER: tuple[BackendName, ...] = ("winjob",) if sys.platform == "win32" else ("bwrap", "docker", "landlock")
MOUNT_STRATEGIES: tuple[MountStrategy, ...] = get_args(MountStrategy)
PERMISSION_MODES: tuple[PermissionMode, ...] = get_args(PermissionMode)
OPERATING_MODES: tuple[OperatingMode, ...] = get_args(OperatingMode)
CLASSIFIER_MODES: tuple[ClassifierMode, ...] = get_args(ClassifierMode)
