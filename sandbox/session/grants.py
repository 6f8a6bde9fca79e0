"""A plugin's registration in one session (seed 003 §11): only after the user's grant, audited either way.

Registering a plugin widens what the model may call, so the approver is asked (operation
``register``, the tools and their risks as the resource) and only a user's allow registers it; no
one to ask (an unattended session), a timeout, a closed channel or a denial: not registered. A
plugin the user granted up front (``--grant-plugin``, ``granted_plugins``) is registered unasked.
Apart from :mod:`sandbox.session` because a registration is no call: it passes none of the five
boundaries, only the approver and the audit log.
"""

from __future__ import annotations

import time
import uuid
from typing import TYPE_CHECKING, Any

from sandbox.plugins import registration_text
from sandbox.policy.approvals import NO_ONE_ASKED, ApprovalRequest, decide

if TYPE_CHECKING:
    from sandbox.plugins import PluginHost
    from sandbox.policy.approvals import Approver
    from sandbox.session.records import Recorder


async def ask_and_register(
    host: PluginHost,
    plugin_id: str,
    approver: Approver,
    records: Recorder,
    *,
    timeout: float,
    turn_id: str,
    tool_call_id: str | None,
) -> dict[str, Any]:
    """Register ``plugin_id`` if the user, asked for up to ``timeout`` seconds, allows it. The
    plugin's listing (:meth:`sandbox.plugins.Plugin.describe`) with ``registered`` and ``reason``."""
    started = time.monotonic()
    plugin = host.plugin(plugin_id)
    if plugin_id in host.registered:
        return {**plugin.describe(True), "reason": "already registered in this session"}
    call_id = tool_call_id or f"register-{uuid.uuid4().hex[:12]}"
    resource, reason = registration_text(plugin)
    if approver.who != "user":
        why = (
            f"{NO_ONE_ASKED}: no one attends this session to grant plugin {plugin_id} "
            "(grant it up front: sandbox serve --grant-plugin, or granted_plugins)"
        )
        records.registration(
            plugin, call_id, turn_id, total=_ms_since(started), allowed=False, rule_id="plugin.unattended"
        )
        return {**plugin.describe(False), "reason": why, "decided_by": "unattended"}
    request = ApprovalRequest(
        session_id=records.session_id,
        turn_id=turn_id,
        tool_call_id=call_id,
        tool=f"plugin.{plugin.id}",
        operation="register",
        resource=resource,
        reason=reason,
        rule_id="plugin.register",
        allow_session=False,
    )
    outcome = await decide(approver, request, timeout)
    allowed = outcome.allowed and outcome.decided_by == "user"
    if allowed:
        host.register(plugin_id)
    records.registration(
        plugin,
        call_id,
        turn_id,
        total=_ms_since(started),
        allowed=allowed,
        rule_id="plugin.register",
        decided_by=outcome.decided_by,
        answer=outcome.answer,
        wait_ms=outcome.wait_ms,
    )
    return {**plugin.describe(allowed), "reason": outcome.reason, "decided_by": outcome.decided_by}


def register_granted(host: PluginHost, plugin_id: str, records: Recorder, *, turn_id: str, rule_id: str) -> None:
    """Register without asking: the user granted the plugin up front (a flag, an option)."""
    started = time.monotonic()
    plugin = host.register(plugin_id)
    call_id = f"register-{uuid.uuid4().hex[:12]}"
    records.registration(plugin, call_id, turn_id, total=_ms_since(started), allowed=True, rule_id=rule_id)


def _ms_since(started: float) -> float:
    return round((time.monotonic() - started) * 1000, 3)
