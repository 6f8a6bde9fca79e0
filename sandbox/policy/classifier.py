"""Seed 004's classifier layer: a model judges what the deterministic layers leave open, and fails closed.

The gate marks a call it leaves open (not exempt, not denied, not an explicit ask) as *to be
judged* (``Decision.classify``); :func:`sandbox.policy.authorize.authorize` puts a
:class:`ClassifyRequest` to the session's :class:`Classifier` through :func:`judge`. The answer is
``{"verdict": "allow" | "block", "reason": "..."}`` and nothing else: an extra field, another
verdict, a missing reason, invalid JSON, an error, a timeout or no classifier at all is a
``failed`` judgement, which never allows: the call is asked, or refused where nobody can be asked.

Judgements come from a Python callable (:class:`CallbackClassifier`), the client of ``sandbox
serve`` (a ``classify.request``, :class:`sandbox.server_requests.RpcClassifier`) or the built-in client of
an OpenAI-compatible chat-completions endpoint (:class:`ChatClassifier`). Identical requests are
judged once per session (:class:`SessionState.judgements`).
"""

from __future__ import annotations

import abc
import inspect
import json
import os
import re
import time
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Literal

import anyio
import anyio.to_thread
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from sandbox.errors import InvalidArgument

# Run-time imports: the server reads ClassifyRequest's fields for its schema.
from sandbox.vocabulary import ClassifierVerdict, OperatingMode, Operation, PermissionMode  # noqa: TC001

if TYPE_CHECKING:
    from sandbox.profile_policy import Policy

MAX_REASON = 2000
MAX_USER_MESSAGE = 4000
MAX_REPLY_BYTES = 1 << 20

SYSTEM_PROMPT = """You are the safety classifier of a sandboxed coding agent. Deterministic rules already \
let read-only commands, writes inside the project and declared dependency installs run, refuse formatting \
disks and deleting / or a home directory, and ask the user for what the user said to always ask. You judge \
the rest: one tool call the rules left open. Answer "allow" when the call is an ordinary, reversible step \
of software work inside the project, or when the user's latest message explicitly authorises exactly this \
action. Answer "block" for what is hard to undo or reaches beyond the project: publishing packages, \
force-pushing, deleting data or databases, running unknown downloaded scripts, changing the agent's own \
configuration or credentials, writes outside the project, contacting private network addresses. \
"hints" are what the rules noticed about the call; weigh them. When unsure, block: the user is asked. \
Reply with one JSON object and nothing else: {"verdict": "allow" or "block", "reason": "<one short \
sentence the user will read>"}."""


@dataclass(frozen=True, slots=True)
class ClassifyRequest:
    """What the classifier sees of one call: redacted as an approval card is."""

    session_id: str
    tool: str
    operation: Operation
    resource: str  # the canonical path, or the command for Bash
    reason: str  # why the rules left the call open
    rule_id: str
    hints: tuple[str, ...]  # the older confirm rules the call matched (seed 004: hints, not prompts)
    workspace: str
    mode: PermissionMode
    operating_mode: OperatingMode
    user_message: str | None = None  # the user's latest message, when the client supplies it

    def key(self) -> str:
        """What identical judgements share (the session and the call ids aside)."""
        data = asdict(self)
        data.pop("session_id")
        return json.dumps(data, sort_keys=True, default=str)

    def params(self) -> dict[str, Any]:
        data = asdict(self)
        data["hints"] = list(self.hints)
        return data


