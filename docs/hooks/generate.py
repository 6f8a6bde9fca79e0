"""A mkdocs hook: the reference parts of the site written from the code itself, at build time.

A page asks for a part with an HTML comment on a line of its own, ``<!-- generated: NAME -->``;
the hook replaces it with markdown made from the package the build imports (nothing generated is
committed, so the page cannot drift from the code):

- ``profile-schema``: every table of a profile (the pydantic models of sandbox.profile,
  sandbox.profile_tables and sandbox.profile_policy) with each key's type, default, bounds and
  description (the field's own ``description``, else the comments beside it in the model's source),
  each table introduced by its model's docstring;
- ``guarantees``: the guarantee names a profile may require, with what each means;
- ``shipped-profiles``: the shipped profiles (``sandbox profiles``) side by side, then each one's TOML;
- ``cli``: ``sandbox --help`` and every subcommand's help;
- ``modules``: the package's modules, each with the first paragraph of its docstring.

An unknown name fails the build, as does anything the generators cannot render.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import html
import inspect
import io
import os
import re
import tokenize
import tomllib
import types
import typing
from pathlib import Path, PurePath
from typing import TYPE_CHECKING, Any, Literal, get_args, get_origin

from pydantic import BaseModel

import sandbox
from sandbox.cli import build_parser
from sandbox.profile import Profile, available, load
from sandbox.profile_tables import parse_size
from sandbox.vocabulary import GUARANTEE_DESCRIPTIONS as DESCRIPTIONS

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from mkdocs.config.defaults import MkDocsConfig
    from mkdocs.structure.files import Files
    from mkdocs.structure.pages import Page
    from pydantic.fields import FieldInfo

PLACEHOLDER = re.compile(r"^<!-- generated: (?P<name>[\w-]+) -->$", re.MULTILINE)
_ROLE = re.compile(r":(?:mod|func|class|meth|data|attr):`~?\.?([^`]+)`")
_RST_CODE = re.compile(r"``(.+?)``", re.DOTALL)
_HELP_COLUMNS = "100"


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, files: Files) -> str:  # noqa: ARG001
    """Each ``<!-- generated: NAME -->`` line of a page, replaced by what NAME's generator writes."""

    def render(match: re.Match[str]) -> str:
        name = match["name"]
        if name not in GENERATORS:
            raise ValueError(f"{page.file.src_uri}: unknown generated part {name!r}; known: {', '.join(GENERATORS)}")
        return GENERATORS[name]()

    return PLACEHOLDER.sub(render, markdown)


# Text: docstrings and comments as markdown.


def prose(text: str) -> str:
    """A docstring or comment as markdown: reST's ``code`` and :role:`target` become code spans."""
    text = _ROLE.sub(lambda m: f"``{m[1]}``", inspect.cleandoc(text))
    return _RST_CODE.sub(lambda m: f"`{m[1]}`", text)


def cell(text: str) -> str:
    """``text`` made safe inside a markdown table cell: one line, pipes and angle brackets escaped
    outside code spans (inside them markdown shows them as they are)."""
    parts = re.split(r"(`[^`]*`)", " ".join(text.split()))
    escaped = (p if p.startswith("`") else html.escape(p, quote=False).replace("|", "&#124;") for p in parts)
    return "".join(escaped)


def first_paragraph(doc: str) -> str:
    return prose(doc).split("\n\n", 1)[0]


# The profile schema.


def size_text(value: int) -> str:
    """Bytes the way a profile writes them: the largest binary unit that divides them exactly."""
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if value >= scale and value % scale == 0:
            return f"{value // scale} {unit}"
    return f"{value} bytes"


def is_size(metadata: list[Any]) -> bool:
    return any(getattr(m, "func", None) is parse_size for m in metadata)


