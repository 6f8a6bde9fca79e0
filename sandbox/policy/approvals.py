"""Boundary 4: asking the user, fail closed.

Whatever goes wrong while asking is a denial: a timeout (120 s by default), an approver that
raises, a closed channel, an approver cancelled under us, an answer that is not one of the three.
If the *caller* is cancelled the cancellation propagates (anyio requires it) and nothing runs,
because the tool only runs after ``decide`` returns an allowing outcome.
"""

from __future__ import annotations

import abc
import asyncio
import inspect
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, TextIO, get_args

import anyio
import anyio.to_thread

# Operation and Root at run time: the server reads ApprovalRequest's fields for its schema.
from sandbox.vocabulary import Answer, Operation, Root

if TYPE_CHECKING:
    from sandbox.vocabulary import ApprovalDecidedBy

ANSWERS: frozenset[str] = frozenset(get_args(Answer))

USER_DENIED = "the user denied permission"
NO_ONE_ASKED = "no one could be asked: the call was refused (fail closed)"


class ApprovalUnavailable(Exception):
    """Raised by an approver whose channel is gone (no terminal, UI disconnected)."""


class NoOneToAsk(ApprovalUnavailable):
    """Raised by an approver whose channel works but has no one behind it (a client with no UI)."""


class ClientAnswered(ApprovalUnavailable):
    """Raised by an approver whose client program refused the question itself, unread (a headless
    client that declines or dismisses every question at once): the client's refusal, not the user's."""


@dataclass(frozen=True, slots=True)
class ApprovalRequest:
    """What the user sees: the tool, the operation, the canonical resource and why we ask."""

    session_id: str
    turn_id: str
    tool_call_id: str
    tool: str
    operation: Operation
    resource: str
    reason: str
    rule_id: str
    root: Root | None = None
    external: bool = False
    allow_session: bool = True  # whether "allow for this session" may be offered
    delegate: str | None = None  # the delegate asking (seed 003 §10.2), so the card can say which
    # What "allow for this session" covers after a classifier's block (seed 004's "allow this kind"):
    # "git push", "this exact command" …; None: the tool as a whole.
    session_scope: str | None = None

    @classmethod
    def for_connection(
        cls, session_id: str, host: str, port: int, *, turn_id: str = "", tool_call_id: str = ""
    ) -> ApprovalRequest:
        """A jail's connection to a host no network rule names (``network.ask``), while it waits."""
        return cls(
            session_id=session_id,
            turn_id=turn_id,
            tool_call_id=tool_call_id,
            tool="Network",
            operation="connect",
            resource=f"{host}:{port}",
            reason=f"the command connects to {host}:{port}, which no network rule names",
            rule_id="network.ask",
            external=True,
        )


@dataclass(frozen=True, slots=True)
class ApprovalOutcome:
    answer: Answer
    decided_by: ApprovalDecidedBy
    reason: str
    wait_ms: float

    @property
    def allowed(self) -> bool:
        return self.answer != "deny"


class Approver(abc.ABC):
    who: ApprovalDecidedBy = "user"

    @abc.abstractmethod
    async def ask(self, request: ApprovalRequest) -> Answer:
        """Return the user's answer; raise ``ApprovalUnavailable`` when no one can answer."""


class UnattendedApprover(Approver):
    """No one is there: every confirmation is denied, unless a profile says ``unattended = "allow"``."""

    who: ApprovalDecidedBy = "unattended"

    def __init__(self, allow: bool = False) -> None:
        self.allow = allow

    @classmethod
    def from_settings(cls, settings: object) -> UnattendedApprover:
        return cls(allow=getattr(settings, "unattended", "deny") == "allow")

    async def ask(self, _request: ApprovalRequest) -> Answer:
        return "allow-once" if self.allow else "deny"


Callback = Callable[[ApprovalRequest], "Awaitable[str] | str"]


class CallbackApprover(Approver):
    """For library users: a sync or async function receives the request and returns an answer."""

    def __init__(self, callback: Callback) -> None:
        self.callback = callback

    async def ask(self, request: ApprovalRequest) -> Answer:
        result = self.callback(request)
        if inspect.isawaitable(result):
            result = await result
        return result  # type: ignore[return-value]  # checked by decide(): anything else denies


