"""Boundaries 3 and 4 of a call that can be aborted: a pending question withdrawn, not left open.

``tool.cancel`` or pi's abort may come while the approver is still asked; the question is then
withdrawn at once and the call ends as ABORTED, nothing having run. Apart from
:mod:`sandbox.session` because it is a race between two tasks (the question and the abort) that
the session's flow need not see: it only learns that there is no authorization.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import anyio

from sandbox.policy.approvals import ApprovalRequest, Approver
from sandbox.policy.authorize import authorize

if TYPE_CHECKING:
    from sandbox.policy.authorize import Authorization
    from sandbox.policy.classifier import Classifier
    from sandbox.policy.gate import Gate, SessionState, ToolCall
    from sandbox.vocabulary import Answer


class _Withdrawn(BaseException):
    """The call was aborted while its question was open (a BaseException: ``decide`` must not turn
    it into a denial; :func:`authorize_unless_aborted` ends the call as ABORTED)."""


class _Withdrawable(Approver):
    """``approver``, its question withdrawn when ``abort`` is set before it is answered."""

    def __init__(self, approver: Approver, abort: anyio.Event) -> None:
        self.approver, self.abort = approver, abort
        self.who = approver.who

    async def ask(self, request: ApprovalRequest) -> Answer:
        outcome: list[Answer | Exception] = []
        async with anyio.create_task_group() as tg:

            async def withdraw_on_abort() -> None:
                await self.abort.wait()
                tg.cancel_scope.cancel()

            tg.start_soon(withdraw_on_abort)
            try:
                outcome.append(await self.approver.ask(request))
            except Exception as exc:  # decide() judges it, outside the task group (no exception group)
                outcome.append(exc)
            tg.cancel_scope.cancel()
        if not outcome:
            raise _Withdrawn
        if isinstance(outcome[0], Exception):
            raise outcome[0]
        return outcome[0]


async def authorize_unless_aborted(
    gate: Gate,
    state: SessionState,
    call: ToolCall,
    approver: Approver,
    abort: anyio.Event | None,
    classifier: Classifier | None,
) -> Authorization | None:
    """The gate's and, when it asks, the approver's word; ``None`` when the call is aborted
    first (``tool.cancel``, pi's abort): a pending question is then withdrawn at once, not
    left to be answered. Only a call that asks pays for watching the abort."""
    if abort is not None and abort.is_set():
        return None
    asked = approver if abort is None else _Withdrawable(approver, abort)
    try:
        return await authorize(gate, state, call, asked, classifier=classifier)
    except _Withdrawn:
        return None
