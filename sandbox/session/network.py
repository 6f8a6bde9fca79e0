"""What one session hears from its jail's network proxy: the connections it refused, and questions.

With the allowlist network the jail's traffic passes a proxy that runs on its own thread
(:mod:`sandbox.network.egress`). Each connection it refuses is audited and passed on to
``on_denial`` (the server's notification); with ``network.ask``, each destination no rule names
is put to the session's approver. Both are told which Bash call they belong to when exactly one
runs. Apart from :mod:`sandbox.session` because none of this happens in a call: it comes from
the proxy's thread at any time, and only borrows the ids of the calls running then.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import TYPE_CHECKING, Any

import anyio.from_thread
import anyio.lowlevel
from pydantic import ValidationError

from sandbox.errors import InvalidArgument, SandboxError
from sandbox.network.denial import where
from sandbox.policy.approvals import ApprovalRequest, ApprovalUnavailable, decide

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Mapping

    from sandbox.audit import AuditLog
    from sandbox.network.denial import Denial
    from sandbox.network.egress import Egress
    from sandbox.policy.approvals import Approver
    from sandbox.policy.gate import ToolCall
    from sandbox.profile import Profile
    from sandbox.vocabulary import Answer


LIVE_NETWORK_KEYS = ("allow", "deny", "ask", "requests")
"""What of a running session's ``[network]`` may change (its mode, indexes and transparency may not)."""


class NetworkWatch:
    """One session's ear on its jail's proxy, and the Bash calls its connections may belong to."""

    def __init__(self, session_id: str, audit: AuditLog) -> None:
        from sandbox.network.userlist import UserNetwork

        self.session_id, self.audit = session_id, audit
        self.user = UserNetwork()
        self.user_stamp = self.user.stamp()  # the user's list as the jail opened with it
        self.commands: dict[str, str] = {}  # the Bash calls running now: tool_call_id -> turn_id
        self.on_denial: Callable[[dict[str, Any]], None] | None = None  # told of each refused connection

    def listen(self, egress: Egress | None, approver: Approver | None, timeout: float) -> None:
        """Hear the jail's proxy (on its own thread): each denial is audited and passed on, and, given
        ``approver`` (``network.ask``), each unknown destination is put to it for ``timeout`` seconds."""
        if egress is None:
            return
        token = anyio.lowlevel.current_token()
        egress.listeners.append(lambda denial: anyio.from_thread.run_sync(self._denied, denial, token=token))
        egress.on_grant(lambda host, port: self._granted(host, port))
        if approver is not None:
            ask = self._ask_connect
            egress.ask_with(lambda host, port: anyio.from_thread.run(ask, approver, timeout, host, port, token=token))

    @contextlib.contextmanager
    def running(self, call: ToolCall) -> Iterator[None]:
        """While ``call`` runs the user's commands, its network denials are this call's."""
        self.commands[call.tool_call_id] = call.turn_id
        try:
            yield
        finally:
            self.commands.pop(call.tool_call_id, None)

    def _denied(self, denial: Denial) -> None:
        """A connection the proxy refused: the audit row, and ``on_denial`` (the server's notification)."""
        call_id = self._running_command()[0]
        event = {"session_id": self.session_id, "tool_call_id": call_id, **dataclasses.asdict(denial)}
        with contextlib.suppress(SandboxError):  # an unwritable log must not hide the denial itself
            self.audit.record_denial(self.session_id, call_id, event)
        if self.on_denial is not None:
            self.on_denial({**event, "line": denial.line()})

    def follow(self, profile: Profile, egress: Egress | None) -> None:
        """Before a command: the user's network list changed since the jail last read it
        (``sandbox policy network``)? The proxy follows from the next connection, audited."""
        from sandbox.network.egress import for_profile

        stamp = self.user.stamp()
        if stamp == self.user_stamp or egress is None or profile.network.mode != "allowlist":
            return
        network = for_profile(profile)
        egress.reconfigure(network, profile.secrets)  # a list it cannot take fails this call, and the next
        self.user_stamp = stamp  # only once followed: a deny added to the list is never passed over
        change = {"allow": list(network.allow), "deny": list(network.deny), "list": str(self.user.path)}
        with contextlib.suppress(SandboxError):
            self.audit.record_network_change(self.session_id, "user-list", change)

    def _granted(self, host: str, port: int) -> None:
        """A destination the user allowed for the session: the session's allowlist changed, audited."""
        call_id = self._running_command()[0]
        with contextlib.suppress(SandboxError):
            self.audit.record_network_change(
                self.session_id, "ask", {"allow": [where(host, port)], "tool_call_id": call_id}
            )

    def change(
        self,
        profile: Profile,
        egress: Egress | None,
        network: Mapping[str, Any] | None,
        secrets: Mapping[str, Any] | None,
    ) -> Profile:
        """The session's profile with ``network`` (``allow``, ``deny``, ``ask``, ``requests``) and
        ``secrets`` in place of its own where given, checked as a profile is; the jail's proxy follows
        from its next connection, and the change is audited (the secrets by name and hosts, never a value)."""
        from sandbox.network.egress import for_profile
        from sandbox.profile import Profile as Loaded

        if profile.network.mode != "allowlist":
            raise InvalidArgument(
                f"the session's network is {profile.network.mode!r}: only an allowlist session's network changes live",
                session_id=self.session_id,
            )
        unknown = set(network or {}) - set(LIVE_NETWORK_KEYS)
        if unknown:
            raise InvalidArgument(
                f"network.{sorted(unknown)[0]} cannot change in a running session"
                f" (only {', '.join(LIVE_NETWORK_KEYS)})",
                session_id=self.session_id,
            )
        data = profile.model_dump(by_alias=True)
        data["network"] = {**data["network"], **(network or {})}
        if secrets is not None:
            data["secrets"] = dict(secrets)
        try:
            changed = Loaded.model_validate(data)
        except ValidationError as exc:
            raise InvalidArgument(
                f"the network change is not valid: {exc.errors()[0]['msg']}", session_id=self.session_id
            ) from None
        if egress is not None:
            egress.reconfigure(for_profile(changed), changed.secrets)
        record = {
            "allow": list(changed.network.allow),
            "deny": list(changed.network.deny),
            "ask": changed.network.ask,
            "requests": [rule.model_dump() for rule in changed.network.requests],
            "secrets": {name: {"hosts": list(spec.hosts), "as": spec.as_} for name, spec in changed.secrets.items()},
        }
        self.audit.record_network_change(self.session_id, "configure", record)
        return changed

    def _running_command(self) -> tuple[str, str]:
        """The Bash call a connection belongs to when exactly one runs, else ``("", "")``."""
        return next(iter(self.commands.items())) if len(self.commands) == 1 else ("", "")

    async def _ask_connect(self, approver: Approver, timeout: float, host: str, port: int) -> Answer:
        call_id, turn_id = self._running_command()
        request = ApprovalRequest.for_connection(self.session_id, host, port, turn_id=turn_id, tool_call_id=call_id)
        outcome = await decide(approver, request, timeout)
        # Who refused, told apart (the proxy's ask-timeout and ask-unavailable): only a user says no.
        if outcome.decided_by == "timeout":
            raise TimeoutError(outcome.reason)
        if not outcome.allowed and outcome.decided_by != "user":
            raise ApprovalUnavailable(outcome.reason)
        return outcome.answer
