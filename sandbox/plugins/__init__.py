"""Plugin tools (seed 003 §11): declared in a manifest, registered after the user's grant, run in the jail.

A plugin is a directory with a JSON manifest (its format: :mod:`sandbox.plugins.manifest`).

A session declares plugins when it opens (their directories are bound read-only at
``/run/sandbox/plugins/<id>`` in the jail: a container's mounts are fixed when it starts) and
registers one only after the user's grant (an approval whose operation is ``register``; no one to
ask, a timeout or a denial: not registered), or when the user granted it up front
(``sandbox serve --grant-plugin ID``, ``Sandbox.open(..., granted_plugins=[ID])``). Grants and
registrations belong to one session.

A call then passes the five boundaries like a built-in tool's and runs the tool's ``command`` in
the jail (:mod:`sandbox.plugins.execution`). Here: a declared plugin and its checks (where its
manifest and directory may lie), its tools' argument models, and a session's tools.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

from sandbox import envrules
from sandbox.errors import InvalidArgument, ToolDenied
from sandbox.plugins.manifest import DEFAULT_RISK, Manifest, ToolManifest, exposed_name, id_safe, risk_warnings
from sandbox.tools.params import REGISTRY, ToolSpec

if TYPE_CHECKING:
    from collections.abc import Sequence

JAIL_ROOT = "/run/sandbox/plugins"
_EXTERNAL = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.:-]{0,127}$")


# ------------------------------------------------------------------------------ arguments


class PluginArgs(BaseModel):
    """A plugin tool's validated arguments: any JSON object its manifest's schema accepts.

    Each plugin tool gets a subclass (:func:`args_model`) holding its schema; the problems
    jsonschema finds come out as pydantic errors, one per problem, located at the argument, so
    :func:`sandbox.tools.params.validate` reports them as it reports a built-in tool's.
    """

    model_config = ConfigDict(extra="allow", frozen=True)
    plugin_schema: ClassVar[dict[str, Any]] = {"type": "object"}

    @model_validator(mode="before")
    @classmethod
    def _against_schema(cls, data: Any) -> Any:
        import jsonschema

        validator = jsonschema.validators.validator_for(cls.plugin_schema)(cls.plugin_schema)
        errors = sorted(validator.iter_errors(data), key=lambda e: [str(p) for p in e.absolute_path])
        if errors:
            details = [
                InitErrorDetails(
                    type=PydanticCustomError("json_schema", "{problem}", {"problem": err.message[:500]}),
                    loc=tuple(str(p) for p in err.absolute_path),
                    input=err.instance,
                )
                for err in errors[:20]
            ]
            raise ValidationError.from_exception_data(cls.__name__, details)
        return data

    def arguments(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


class ExternalArgs(PluginArgs):
    """The arguments of a client's own tool (``tool.check``): any object; the client validates them."""


def args_model(plugin_id: str, tool: ToolManifest) -> type[PluginArgs]:
    name = f"Args_{id_safe(plugin_id)}_{tool.name.replace('-', '_')}"
    model: type[PluginArgs] = type(name, (PluginArgs,), {"plugin_schema": tool.parameters, "__module__": __name__})
    return model


def schema_of(spec: ToolSpec) -> dict[str, Any]:
    """A tool's arguments' JSON Schema: a plugin tool's manifest's, a built-in's from its model."""
    if issubclass(spec.params, PluginArgs):
        return dict(spec.params.plugin_schema)
    return spec.params.model_json_schema()


# ------------------------------------------------------------------------------ a declared plugin


@dataclass(frozen=True)
class PluginTool:
    plugin: Plugin
    manifest: ToolManifest
    spec: ToolSpec

    @property
    def internal(self) -> str:
        return f"plugin.{self.plugin.id}.{self.manifest.name}"

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.spec.name,
            "internal_name": self.internal,
            "plugin": self.plugin.id,
            "description": self.spec.description,
            "parameters": schema_of(self.spec),
            "risk": self.manifest.risk,
        }


