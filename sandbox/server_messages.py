"""The messages of ``sandbox serve``'s protocol: what each method takes, and what the server and
the client send each other besides (an approval's answer, a tool's output), as pydantic models.

Apart from :mod:`sandbox.server`, which registers a handler for each method with its model here:
these are the wire's vocabulary, validated before a handler runs and listed by ``sandbox serve
--schema`` (each model's name is its title there, so a rename changes the published schema).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from sandbox.policy.delegates import Delegate
from sandbox.session import SessionOptions
from sandbox.vocabulary import (
    Answer,
    BackendChoice,
    MountStrategy,
    NetworkMode,
    OperatingMode,
    PermissionMode,
    Stream,
)

if TYPE_CHECKING:
    from sandbox.policy.approvals import Approver


class Params(BaseModel):
    # Every message's base: a key the protocol does not name is refused.
    model_config = ConfigDict(extra="forbid")


class NoParams(Params):
    # A method that takes nothing (shutdown); the published schema has always titled it so.
    model_config = ConfigDict(title="_Params")


class InitializeParams(Params):
    client: str | None = None


class SessionOpenParams(Params):
    workspace: str
    profile: str | None = None
    backend: BackendChoice | None = None
    mode: PermissionMode | None = None
    operating_mode: OperatingMode | None = None
    mount: MountStrategy | None = None
    trust_project: bool | None = None
    network: NetworkMode | None = None
    allow_hosts: list[str] | None = None
    allow_indexes: list[str] | None = None  # pypi, npm, crates, go or NAME=URL (sandbox.network.indexes)
    plugins: list[str] | None = None  # plugin manifests (sandbox.plugins); plugin.register grants each
    # Who judges what the rules leave open when policy.classifier is auto (seed 004): "client" (a
    # classify.request to this client), "builtin" (the profile's policy.classifier_endpoint), "none"
    # (every such call is asked). Absent: builtin when the profile names an endpoint, else client.
    classifier: Literal["client", "builtin", "none"] | None = None
    from_snapshot: str | None = None  # a session snapshot of the workspace to start from (issue 39)

    def options(self, approver: Approver) -> SessionOptions:
        return SessionOptions(
            approver=approver,
            profile=self.profile or "default",
            backend=self.backend,
            mount=self.mount,
            mode=self.mode,
            operating_mode=self.operating_mode,
            trust_project=self.trust_project,
            network=self.network,
            allow_hosts=self.allow_hosts,
            allow_indexes=self.allow_indexes,
            from_snapshot=self.from_snapshot,
        )


class SessionParams(Params):
    session_id: str


class SessionConfigureParams(SessionParams):
    # "inherit": drop the session's own mode, so the profile's or the user's global one applies again
    mode: PermissionMode | Literal["inherit"] | None = None
    operating_mode: OperatingMode | None = None
    # An allowlist session's network, live (issue 36): allow, deny, ask, requests as a profile's
    # [network] states them, and its secrets as [secrets] does; each given one replaces the session's.
    network: dict[str, Any] | None = None
    secrets: dict[str, Any] | None = None


class SessionRestoreParams(SessionParams):
    snapshot_id: str
    force: bool = False  # restore even where the host changed a path since (the apply then refuses it)
    turn_id: str = "turn-0"


class SessionForkParams(SessionParams):
    n: int = Field(1, ge=1, le=16)
    turn_id: str = "turn-0"


class ToolCallParams(Params):
    session_id: str
    tool: str
    args: dict[str, Any] = Field(default_factory=dict)
    tool_call_id: str | None = None
    turn_id: str = "turn-0"
    delegate: Delegate | None = None  # the delegate making the call (seed 003 §10.2)
    user_message: str | None = None  # the user's latest message, handed to the classifier (seed 004)


class ToolCheckParams(Params):
    """A tool the client runs itself (another extension's), put to the gate before it runs."""

    session_id: str
    tool: str
    args: dict[str, Any] = Field(default_factory=dict)
    tool_call_id: str | None = None
    turn_id: str = "turn-0"
    user_message: str | None = None


class PluginParams(Params):
    session_id: str
    plugin_id: str
    turn_id: str = "turn-0"
    tool_call_id: str | None = None  # the approval request's, so the client can route it


class ToolCancelParams(Params):
    tool_call_id: str


class RollbackParams(Params):
    session_id: str
    snapshot_id: str


class AuditQueryParams(Params):
    session_id: str | None = None
    limit: int = Field(100, ge=1, le=10_000)


class ChangesListParams(Params):
    workspace: str | None = None


class ChangesetParams(Params):
    changeset_id: str


class ChangesShowParams(ChangesetParams):
    paths: list[str] | None = None


class ChangesApplyParams(ChangesShowParams):
    include_flagged: bool = False


class ApprovalAnswer(Params):
    decision: Answer
    # "nobody": the client has no one to ask (no UI); its "deny" is then no one's decision.
    answered_by: Literal["user", "nobody"] = "user"


class ToolOutput(Params):
    tool_call_id: str
    stream: Stream
    data: str
