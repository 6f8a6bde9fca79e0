"""One glob dialect: a pattern means the same in a policy rule as in the Glob and Grep tools.

The policy once read ``{`` literally while the Glob tool read it as a choice, so a rule such as
``*.{pem,key}`` protected nothing. Each case below is checked on both sides of the boundary: by
the policy's matcher on the host, and by the file-tool runner shipped into a jail exactly as
``run_in_jail`` ships it (here under this interpreter, ``-I -S``, with no jail around it).
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import TYPE_CHECKING, Any

import pytest

from sandbox.patterns import PatternSet
from sandbox.policy.gate import SessionState
from sandbox.policy.paths import PathPolicy
from sandbox.tools.run import RUNNER_PROGRAM

if TYPE_CHECKING:
    from pathlib import Path

    from tests.unit.policy.policy_world import World


def test_a_brace_deny_rule_matches_each_alternative(world: World) -> None:
    paths = PathPolicy(world.ws, world.scratch, deny_write=("*.{pem,key}",))
    for name in ("secret.pem", "id.key", "nested/dir/id.key"):
        finding = paths.protection(paths.resolve(name), "write")
        assert finding is not None and (finding.layer, finding.rule_id) == ("deny", "path.deny-write"), name
    assert paths.protection(paths.resolve("secret.pem.txt"), "write") is None


def test_a_brace_rule_in_the_profile_denies_a_read(world: World) -> None:
    gate = world.gate(deny_read=("*.{crt,p12}",))
    for name in ("server.crt", "client.p12"):
        decision = gate.evaluate(world.call("Read", {"path": name}), SessionState("s1"))
        assert (decision.level, decision.rule_id) == ("deny", "path.deny-read"), name
    assert gate.evaluate(world.call("Read", {"path": "README.md"}), SessionState("s1")).level == "allow"


# (pattern, the files of TREE it matches); every other file of TREE must not match.
TREE = (
    "a.py",
    "a.pyc",
    "b.txt",
    "ab.txt",
    "secret.pem",
    "id.key",
    "id.kay",
    "key.pam",
    "a{b",
    "a[b",
    "x,y",
    "data1.csv",
    "c.txt",
    "src/app.py",
    "src/deep/mod.py",
    "src/secret.pem",
    "lib/util.py",
    "lib/]x",
    "docs/x.md",
)
CASES: list[tuple[str, set[str]]] = [
    ("*.{pem,key}", {"secret.pem", "id.key"}),
    ("**/*.{pem,key}", {"secret.pem", "id.key", "src/secret.pem"}),
    ("*.{p[ae]m,k?y}", {"secret.pem", "id.key", "id.kay", "key.pam"}),
    ("{src,lib}/*.py", {"src/app.py", "lib/util.py"}),
    ("{*.txt,{src,docs}/*.{py,md}}", {"b.txt", "ab.txt", "c.txt", "src/app.py", "docs/x.md"}),
    ("**/*.py", {"a.py", "src/app.py", "src/deep/mod.py", "lib/util.py"}),
    ("src/**/*.py", {"src/app.py", "src/deep/mod.py"}),
    ("src/**", {"src/app.py", "src/deep/mod.py", "src/secret.pem"}),
    ("*.py", {"a.py"}),
    ("?.txt", {"b.txt", "c.txt"}),
    ("[ab].txt", {"b.txt"}),
    ("[!b].txt", {"c.txt"}),
    ("[^b].txt", {"c.txt"}),
    ("data[0-9].csv", {"data1.csv"}),
    ("lib/[]]x", {"lib/]x"}),
    ("a{b", {"a{b"}),
    ("x,y", {"x,y"}),
    ("a[b", {"a[b"}),
]


@pytest.mark.parametrize(("pattern", "expected"), CASES)
def test_the_policy_reads_each_pattern_in_the_one_dialect(pattern: str, expected: set[str]) -> None:
    matcher = PatternSet((f"/root/{pattern}",), homes=())
    assert {path for path in TREE if matcher.matches(f"/root/{path}")} == expected


def test_the_runner_globs_each_pattern_in_the_one_dialect(tmp_path: Path) -> None:
    root = tmp_path.resolve()
    for path in TREE:
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text("x")
    for pattern, expected in CASES:
        reply = _run_shipped({"op": "glob", "path": str(root), "pattern": pattern})
        assert reply["ok"], reply
        assert {p[len(str(root)) + 1 :] for p in reply["details"]["paths"]} == expected, pattern


def test_the_grep_include_filter_speaks_the_same_dialect(tmp_path: Path) -> None:
    root = tmp_path.resolve()
    for name in ("a.py", "b.md", "c.txt"):
        (root / name).write_text("needle\n")
    reply = _run_shipped({"op": "grep", "path": str(root), "pattern": "needle", "include": "*.{py,md}"})
    assert reply["ok"], reply
    assert sorted(hit[0] for hit in reply["details"]["hits"]) == [str(root / "a.py"), str(root / "b.md")]


def _run_shipped(request: dict[str, Any]) -> dict[str, Any]:
    # From "/", isolated and without site: nothing of this checkout is importable, as in a jail.
    done = subprocess.run(
        [sys.executable, "-I", "-S", "-c", RUNNER_PROGRAM],
        cwd="/",
        input=json.dumps(request).encode(),
        capture_output=True,
        check=False,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr.decode()
    reply: dict[str, Any] = json.loads(done.stdout)
    return reply


def test_a_dot_slash_rule_keeps_its_leading_dot(world: World) -> None:
    """``./.env`` once lost every leading dot and slash, so it protected a file named ``env``."""
    paths = PathPolicy(world.ws, world.scratch, deny_write=("./.env",))
    finding = paths.protection(paths.resolve(".env"), "write")
    assert finding is not None
    assert finding.rule_id == "path.deny-write"
    assert paths.protection(paths.resolve("env"), "write") is None
