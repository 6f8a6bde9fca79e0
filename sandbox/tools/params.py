"""Boundaries 1 and 2: which tools exist, and what their arguments may look like.

Self-contained on purpose: the policy layer and the server import it without pulling in any
backend. Every model forbids extra keys, so a misspelt argument is an error the model can read
and fix, never a silently ignored option.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal

from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from sandbox.errors import InvalidArgument, ToolDenied
from sandbox.profile_tables import MAX_TIMEOUT_S, EgressPattern

if TYPE_CHECKING:
    from sandbox.vocabulary import PluginRisk, Risk

DEFAULT_MAX_TIMEOUT_S = 300.0  # a Bash call's ceiling where no profile is given (a caller of validate() without one)
LIST_LIMIT = 1000  # the most paths one Glob returns (the runner's own ceiling)

OutputMode = Literal["content", "filesWithMatches", "count"]
OUTPUT_MODE_ALIASES = {"files_with_matches": "filesWithMatches", "files-with-matches": "filesWithMatches"}


class _Params(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, str_strip_whitespace=False)


class BashParams(_Params):
    command: str = Field(min_length=1, max_length=100_000)
    timeout: float = Field(60, ge=1, le=MAX_TIMEOUT_S)
    description: str | None = Field(None, max_length=500)
    # The shell id the client pinned for the turn (sandbox.shells): a call that would now run in
    # another is COMMAND_SHELL_CHANGED. Never a path: a shell is named by its catalogue id only.
    shell: str | None = Field(
        None,
        min_length=1,
        max_length=32,
        pattern=r"^[a-z][a-z-]*$",
        description="for clients: the shell id this turn pinned (sandbox shells); leave unset",
    )
    # A narrower allowlist for this call's commands (issue 36): every connection must be allowed by
    # the session and by these; they can take destinations away, never add one.
    network_allow: tuple[EgressPattern, ...] | None = Field(
        None,
        max_length=256,
        description="only these destinations for this command (allowlist patterns); never widens the session's",
    )

    @field_validator("timeout")
    @classmethod
    def _within_the_profiles_ceiling(cls, value: float, info: ValidationInfo) -> float:
        # The session and `policy test` pass their profile's timeouts.max_s; without one, 300 s.
        context = info.context or {}
        if "max_timeout_s" in context:
            ceiling, whose = float(context["max_timeout_s"]), "the profile's timeouts.max_s"
        else:
            ceiling, whose = DEFAULT_MAX_TIMEOUT_S, "no profile given"
        if value > ceiling:
            raise ValueError(f"must be at most {ceiling:g} seconds ({whose})")
        return value


class ReadParams(_Params):
    path: str = Field(min_length=1, max_length=4096)
    offset: int | None = Field(None, ge=1)
    limit: int | None = Field(None, ge=1)
    raw: bool = False  # the whole file's bytes as details.data_base64 (for clients that format it themselves)


class WriteParams(_Params):
    path: str = Field(min_length=1, max_length=4096)
    content: str


class EditOp(_Params):
    old_text: str = Field(min_length=1)
    new_text: str


class EditParams(_Params):
    path: str = Field(min_length=1, max_length=4096)
    edits: list[EditOp] = Field(min_length=1)


class GlobParams(_Params):
    pattern: str = Field(min_length=1, max_length=4096)
    path: str | None = Field(None, min_length=1, max_length=4096)
    limit: int = Field(LIST_LIMIT, ge=1, le=LIST_LIMIT, description="the most paths to return")


class GrepParams(_Params):
    """Grep's arguments as ADR 0057 names them.

    The earlier names ``limit`` and ``ignore_case``, and the snake_case spellings ``output_mode``,
    ``head_limit`` and ``case_insensitive``, are accepted as aliases; ``outputMode`` also accepts
    ``files_with_matches`` and ``files-with-matches``. One argument given under two names is refused.
    """

    pattern: str = Field(min_length=1, max_length=10_000)
    path: str | None = Field(None, min_length=1, max_length=4096)
    include: str | None = Field(None, min_length=1, max_length=1000)
    context: int = Field(0, ge=0, le=20, description="lines around each match (content mode only)")
    # camelCase attributes: they are the wire names, so dumps (the audit) and the schema spell them as the ADR does.
    outputMode: OutputMode = Field(
        "content",
        validation_alias=AliasChoices("outputMode", "output_mode"),
        description="content: matching lines; filesWithMatches: the files' paths; count: matching lines per file",
    )
    headLimit: int = Field(
        100,
        ge=1,
        le=1000,
        validation_alias=AliasChoices("headLimit", "head_limit", "limit"),
        description="the most matching lines (content) or files (filesWithMatches, count) to return",
    )
    caseInsensitive: bool = Field(
        False, validation_alias=AliasChoices("caseInsensitive", "case_insensitive", "ignore_case")
    )

    @model_validator(mode="before")
    @classmethod
    def _one_spelling_each(cls, data: object) -> object:
        # Otherwise the second spelling is refused as an unknown argument, which misleads.
        if isinstance(data, Mapping):
            for name, field in cls.model_fields.items():
                alias = field.validation_alias
                given = [n for n in getattr(alias, "choices", ()) if isinstance(n, str) and n in data]
                if len(given) > 1:
                    raise ValueError(f"{' and '.join(given)} are one argument ({name}); give it once")
        return data

    @field_validator("outputMode", mode="before")
    @classmethod
    def _shell_style_mode(cls, value: object) -> object:
        # Some providers send rg's spelling; the ADR normalises it before validation.
        return OUTPUT_MODE_ALIASES.get(value, value) if isinstance(value, str) else value


class LSParams(_Params):
    path: str | None = Field(None, min_length=1, max_length=4096)


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """A registered capability: its name, argument model and risk class.

    ``path_field`` names the argument the path policy reads; ``plugin`` marks tools that the
    plan and goal operating modes hide whatever their risk; ``plugin_risk`` is a plugin tool's
    registered risk (None for built-ins; a plugin tool without one is decided as ``medium``).
    """

    name: str
    params: type[BaseModel]
    risk: Risk
    description: str
    path_field: str | None = None
    plugin: bool = False
    plugin_risk: PluginRisk | None = None


_BUILTIN = (
    ToolSpec("Bash", BashParams, "execute", "Run a non-interactive shell command in the workspace"),
    ToolSpec("Read", ReadParams, "read", "Read a text file, optionally a line window", "path"),
    ToolSpec("Write", WriteParams, "write", "Create or overwrite a file", "path"),
    ToolSpec("Edit", EditParams, "write", "Replace exact text spans in a file", "path"),
    ToolSpec("Glob", GlobParams, "read", "List files matching a glob pattern", "path"),
    ToolSpec("Grep", GrepParams, "read", "Search file contents with a regular expression", "path"),
    ToolSpec("LS", LSParams, "read", "List a directory", "path"),
)

_registry: dict[str, ToolSpec] = {spec.name: spec for spec in _BUILTIN}
REGISTRY: Mapping[str, ToolSpec] = MappingProxyType(_registry)


def register(spec: ToolSpec) -> None:
    """Add a plugin tool; built-in names cannot be replaced."""
    if spec.name in _registry:
        raise InvalidArgument(f"a tool named {spec.name!r} is already registered", tool=spec.name)
    _registry[spec.name] = spec


def unregister(name: str) -> None:
    if any(spec.name == name for spec in _BUILTIN):
        raise InvalidArgument(f"built-in tool {name!r} cannot be removed", tool=name)
    _registry.pop(name, None)


def lookup(name: str, tools: Mapping[str, ToolSpec] | None = None) -> ToolSpec:
    """``name``'s spec in ``tools`` (a session's own registry: the built-ins and its plugin tools),
    else in the built-in registry."""
    registry = _registry if tools is None else tools
    try:
        return registry[name]
    except KeyError:
        known = ", ".join(sorted(registry))
        raise ToolDenied(
            f"unknown tool {name!r}: it is not available in this sandbox; available tools: {known}",
            tool=name,
            rule_id="capability.unknown-tool",
        ) from None


def _problems(exc: ValidationError) -> list[dict[str, str]]:
    return [
        {"field": ".".join(str(p) for p in err["loc"]) or "(arguments)", "problem": err["msg"]} for err in exc.errors()
    ]


def validate(
    name: str,
    args: Mapping[str, Any],
    *,
    max_timeout_s: float | None = None,
    tools: Mapping[str, ToolSpec] | None = None,
) -> BaseModel:
    """Boundary 2: the validated arguments are the only thing the policy and the tool ever read.

    ``max_timeout_s`` is the session's profile's ``timeouts.max_s``: a Bash timeout above it is
    refused here, before the policy or the user is asked about a call that could not run.
    ``tools`` is the session's registry (see :func:`lookup`).
    """
    spec = lookup(name, tools)
    if not isinstance(args, Mapping):
        raise InvalidArgument(f"{name}: arguments must be a JSON object", tool=name)
    context = None if max_timeout_s is None else {"max_timeout_s": max_timeout_s}
    try:
        return spec.params.model_validate(dict(args), context=context)
    except ValidationError as exc:
        problems = _problems(exc)
        text = "; ".join(f"{p['field']}: {p['problem']}" for p in problems)
        raise InvalidArgument(f"invalid arguments for {name}: {text}", tool=name, problems=problems) from exc
