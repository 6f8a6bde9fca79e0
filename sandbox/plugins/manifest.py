"""What a plugin's manifest may say (seed 003 §11), validated before anything of it is used.

A plugin is a directory with a JSON manifest::

    {"id": "weather", "description": "…",
     "tools": [{"name": "forecast", "description": "The forecast for a city",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                               "required": ["city"]},
                "risk": "low", "command": ["python3", "${PLUGIN_DIR}/forecast.py"], "timeout": 20}]}

``id`` is letters, digits, ``.``, ``_`` and ``-``; each tool is exposed to the model as
``plugin_<idSafe>_<name>`` (``idSafe``: the id with every other character than a letter, a digit
or ``_`` replaced by ``_``) and named ``plugin.<id>.<name>`` inside. ``risk`` is ``low``,
``medium`` or ``high``; a missing or invalid one is ``medium``, with a warning. ``parameters`` is
a JSON Schema (an object's); arguments that do not validate are INVALID_ARGUMENT, nothing runs.

Apart from :mod:`sandbox.plugins` (a declared plugin, its directory's checks, a session's tools):
this is the file's format alone, pure pydantic models and the names they expose, which nothing
here reads from disk.
"""

from __future__ import annotations

import re
from typing import Any, get_args

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from sandbox.profile_tables import MAX_TIMEOUT_S
from sandbox.vocabulary import PluginRisk

DEFAULT_RISK: PluginRisk = "medium"
RISKS: tuple[PluginRisk, ...] = get_args(PluginRisk)
MAX_NAME = 64  # what model APIs accept as a tool's name
_ID = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,39}$"
_TOOL = r"^[A-Za-z][A-Za-z0-9_-]{0,47}$"


def id_safe(plugin_id: str) -> str:
    return re.sub(r"[^A-Za-z0-9_]", "_", plugin_id)


def exposed_name(plugin_id: str, tool: str) -> str:
    """The name the model sees: ``plugin_<idSafe>_<tool>`` (seed 003 §11, D015)."""
    return f"plugin_{id_safe(plugin_id)}_{tool}"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ToolManifest(_Model):
    name: str = Field(pattern=_TOOL)
    description: str = Field("", max_length=4000)
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})
    risk: PluginRisk = DEFAULT_RISK  # a missing or invalid risk reads as medium (see _risk)
    command: list[str] = Field(min_length=1)
    timeout: float | None = Field(None, ge=1, le=MAX_TIMEOUT_S)

    @field_validator("risk", mode="before")
    @classmethod
    def _risk(cls, value: object) -> object:
        return value if value in RISKS else DEFAULT_RISK

    @field_validator("command")
    @classmethod
    def _words(cls, value: list[str]) -> list[str]:
        if any(not word for word in value):
            raise ValueError("every word of the command must be a non-empty string")
        return value

    @field_validator("parameters")
    @classmethod
    def _schema(cls, value: dict[str, Any]) -> dict[str, Any]:
        import jsonschema

        if value.get("type", "object") != "object":
            raise ValueError("the parameters schema must describe an object (type: object)")
        try:
            jsonschema.validators.validator_for(value).check_schema(value)
        except jsonschema.SchemaError as exc:
            raise ValueError(f"not a valid JSON Schema: {exc.message}") from None
        return value


class Manifest(_Model):
    id: str = Field(pattern=_ID)
    name: str | None = Field(None, max_length=200)
    version: str | None = Field(None, max_length=100)
    description: str = Field("", max_length=4000)
    tools: list[ToolManifest] = Field(min_length=1, max_length=100)

    @model_validator(mode="after")
    def _names(self) -> Manifest:
        seen: set[str] = set()
        for tool in self.tools:
            if tool.name in seen:
                raise ValueError(f"two tools are named {tool.name!r}")
            seen.add(tool.name)
            exposed = exposed_name(self.id, tool.name)
            if len(exposed) > MAX_NAME:
                raise ValueError(f"{exposed} is longer than {MAX_NAME} characters; shorten the id or the tool's name")
        return self


def risk_warnings(raw: Any) -> list[str]:
    """Seed 003 §11: a missing or invalid risk is medium; the manifest is told so, not refused."""
    warnings = []
    for tool in raw.get("tools", []) if isinstance(raw, dict) else []:
        if not isinstance(tool, dict):
            continue
        name = tool.get("name", "?")
        if "risk" not in tool:
            warnings.append(f"tool {name}: no risk given; it is registered as medium")
        elif tool["risk"] not in RISKS:
            given = tool["risk"]
            warnings.append(f"tool {name}: risk {given!r} is not low, medium or high; it is registered as medium")
    return warnings