@dataclass(frozen=True)
class Plugin:
    manifest: Manifest
    path: Path  # the manifest file
    directory: Path  # its directory, resolved: bound read-only at jail_dir
    warnings: tuple[str, ...] = ()
    declared: Path | None = None  # the manifest's path as it was given (absolute, not resolved)
    tools: dict[str, PluginTool] = field(default_factory=dict, compare=False)  # by exposed name

    @property
    def id(self) -> str:
        return self.manifest.id

    @property
    def jail_dir(self) -> str:
        return f"{JAIL_ROOT}/{self.id}"

    @classmethod
    def load(cls, path: str | Path) -> Plugin:
        """A manifest file, validated; INVALID_ARGUMENT naming the file and each bad field."""
        file = Path(path).expanduser()
        try:
            raw = json.loads(file.read_text(encoding="utf-8"))
        except OSError as exc:
            raise InvalidArgument(f"plugin manifest {file}: {exc.strerror or exc}", file=str(file)) from None
        except (ValueError, UnicodeDecodeError) as exc:
            raise InvalidArgument(f"plugin manifest {file} is not JSON: {exc}", file=str(file)) from None
        try:
            manifest = Manifest.model_validate(raw)
        except ValidationError as exc:
            problems = [
                {"field": ".".join(str(p) for p in err["loc"]) or "(manifest)", "problem": err["msg"]}
                for err in exc.errors()
            ]
            text = "; ".join(f"{p['field']}: {p['problem']}" for p in problems)
            raise InvalidArgument(
                f"invalid plugin manifest {file}: {text}", file=str(file), problems=problems
            ) from None
        directory = file.resolve().parent
        problem = _link_refusal(file) or _dir_refusal(directory)
        if problem is not None:
            raise InvalidArgument(f"plugin manifest {file}: {problem}", file=str(file), directory=str(directory))
        named = Path(os.path.abspath(file))
        plugin = cls(manifest, file.resolve(), directory, tuple(risk_warnings(raw)), declared=named)
        for tool in manifest.tools:
            spec = ToolSpec(
                exposed_name(manifest.id, tool.name),
                args_model(manifest.id, tool),
                "execute",
                tool.description or f"{tool.name} (plugin {manifest.id})",
                plugin=True,
                plugin_risk=tool.risk,
            )
            plugin.tools[spec.name] = PluginTool(plugin, tool, spec)
        return plugin

    def describe(self, registered: bool) -> dict[str, Any]:
        return {
            "id": self.id,
            "name": self.manifest.name or self.id,
            "description": self.manifest.description,
            "manifest": str(self.path),
            "directory": str(self.directory),
            "jail_directory": self.jail_dir,
            "registered": registered,
            "warnings": list(self.warnings),
            "tools": [tool.describe() for tool in self.tools.values()],
        }


def _link_refusal(file: Path) -> str | None:
    """Why a manifest reached through a symlink that leads out of where it was declared is refused, or None.

    The directory bound into the jail is the one the manifest really lies in: the manifest must
    lie in its directory as named (``folder/kit.json -> ~/x/plugin.json`` is refused), and that
    directory in the folder that names it (``folder/kit -> /``, ``-> ~`` or ``-> ../..`` is
    refused): a folder of plugins never shows the jail more than it holds. Links above the folder
    (the user's own layout) are followed."""
    named = Path(os.path.abspath(file))
    real = named.resolve()
    if real.parent != named.parent.resolve():
        return f"it is a symlink to {real}, outside its directory {named.parent}; declare the manifest where it lies"
    folder = named.parent.parent.resolve()
    if not real.parent.is_relative_to(folder):
        return (
            f"its directory {named.parent} is a symlink to {real.parent}, outside {named.parent.parent}; "
            "declare the manifest where it lies"
        )
    return None


def _dir_refusal(directory: Path) -> str | None:
    """Why a plugin's directory may not be shown to a jail (it would show a home or a secret), or None."""
    from sandbox import datadir

    home = Path(os.path.expanduser("~")).resolve()
    if directory == Path("/") or home.is_relative_to(directory):
        return f"its directory {directory} holds your home; put the plugin in a directory of its own"
    if directory.is_relative_to(home):
        reason = envrules.secret_reason(PurePosixPath(directory.relative_to(home)))
        if reason is not None:
            return f"its directory {directory} is a secret ({reason}); it is never shown to a jail"
    data = datadir.data_dir().resolve()
    if directory.is_relative_to(data) or data.is_relative_to(directory):
        return f"its directory {directory} holds the sandbox's own data directory"
    return None


def load_all(paths: Sequence[str | Path]) -> list[Plugin]:
    """Manifests, each id once (two plugins of one id, or one exposed name twice: INVALID_ARGUMENT)."""
    plugins: list[Plugin] = []
    for path in paths:
        plugin = Plugin.load(path)
        for other in plugins:
            if other.id == plugin.id and other.path == plugin.path:
                break
            if id_safe(other.id) == id_safe(plugin.id):
                raise InvalidArgument(
                    f"plugins {other.path} and {plugin.path} have the id {plugin.id!r} (or one that exposes the same "
                    "tool names); ids must differ",
                    plugin=plugin.id,
                )
        else:
            plugins.append(plugin)
    return plugins


def from_project(plugin: Plugin, workspace: Path) -> bool:
    """Whether the project declared ``plugin``: its manifest, as named or as it resolves, or a
    directory on the way to it, lies in the (real) ``workspace`` (pi declares the manifests of the
    project's ``.pi/sandbox-plugins/``)."""
    ws = workspace.resolve()
    if plugin.path.is_relative_to(ws):
        return True
    named = plugin.declared or plugin.path
    return any(step.resolve().is_relative_to(ws) for step in (named, *named.parents))


