"""What ``sandbox serve`` asks its client: ``approval.request`` and ``classify.request``.

They are the approver and the classifier the server hands each session it opens. Apart from
:mod:`sandbox.server` because they see nothing of it but the one call that sends a request and
awaits its answer (:meth:`sandbox.server.Server.request`), and because both fail closed: the
client's silence, an error answer or a closed pipe is a denial, or a failed judgement that is then
asked. Their schemas, for ``sandbox serve --schema``, are here too.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from pydantic import TypeAdapter

from sandbox.policy.approvals import ApprovalRequest, ApprovalUnavailable, Approver, NoOneToAsk
from sandbox.policy.classifier import Classifier, ClassifierAnswer, ClassifierFailed, ClassifyRequest
from sandbox.server_messages import ApprovalAnswer

if TYPE_CHECKING:
    from sandbox.vocabulary import Answer

ClientRequest = Callable[[str, dict[str, Any]], Awaitable[Any]]
"""Sends a request to the client and returns its result; raises ApprovalUnavailable when the client
is gone or answers with an error."""


class RpcApprover(Approver):
    """Asks the client; its silence, an error answer or a closed pipe all mean deny (upstream)."""

    def __init__(self, request: ClientRequest) -> None:
        self.request = request

    async def ask(self, request: ApprovalRequest) -> Answer:
        params = {k: getattr(request, k) for k in ApprovalRequest.__dataclass_fields__}
        reply = await self.request("approval.request", params)
        answer = ApprovalAnswer.model_validate(reply)
        if answer.answered_by == "nobody":
            raise NoOneToAsk("the client has no one to ask")
        return answer.decision


class RpcClassifier(Classifier):
    """Asks the client (``classify.request``), which judges with its own model and credentials (seed
    004: safety-gate reuses pi's); an error answer or a closed pipe is a failed judgement (asked)."""

    model = "client"

    def __init__(self, request: ClientRequest) -> None:
        self.request = request

    async def classify(self, request: ClassifyRequest) -> object:
        try:
            return await self.request("classify.request", request.params())
        except ApprovalUnavailable as exc:
            raise ClassifierFailed(str(exc)) from None


def schemas() -> dict[str, Any]:
    """Each request's params and the result it expects: the schema's ``server_requests``."""
    return {
        "approval.request": {
            "params": TypeAdapter(ApprovalRequest).json_schema(),
            "result": ApprovalAnswer.model_json_schema(),
        },
        "classify.request": {
            "params": TypeAdapter(ClassifyRequest).json_schema(),
            "result": ClassifierAnswer.model_json_schema(),
        },
    }