def type_text(annotation: Any, metadata: list[Any] | None = None) -> str:
    """A field's type in a profile's words: ``size``, ``list of string``, ``"a" or "b"``, ``table``."""
    if metadata and is_size(metadata):
        return "size"
    origin = get_origin(annotation)
    args = get_args(annotation)
    if origin is typing.Annotated:
        return type_text(args[0], list(args[1:]))
    if origin is Literal:
        if set(args) == set(DESCRIPTIONS):
            return "guarantee name"
        return " or ".join(f'`"{a}"`' if isinstance(a, str) else f"`{str(a).lower()}`" for a in args)
    if origin in (typing.Union, types.UnionType):
        kinds = [type_text(a) for a in args if a is not type(None)]
        return " or ".join(dict.fromkeys(kinds))
    if origin is tuple:
        return f"list of {type_text(args[0])}"
    if origin is dict:
        return f"table of {type_text(args[0])} to {type_text(args[1])}"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "table"
    names = {bool: "boolean", int: "integer", float: "number", str: "string", Path: "path", Any: "any value"}
    return names.get(annotation, getattr(annotation, "__name__", str(annotation)))


def default_text(field: FieldInfo) -> str:
    if field.is_required():
        return "required"
    value = field.get_default(call_default_factory=True)
    if value is None:
        return "unset"
    if isinstance(value, BaseModel):
        return "(its table)"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, int) and (is_size(field.metadata) or _annotated_size(field.annotation)):
        return f'`"{size_text(value)}"`'
    if isinstance(value, str):
        return f'`"{value}"`'
    if isinstance(value, tuple | list):
        return "`[" + ", ".join(f'"{v}"' for v in value) + "]`"
    if isinstance(value, dict):
        return "`{}`" if not value else f"`{value}`"
    return f"`{value}`"


def _annotated_size(annotation: Any) -> bool:
    """Whether a ``Size | None`` union's size part is one (the union keeps its Annotated member)."""
    return any(get_origin(a) is typing.Annotated and is_size(list(get_args(a)[1:])) for a in get_args(annotation))


def bounds_text(field: FieldInfo) -> str:
    words = {"ge": "≥", "gt": ">", "le": "≤", "lt": "<", "min_length": "at least"}
    found = []
    for item in field.metadata:
        for attr, word in words.items():
            value = getattr(item, attr, None)
            if value is not None:
                found.append(f"{word} {value:g}" if isinstance(value, int | float) else f"{word} {value}")
    return ", ".join(found)


def field_comments(model: type[BaseModel]) -> dict[str, str]:
    """Each field's comments in the model's source: the comment lines just above it, then the one
    at the end of its line(s)."""
    source = _dedent(inspect.getsource(model))
    comments: dict[int, str] = {}
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            comments[token.start[0]] = token.string.lstrip("#").strip()
    lines = source.splitlines()
    found: dict[str, str] = {}
    cls = ast.parse(source).body[0]
    assert isinstance(cls, ast.ClassDef)
    for node in cls.body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        above: list[str] = []
        line = node.lineno - 1
        while line >= 1 and lines[line - 1].strip().startswith("#"):
            above.insert(0, comments[line])
            line -= 1
        trailing = [comments[n] for n in range(node.lineno, (node.end_lineno or node.lineno) + 1) if n in comments]
        found[node.target.id] = " ".join([*above, *trailing])
    return found


def _dedent(source: str) -> str:
    indent = len(source) - len(source.lstrip(" "))
    return "\n".join(line[indent:] for line in source.splitlines())


def sections() -> Iterator[tuple[str, type[BaseModel]]]:
    """``(key, model)`` of the profile and of each table in it, depth first, as a file nests them."""

    def walk(prefix: str, model: type[BaseModel]) -> Iterator[tuple[str, type[BaseModel]]]:
        yield prefix, model
        for name, field in model.model_fields.items():
            if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
                yield from walk(f"{prefix}.{name}" if prefix else name, field.annotation)

    yield from walk("", Profile)


KEYS_FILE = Path(__file__).with_name("profile-keys.toml")


def key_descriptions() -> dict[str, str]:
    """``profile-keys.toml``: words for the keys the code leaves undescribed; stale entries fail."""
    written: dict[str, str] = tomllib.loads(KEYS_FILE.read_text(encoding="utf-8"))
    described = {
        f"{key}.{name}" if key else name: bool(field.description or field_comments(model).get(name))
        for key, model in sections()
        for name, field in model.model_fields.items()
    }
    unknown = sorted(set(written) - set(described))
    if unknown:
        raise ValueError(f"{KEYS_FILE.name}: no such profile keys: {', '.join(unknown)}")
    twice = sorted(k for k in written if described[k])
    if twice:
        raise ValueError(f"{KEYS_FILE.name}: the code describes these keys now, drop them here: {', '.join(twice)}")
    return written


