"""The fences between the package's layers, read statically from the source.

Every import counts: at module level, inside a function, or under ``TYPE_CHECKING`` (a type-only
import still ties one layer to another). Relative imports are resolved against the importing
module. A failure names the module, the line and the import that crosses the fence.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

import sandbox

if TYPE_CHECKING:
    from collections.abc import Collection, Iterator

PACKAGE = Path(sandbox.__file__).parent
JAILSIDE = "sandbox._jailside"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules(package: str) -> list[Path]:
    root = PACKAGE.parent.joinpath(*package.split("."))
    return sorted(root.rglob("*.py")) if root.is_dir() else [root.with_suffix(".py")]


def _imports(path: Path) -> Iterator[tuple[int, str]]:
    """``(line, name)`` for each name imported; ``from a import b`` yields ``a.b``."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(path, node)
            for alias in node.names:
                yield node.lineno, f"{base}.{alias.name}"


def _absolute(path: Path, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    package = _module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    anchor = package[: len(package) - (node.level - 1)]
    return ".".join([*anchor, node.module] if node.module else anchor)


def _within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def _crossings(package: str, forbidden: tuple[str, ...]) -> list[str]:
    return sorted(
        {
            f"{_module_name(path)} (line {line}) imports {name}"
            for path in _modules(package)
            for line, name in _imports(path)
            if any(_within(name, other) for other in forbidden)
        }
    )


def test_jailside_code_imports_only_the_standard_library() -> None:
    found = sorted(
        f"{_module_name(path)} (line {line}) imports {name}, which is not in the standard library"
        for path in _modules(JAILSIDE)
        for line, name in _imports(path)
        if not _within(name, JAILSIDE) and name.split(".")[0] not in sys.stdlib_module_names
    )
    assert found == []


@pytest.mark.parametrize(
    ("package", "forbidden"),
    [
        ("sandbox.policy", ("sandbox.backends",)),
        ("sandbox.backends", ("sandbox.session", "sandbox.server", "sandbox.tools")),
    ],
)
def test_a_layer_imports_nothing_from_the_layers_above_it(package: str, forbidden: tuple[str, ...]) -> None:
    assert _crossings(package, forbidden) == []


def test_the_fences_see_relative_and_type_only_imports() -> None:
    # The checks above pass vacuously if the walker misses imports; make sure it does not.
    names = {name for _, name in _imports(PACKAGE / "_jailside" / "runner.py")}
    assert {"sandbox._jailside.glob.glob_regex", "collections.abc.Callable"} <= names
    node = ast.parse("from ..backends import base").body[0]
    assert isinstance(node, ast.ImportFrom)
    assert _absolute(PACKAGE / "policy" / "gate.py", node) == "sandbox.backends"
    assert _absolute(PACKAGE / "policy" / "__init__.py", node) == "sandbox.backends"


# -- the whole package: no circle, the declared layer order, no private name borrowed

# Bottom first. A module may import its own layer and those below it, never one above: the order
# is the package's structure, stated once. A name is a module or a package (all below it).
LAYERS: tuple[tuple[str, ...], ...] = (
    (  # the bottom: words, errors, bounds, threads, owners, redaction, the data directory
        "sandbox._jailside",
        "sandbox.vocabulary",
        "sandbox.faces",
        "sandbox.errors",
        "sandbox.textsafe",
        "sandbox.jsonbound",
        "sandbox.diffbound",
        "sandbox.ending",
        "sandbox.protocol",
        "sandbox.threads",
        "sandbox.owners",
        "sandbox.redaction",
        "sandbox.live",
        "sandbox.patterns",
        "sandbox.datadir",
        "sandbox.envrules",
    ),
    (  # what a user configures: profiles, the guarantees they ask for, network rules, images
        "sandbox.profile",
        "sandbox.profile_tables",
        "sandbox.profile_policy",
        "sandbox.guarantees",
        "sandbox.downloads",
        "sandbox.image",
        "sandbox.shells",
        "sandbox.imagehost",
        "sandbox.network.policy",
        "sandbox.network.indexes",
        "sandbox.network.places",
        "sandbox.network.reqrules",
        "sandbox.network.userlist",
    ),
    (  # the copy-out engine, and session snapshots (their layers)
        "sandbox.mounts",
        "sandbox.review",
        "sandbox.changes",
        "sandbox.changesummary",
        "sandbox.snapshots",
    ),
    (  # jails and their network
        "sandbox.backends",
        "sandbox.network",
        "sandbox.calls",
        "sandbox.remedy",
        "sandbox.diskguard",
        "sandbox.gitsweep",
        "sandbox.leftovers",
    ),
    ("sandbox.exec", "sandbox.tools", "sandbox.compare"),  # running a command, a tool, a comparison
    ("sandbox.policy", "sandbox.plugins", "sandbox.audit"),  # the permission layer
    ("sandbox.session",),
    (  # the faces
        "sandbox.server",
        "sandbox.server_messages",
        "sandbox.server_requests",
        "sandbox.jsonrpc",
        "sandbox.mcp",
        "sandbox.cli",
    ),
)


def _all_modules() -> dict[str, Path]:
    return {_module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def _module_of(name: str, modules: Collection[str]) -> str | None:
    """The module an imported name lives in (``a.b.c`` of ``from a.b import c``: ``a.b.c`` when that
    is a module, else ``a.b``), or ``None`` outside the package."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def _layer(module: str) -> int:
    """The layer of ``module``: its most specific entry in :data:`LAYERS`."""
    found = [(len(entry), index) for index, layer in enumerate(LAYERS) for entry in layer if _within(module, entry)]
    assert found, f"{module} is in no layer of LAYERS: add it where it belongs"
    return max(found)[1]


def _graph() -> dict[str, set[str]]:
    modules = _all_modules()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        if name == "sandbox":
            continue  # the package's face: it names the public API lazily, imported by no layer
        for _line, imported in _imports(path):
            target = _module_of(imported, modules)
            if target is not None and target not in (name, "sandbox"):
                graph[name].add(target)
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_module_imports_another_that_imports_it_back() -> None:
    # Function-level and type-only imports count: a circle dodged by an import inside a function
    # is still a circle of the design.
    assert _circles(_graph()) == []


def test_every_import_runs_down_the_declared_layers() -> None:
    graph = _graph()
    upward = sorted(
        f"{name} (layer {_layer(name)}) imports {target} (layer {_layer(target)})"
        for name, targets in graph.items()
        for target in targets
        if _layer(target) > _layer(name)
    )
    assert upward == []


def test_no_private_name_is_borrowed_from_another_module() -> None:
    modules = _all_modules()
    borrowed = sorted(
        f"{name} (line {line}) imports {imported}"
        for name, path in modules.items()
        for line, imported in _imports(path)
        if (owner := _module_of(imported.rpartition(".")[0], modules)) not in (None, name)
        and imported.rpartition(".")[0] == owner
        and (leaf := imported.rpartition(".")[2]).startswith("_")
        and not (leaf.startswith("__") and leaf.endswith("__"))
        and f"{owner}.{leaf}" not in modules
    )
    assert borrowed == []


def test_the_whole_package_fences_see_what_they_must() -> None:
    # The checks above pass vacuously if the graph misses edges; a few known ones must be there.
    graph = _graph()
    assert "sandbox.mounts" in graph["sandbox.backends.bwrap"] and "sandbox.mounts.trees" in graph["sandbox.mounts"]
    assert "sandbox.mounts.journal" in graph["sandbox.backends.base"]
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _layer("sandbox.network.places") == 1 and _layer("sandbox.network.egress") == 3
    assert _layer("sandbox.mounts.journal") == 2 and _layer("sandbox.cli.run") == len(LAYERS) - 1


MAX_LINES = 600
"""A module past this holds more than one idea: split it by concept (issue 34)."""


def test_no_module_is_over_600_lines() -> None:
    long = sorted(
        f"{name}: {lines} lines"
        for name, path in _all_modules().items()
        if (lines := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    )
    assert long == []
