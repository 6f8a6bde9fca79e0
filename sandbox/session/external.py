"""The gate for a tool the client runs itself (another pi extension's): :meth:`Sandbox.check_tool`.

Such a tool is decided as a medium-risk plugin tool, asked and audited like any call; nothing runs
here (it runs in the client's process, not in the jail). Apart from :mod:`sandbox.session`
because it is a call's boundaries 2 to 4 without its fifth; and the tools a model may call now.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from sandbox import plugins as plugin_tools
from sandbox.errors import InvalidArgument, SandboxError
from sandbox.policy.authorize import authorize
from sandbox.policy.gate import ToolCall
from sandbox.tools import params as tool_params
from sandbox.tools.run import ToolResult

if TYPE_CHECKING:
    from sandbox.plugins import PluginHost
    from sandbox.policy.approvals import Approver
    from sandbox.policy.classifier import Classifier
    from sandbox.policy.gate import Gate, SessionState
    from sandbox.session.records import Recorder


def validated(
    plugins: PluginHost,
    session_id: str,
    name: str,
    args: dict[str, Any],
    call_id: str,
    turn_id: str,
    message: str | None,
) -> ToolCall:
    """The call, its tool the client's and its arguments valid; a SandboxError otherwise."""
    spec = plugins.external(name)
    try:
        params = spec.params.model_validate(dict(args))
    except ValidationError as exc:
        raise InvalidArgument(f"{name}: arguments must be a JSON object ({exc.error_count()} problems)") from exc
    return ToolCall(session_id, turn_id, call_id, name, params, user_message=message)


async def decided(
    gate: Gate,
    state: SessionState,
    approver: Approver,
    classifier: Classifier | None,
    records: Recorder,
    call: ToolCall,
    started: float,
) -> ToolResult:
    """The gate's and the approver's word on ``call``, audited; ``ok``: the client may run it."""
    auth = await authorize(gate, state, call, approver, classifier=classifier)
    ran_at = time.monotonic()
    try:
        auth.raise_if_denied()
        result = ToolResult(ok=True, content=f"{call.name} may run: {auth.reason}", details={"checked": True})
    except SandboxError as exc:
        result = ToolResult(ok=False, error_code=exc.code, content=exc.message, details=exc.data)
    result.details.update(decided_by=auth.decided_by, rule_id=auth.decision.rule_id)
    records.decided(call, auth, result, started=started, ran_at=ran_at, now=time.monotonic())
    return result


def tools_listing(agent: bool, plugins: PluginHost) -> list[dict[str, Any]]:
    """The tools the model may call in a session now, each with its JSON Schema: in agent mode
    (``agent``) the built-ins and the registered plugin tools; plan and goal hide Write, Edit and
    every plugin tool, which they refuse whatever the permission mode (seed 003 §10)."""
    listed = [
        {"name": spec.name, "description": spec.description, "parameters": plugin_tools.schema_of(spec)}
        for spec in tool_params.REGISTRY.values()
        if agent or spec.risk != "write"
    ]
    if agent:
        listed += plugins.registered_tools()
    return listed