def profile_schema() -> str:
    out: list[str] = []
    extra = key_descriptions()
    for key, model in sections():
        out.append(f"### `[{key}]` {{ #{_anchor(key)} }}" if key else f"### The top level {{ #{_anchor(key)} }}")
        if model.__doc__ and key:
            out += ["", prose(model.__doc__)]
        out += ["", "| key | type | default | bounds | what it does |", "|---|---|---|---|---|"]
        comments = field_comments(model)
        for name, field in model.model_fields.items():
            kind = type_text(field.annotation, field.metadata)
            if kind == "table":
                inner = f"{key}.{name}" if key else name
                kind, default = f"table: [`[{inner}]`](#{_anchor(inner)})", ""
            else:
                default = default_text(field)
            dotted = f"{key}.{name}" if key else name
            what = field.description or comments.get(name) or extra.get(dotted, "")
            out.append(
                f"| `{name}` | {cell(kind)} | {cell(default)} | {cell(bounds_text(field))} | {cell(prose(what))} |"
            )
        out.append("")
    return "\n".join(out)


def _anchor(key: str) -> str:
    """The id of table ``key``'s heading (``schema-top`` for the top level)."""
    return "schema-" + (key.replace(".", "-") if key else "top")


def guarantees() -> str:
    rows = [f"| `{name}` | {cell(what)} |" for name, what in DESCRIPTIONS.items()]
    return "\n".join(["| guarantee | what it means |", "|---|---|", *rows, ""])


# The shipped profiles.


def shipped_profiles() -> str:
    def size(value: int | None) -> str:
        return "—" if value is None else size_text(value)

    out = [
        "| profile | backend | mount | network | memory | pids | file size | /tmp | timeout default / max | requires |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    texts = []
    for name, path in available().items():
        prof = load(name)
        limits, timeouts = prof.limits, prof.timeouts
        out.append(
            f"| [`{name}`](#profile-{name}) | {prof.backend} | {prof.mount.strategy} | {prof.network.mode} | "
            f"{size(limits.memory)} | {limits.pids or '—'} | {size(limits.file_size)} | {size(limits.tmp_size)} | "
            f"{timeouts.default_s:g} s / {timeouts.max_s:g} s | {cell(', '.join(prof.requires) or '—')} |"
        )
        texts += [
            f"### `{name}` {{ #profile-{name} }}",
            "",
            cell(prof.description),
            "",
            "```toml",
            path.read_text(encoding="utf-8").rstrip(),
            "```",
            "",
        ]
    return "\n".join([*out, "", *texts])


# The command line.


def cli() -> str:
    with _columns(_HELP_COLUMNS):  # argparse reads $COLUMNS as the parser is built
        parser = build_parser()
        return "\n".join(_help_sections(parser, level=3))


@contextlib.contextmanager
def _columns(width: str) -> Iterator[None]:
    before = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = width
    try:
        yield
    finally:
        if before is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = before


def _help_sections(parser: argparse.ArgumentParser, level: int) -> Iterator[str]:
    yield f"{'#' * level} `{parser.prog}`"
    yield ""
    yield "```text"
    yield parser.format_help().rstrip()
    yield "```"
    yield ""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            seen: set[int] = set()
            for child in action.choices.values():
                if id(child) not in seen:  # an alias names the same parser twice
                    seen.add(id(child))
                    yield from _help_sections(child, min(level + 1, 6))


# The package's modules.


def modules() -> str:
    root = Path(sandbox.__file__).resolve().parent
    rows = ["| module | what it holds |", "|---|---|"]
    for path in sorted(root.rglob("*.py"), key=_module_order):
        if "__pycache__" in path.parts:
            continue
        doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
        name = PurePath("sandbox", path.relative_to(root)).as_posix()
        rows.append(f"| `{name}` | {cell(first_paragraph(doc))} |")
    return "\n".join([*rows, ""])


def _module_order(path: Path) -> tuple[str, ...]:
    """A package's ``__init__`` first, then its modules, then its sub-packages."""
    parts = path.parts
    return (*parts[:-1], "" if path.name == "__init__.py" else path.name)


GENERATORS: dict[str, Callable[[], str]] = {
    "profile-schema": profile_schema,
    "guarantees": guarantees,
    "shipped-profiles": shipped_profiles,
    "cli": cli,
    "modules": modules,
}