class ClassifierAnswer(BaseModel):
    """The only answer accepted: a verdict and a reason, no other field."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    verdict: Literal["allow", "block"]
    reason: str = Field(min_length=1, max_length=MAX_REASON)
    model: str | None = Field(None, max_length=200)  # which model judged, when the judge says (recorded only)


@dataclass(frozen=True, slots=True)
class Judgement:
    verdict: ClassifierVerdict
    reason: str
    model: str
    latency_ms: float
    cached: bool = False

    @property
    def allowed(self) -> bool:
        return self.verdict == "allow"


class ClassifierFailed(Exception):
    """Raised by a classifier that could not judge (transport error, a refusal by the endpoint)."""


class Classifier(abc.ABC):
    model: str = "unknown"

    @abc.abstractmethod
    async def classify(self, request: ClassifyRequest) -> object:
        """Return the answer: a :class:`ClassifierAnswer`, a mapping, or its JSON text."""


Callback = Callable[[ClassifyRequest], "Awaitable[object] | object"]


class CallbackClassifier(Classifier):
    """For library users: a sync or async function receives the request and returns the answer."""

    def __init__(self, callback: Callback, model: str = "callback") -> None:
        self.callback = callback
        self.model = model

    async def classify(self, request: ClassifyRequest) -> object:
        result = self.callback(request)
        if inspect.isawaitable(result):
            result = await result
        return result


class ChatClassifier(Classifier):
    """The built-in client: an OpenAI-compatible ``POST {base_url}/chat/completions``.

    The API key is read from the environment variable named by ``key_env`` when the call is made
    (never stored in a profile); the request runs on a worker thread, abandoned on timeout.
    """

    def __init__(self, base_url: str, model: str, key_env: str | None = None, *, http_timeout: float = 60) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise InvalidArgument(f"policy.classifier_endpoint must be an http(s) URL, not {base_url!r}")
        self.url = base_url.rstrip("/") + (
            "" if base_url.rstrip("/").endswith("/chat/completions") else "/chat/completions"
        )
        self.model = model
        self.key_env = key_env
        self.http_timeout = http_timeout

    @classmethod
    def from_settings(cls, settings: Policy) -> ChatClassifier | None:
        if not settings.classifier_endpoint:
            return None
        return cls(
            settings.classifier_endpoint,
            settings.classifier_model or "default",
            settings.classifier_key_env,
            http_timeout=float(settings.classifier_timeout_s),
        )

    def body(self, request: ClassifyRequest) -> dict[str, Any]:
        return {
            "model": self.model,
            "temperature": 0,
            "messages": [
                {"role": "system", "content": SYSTEM_PROMPT},
                {"role": "user", "content": json.dumps(request.params(), ensure_ascii=False)},
            ],
        }

    async def classify(self, request: ClassifyRequest) -> object:
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self.key_env:
            key = os.environ.get(self.key_env)
            if not key:
                raise ClassifierFailed(f"the environment variable {self.key_env} (the classifier's API key) is not set")
            headers["Authorization"] = f"Bearer {key}"
        data = json.dumps(self.body(request)).encode()
        http = urllib.request.Request(self.url, data=data, headers=headers, method="POST")
        reply = await anyio.to_thread.run_sync(self._post, http, abandon_on_cancel=True)
        return answer_text(reply)

    def _post(self, http: urllib.request.Request) -> Any:
        try:
            with urllib.request.urlopen(http, timeout=self.http_timeout) as response:
                raw = response.read(MAX_REPLY_BYTES + 1)
        except urllib.error.HTTPError as exc:
            exc.close()
            raise ClassifierFailed(f"the endpoint answered HTTP {exc.code}") from None
        except (urllib.error.URLError, OSError) as exc:
            raise ClassifierFailed(f"the endpoint could not be reached ({exc})") from None
        if len(raw) > MAX_REPLY_BYTES:
            raise ClassifierFailed("the endpoint's reply is too large")
        try:
            return json.loads(raw)
        except ValueError:
            raise ClassifierFailed("the endpoint's reply is not JSON") from None


_FENCE = re.compile(r"^\s*```(?:json)?\s*(.*?)\s*```\s*$", re.S)


def answer_text(reply: Any) -> str:
    """The assistant message of a chat-completions reply (a fenced block unwrapped)."""
    try:
        content = reply["choices"][0]["message"]["content"]
    except (KeyError, IndexError, TypeError):
        raise ClassifierFailed("the endpoint's reply has no choices[0].message.content") from None
    if not isinstance(content, str):
        raise ClassifierFailed("the endpoint's message content is not text")
    fenced = _FENCE.match(content)
    return fenced.group(1) if fenced else content.strip()


def parse_answer(raw: object) -> ClassifierAnswer:
    """Validate an answer; raises ``ValueError`` with what is wrong."""
    if isinstance(raw, ClassifierAnswer):
        return raw
    if isinstance(raw, str | bytes):
        try:
            raw = json.loads(raw)
        except ValueError:
            raise ValueError("the answer is not JSON") from None
    if not isinstance(raw, Mapping):
        raise ValueError(f"the answer is not an object ({type(raw).__name__})")
    try:
        return ClassifierAnswer.model_validate(dict(raw))
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'answer'}: {e['msg']}" for e in exc.errors())
        raise ValueError(f"the answer is malformed ({problems})") from None


async def judge(classifier: Classifier | None, request: ClassifyRequest, timeout: float) -> Judgement:
    """Ask the classifier; every failure is a ``failed`` judgement with a reason the user can read."""
    start = time.perf_counter()
    if classifier is None:
        return Judgement("failed", "no classifier is configured", "none", 0.0)
    model = classifier.model
    try:
        with anyio.fail_after(timeout):
            raw = await classifier.classify(request)
        answer = parse_answer(raw)
    except TimeoutError:
        return Judgement("failed", f"the classifier did not answer within {timeout:g} s", model, _ms(start))
    except ValueError as exc:
        return Judgement("failed", f"the classifier's answer was refused: {exc}", model, _ms(start))
    except ClassifierFailed as exc:
        return Judgement("failed", f"the classifier failed: {exc}", model, _ms(start))
    except Exception as exc:  # fail closed: a classifier bug must not become a permission
        detail = str(exc) or type(exc).__name__
        return Judgement("failed", f"the classifier failed ({type(exc).__name__}: {detail})", model, _ms(start))
    return Judgement(answer.verdict, answer.reason.strip(), answer.model or model, _ms(start))


def _ms(start: float) -> float:
    return round((time.perf_counter() - start) * 1000.0, 3)


def from_settings(settings: Policy) -> Classifier | None:
    """The profile's built-in client, if it names an endpoint."""
    return ChatClassifier.from_settings(settings)