def check_declared(plugins: Sequence[Plugin], workspace: Path, *, trusted: bool, granted: Sequence[str]) -> None:
    """A declaration the project ships never widens what the jail sees on its own: a plugin it
    declared whose directory lies outside the workspace is INVALID_ARGUMENT unless the project is
    trusted (:mod:`sandbox.policy.trust`) **and** the user granted the plugin up front (a grant
    asked later comes after the jail's mounts are fixed). One whose directory lies in the workspace
    shows nothing the jail does not see already, sealed as the workspace is."""
    ws = workspace.resolve()
    for plugin in plugins:
        if plugin.directory.is_relative_to(ws) or not from_project(plugin, workspace):
            continue
        if trusted and plugin.id in granted:
            continue
        missing = " and ".join(
            what
            for what, given in (
                ("the project's trust", trusted),
                (f"a grant of plugin {plugin.id}", plugin.id in granted),
            )
            if not given
        )
        raise InvalidArgument(
            f"plugin {plugin.id}: the project declares it ({plugin.declared or plugin.path}) with its directory "
            f"{plugin.directory} outside the workspace; binding it needs {missing} (sandbox trust, --grant-plugin)",
            plugin=plugin.id,
            directory=str(plugin.directory),
            rule_id="plugin.project-outside",
        )


def jail_binds(plugins: Sequence[Plugin]) -> tuple[tuple[str, str], ...]:
    """``(host directory, jail directory)`` of each plugin, for the profile's read-only binds."""
    return tuple((str(p.directory), p.jail_dir) for p in plugins)


# ------------------------------------------------------------------------------ a session's tools


class PluginHost:
    """One session's plugins and tools: what it declared, what the user granted, what it can call.

    ``tools`` is the session's registry (the built-ins and its registered plugin tools): the
    session validates against it and the gate looks tools up in it (with the client's own tools
    that ``tool.check`` put to the gate, which nothing can call). Never shared between sessions.
    """

    def __init__(self, plugins: Sequence[Plugin] = ()) -> None:
        self.declared: dict[str, Plugin] = {p.id: p for p in plugins}
        self.registered: set[str] = set()
        self.tools: dict[str, ToolSpec] = dict(REGISTRY)
        self._plugin_tools: dict[str, PluginTool] = {}
        self._external: dict[str, ToolSpec] = {}

    def lookup(self, name: str) -> ToolSpec:
        """Boundary 1 as the gate sees it: the session's tools, then the client tools it was asked about."""
        spec = self.tools.get(name) or self._external.get(name)
        if spec is not None:
            return spec
        known = ", ".join(sorted(self.tools))
        raise ToolDenied(
            f"unknown tool {name!r}: it is not available in this sandbox; available tools: {known}",
            tool=name,
            rule_id="capability.unknown-tool",
        )

    def plugin(self, plugin_id: str) -> Plugin:
        try:
            return self.declared[plugin_id]
        except KeyError:
            known = ", ".join(sorted(self.declared)) or "none"
            raise InvalidArgument(
                f"no plugin {plugin_id!r} was declared for this session (declared: {known})", plugin=plugin_id
            ) from None

    def register(self, plugin_id: str) -> Plugin:
        plugin = self.plugin(plugin_id)
        for name, tool in plugin.tools.items():
            if name in REGISTRY:  # cannot happen (plugin_ prefix), but a built-in is never replaced
                raise InvalidArgument(f"a built-in tool is named {name!r}", tool=name)
            self.tools[name] = tool.spec
            self._plugin_tools[name] = tool
        self.registered.add(plugin_id)
        return plugin

    def tool(self, name: str) -> PluginTool | None:
        """The registered plugin tool of that exposed name, or None (a built-in, or unknown)."""
        return self._plugin_tools.get(name)

    def external(self, name: str) -> ToolSpec:
        """The spec the gate decides a client's own tool by: a plugin-like tool of medium risk."""
        if not _EXTERNAL.match(name):
            raise InvalidArgument(
                f"{name!r} is not a tool name (letters, digits, '_', '.', ':' and '-', at most 128)", tool=name
            )
        if name in self.tools:
            raise InvalidArgument(
                f"{name} is a tool of this sandbox; call it with tool.call, not tool.check", tool=name
            )
        spec = self._external.get(name)
        if spec is None:
            description = f"{name}: a tool of the client, run by the client"
            spec = ToolSpec(name, ExternalArgs, "execute", description, plugin=True, plugin_risk=DEFAULT_RISK)
            self._external[name] = spec
        return spec

    def listing(self, visible: bool = True) -> list[dict[str, Any]]:
        """Every declared plugin with its tools; ``visible`` False (plan, goal): say they are hidden."""
        plugins = [p.describe(p.id in self.registered) for p in self.declared.values()]
        for item in plugins:
            item["visible"] = visible and item["registered"]
        return plugins

    def registered_tools(self) -> list[dict[str, Any]]:
        return [tool.describe() for tool in self._plugin_tools.values()]


# ------------------------------------------------------------------------------ registration


def registration_text(plugin: Plugin) -> tuple[str, str]:
    """The approval card's resource (the tools and their risks) and reason."""
    tools = ", ".join(f"{name} (risk {t.manifest.risk})" for name, t in plugin.tools.items())
    reason = (
        f"plugin {plugin.id} ({plugin.directory}) asks to register {len(plugin.tools)} tool(s) the model may call; "
        "each runs the plugin's command inside the jail, asked or allowed by its risk"
    )
    if plugin.warnings:
        reason += "; " + "; ".join(plugin.warnings)
    return tools, reason