class TerminalApprover(Approver):
    """Prompts on a terminal. The blocking read runs in a worker thread, abandoned on cancel."""

    def __init__(self, stdin: TextIO | None = None, stdout: TextIO | None = None) -> None:
        self.stdin = stdin or sys.stdin
        self.stdout = stdout or sys.stderr

    async def ask(self, request: ApprovalRequest) -> Answer:
        return await anyio.to_thread.run_sync(self.prompt, request, abandon_on_cancel=True)

    def prompt(self, request: ApprovalRequest) -> Answer:
        """The blocking question itself (for a caller already on a worker thread)."""
        scope = f" ({request.session_scope})" if request.session_scope else ""
        choices = f"[o]nce / [s]ession{scope} / [d]eny" if request.allow_session else "[o]nce / [d]eny"
        where = " (outside the workspace)" if request.external else ""
        who = f" (delegate {request.delegate})" if request.delegate else ""
        self.stdout.write(
            f"\nsandbox: {request.tool}{who} wants to {request.operation}{where}:\n  {request.resource}\n"
            f"  why: {request.reason}\nallow? {choices}: "
        )
        self.stdout.flush()
        line = self.stdin.readline()
        if not line:
            raise ApprovalUnavailable("the terminal closed")
        reply = line.strip().lower()
        if reply in ("o", "once", "y", "yes"):
            return "allow-once"
        if reply in ("s", "session") and request.allow_session:
            return "allow-session"
        return "deny"


async def decide(approver: Approver, request: ApprovalRequest, timeout: float) -> ApprovalOutcome:
    """Ask, and turn every failure into a denial the model can read."""
    start = time.perf_counter()
    try:
        with anyio.fail_after(timeout):
            answer = await approver.ask(request)
    except TimeoutError:
        return _denied("timeout", f"approval timed out after {timeout:g} s; the call was denied", start)
    except anyio.get_cancelled_exc_class():
        if not _approver_cancelled_itself():
            raise
        return _denied("cancelled", "the approval was cancelled; the call was denied", start)
    except NoOneToAsk as exc:
        return _denied("unattended", f"{NO_ONE_ASKED} ({exc})", start)
    except ClientAnswered as exc:
        return _denied("client", f"{NO_ONE_ASKED} ({exc})", start)
    except (ApprovalUnavailable, EOFError, ConnectionError) as exc:
        return _denied("disconnected", f"no one could approve the call ({exc or type(exc).__name__}); denied", start)
    except Exception as exc:  # fail closed: an approver bug must not become a permission
        return _denied("error", f"the approval failed ({type(exc).__name__}); the call was denied", start)
    return _outcome(approver, answer, start)


def _outcome(approver: Approver, answer: object, start: float) -> ApprovalOutcome:
    if not isinstance(answer, str) or answer not in ANSWERS:
        return _denied("invalid", f"the approver gave an invalid answer ({answer!r}); denied", start)
    if answer == "deny":
        reason = USER_DENIED if approver.who == "user" else f"{NO_ONE_ASKED} (no one attends this session)"
        return ApprovalOutcome("deny", approver.who, reason, _ms(start))
    granted: Answer = "allow-session" if answer == "allow-session" else "allow-once"
    return ApprovalOutcome(granted, approver.who, f"approved by the {approver.who} ({granted})", _ms(start))


def _approver_cancelled_itself() -> bool:
    """A CancelledError with no cancellation pending on our task came from inside the approver."""
    try:
        task = asyncio.current_task()
    except RuntimeError:  # not running on asyncio (trio): a Cancelled there is always ours
        return False
    return task is not None and task.cancelling() == 0


def _denied(by: ApprovalDecidedBy, reason: str, start: float) -> ApprovalOutcome:
    return ApprovalOutcome("deny", by, reason, _ms(start))


def _ms(start: float) -> float:
    return (time.perf_counter() - start) * 1000.0
