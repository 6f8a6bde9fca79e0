"""``sandbox compare`` tells a CI reader the truth (issue 32, item 8), against real bubblewrap and Docker.

- A destructive probe that could not write at all (the jail's user lacks permission) or could
  not run gives ``n/a (why)``, never ``yes``; ``ro``'s own refusals (EROFS) still prove ``ro``.
- A failed cell's reason is the line that reads like an error, not a trailing warning or banner.
- The chart shows each cell's probe verdict and the min-max spread over repeats, and no two of
  its labels overlap, whatever the names and the number of cells.
- Cells run under ``--allow-host``/``--allow-index`` and ``--image``; progress (start, end with
  elapsed, throttled heartbeats) goes to stderr, never to the ``--json`` report on stdout.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import stat
import xml.etree.ElementTree as ET
from typing import TYPE_CHECKING, Any

import pytest

from sandbox import compare
from sandbox.compare.results import probe_verdict, relevant_line
from tests.conftest import backend_or_skip
from tests.integration.test_compare import SVG, docker_workspace, run_cli

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from tests.netlab import NetLab

BACKENDS = [pytest.param("bwrap", marks=pytest.mark.bwrap), pytest.param("docker", marks=pytest.mark.docker)]
DENIED = "n/a (probe could not write: Permission denied)"


# ------------------------------------------------------------------------------ the probe's verdict


@pytest.fixture
def unwritable(workspace: Path) -> Iterator[Path]:
    """A workspace nobody but root may write (a read-only checkout): directories 0555, files 0444,
    with its own ``.git/hooks``, so the probe meets EACCES wherever a mount does not stop it first."""
    hooks = workspace / ".git" / "hooks"
    hooks.mkdir(parents=True)
    (hooks / "pre-commit.sample").write_text("#!/bin/sh\nexit 0\n")
    paths = sorted(workspace.rglob("*"), reverse=True) + [workspace]
    for path in paths:
        path.chmod(0o555 if path.is_dir() else 0o444)
    yield workspace
    for path in [workspace, *workspace.rglob("*")]:
        if path.is_dir():
            path.chmod(stat.S_IMODE(path.stat().st_mode) | stat.S_IRWXU)


@pytest.mark.anyio
@pytest.mark.parametrize("name", BACKENDS)
async def test_probe_that_cannot_write_is_not_survival(name: str, unwritable: Path) -> None:
    backend_or_skip(name)
    plan = compare.make_plan(["true"], unwritable, backends=name, mounts="ro,rw", repeat=1)
    lines: list[str] = []
    report = await compare.compare(plan, lines.append)
    ro, rw = report.cells
    assert rw.safety is not None and rw.safety.survived is None, rw.safety
    assert rw.safety.inconclusive == "probe could not write: Permission denied", rw.safety
    assert f"destructive probe: {DENIED}" in lines[-1]
    table = compare.table(report)
    assert DENIED in next(line for line in table.splitlines() if line.split()[:2] == [name, "rw"])
    assert "survives probe" in table and "proved nothing about this strategy" in table
    # ro's refusals are the read-only mount's own (EROFS): that is its protection, credited.
    assert ro.safety is not None and ro.safety.survived is True and not ro.safety.inconclusive, ro.safety
    assert report.to_dict()["cells"][1]["safety"]["survived"] is None


@pytest.mark.parametrize(
    ("mount", "exit_code", "timed_out", "stderr", "changed", "expected"),
    [
        ("rw", 127, False, "/bin/sh: 1: rm: not found\n/bin/sh: 1: mkdir: not found\n", False, "could not run"),
        ("ro", 2, False, "rm: cannot remove './a': Read-only file system\n", False, ""),
        ("rw", 2, False, "sh: 1: cannot create x: Read-only file system\n", False, "Read-only file system"),
        ("copy", 1, False, "rm: cannot remove 'a': Operation not permitted\n", False, "Operation not permitted"),
        ("ro", 2, False, "rm: cannot remove './a': Permission denied\n", False, "Permission denied"),
        ("rw", 137, True, "", False, "probe timed out"),
        ("rw", 0, False, "", False, "probe changed nothing (exit 0)"),
        ("rw", 2, False, "rm: cannot remove './a': Permission denied\n", True, ""),
    ],
)
def test_probe_verdict(mount: str, exit_code: int, timed_out: bool, stderr: str, changed: bool, expected: str) -> None:
    why = probe_verdict(mount, exit_code, timed_out, stderr, changed)
    assert (expected in why) if expected else why == ""


# ------------------------------------------------------------------------------ a failure's reason


@pytest.mark.parametrize(
    ("output", "expected"),
    [
        (
            "Traceback (most recent call last):\n  File 'x', line 1\nValueError: boom\n"
            "[notice] A new release of pip is available: 23.0 -> 24.0\n",
            "ValueError: boom",
        ),
        ("error: could not compile `x`\nwarning: unused variable\n", "error: could not compile `x`"),
        (
            "npm ERR! code E404\nnpm ERR! 404 Not Found - GET http://r/x\n"
            "npm ERR! A complete log of this run can be found in:\nnpm ERR!     /tmp/home/.npm/_logs/1-debug-0.log\n",
            "npm ERR! 404 Not Found - GET http://r/x",
        ),
        ("ModuleNotFoundError: No module named 'x'\nPython 3.11.2\n", "ModuleNotFoundError: No module named 'x'"),
        ("collected 3 items\nsomething odd\nnode v18.19.0\n", "something odd"),
        ("only line\n", "only line"),
    ],
)
def test_failure_reason_is_the_error_line(output: str, expected: str) -> None:
    assert relevant_line(output) == expected


@pytest.mark.bwrap
def test_failed_cell_names_the_error_not_the_trailing_banner(workspace: Path, tmp_path: Path) -> None:
    backend_or_skip("bwrap")
    script = "echo 'error: the real reason' >&2; echo 'warning: later noise' >&2; echo 'tool 1.2.3' >&2; exit 4"
    done = run_cli("--backends", "bwrap", "--mounts", "rw", "--repeat", "1", "--workspace", str(workspace),
                   "--report", str(tmp_path), "--", "sh", "-c", script)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "exit 4 (error: the real reason)" in done.stderr
    assert "`error: the real reason`" in (tmp_path / "report.md").read_text()


# ------------------------------------------------------------------------------ the chart


def visible(element: ET.Element) -> str:
    """A <text>'s drawn characters (its <title> tooltip is not drawn)."""
    return (element.text or "") + "".join(child.tail or "" for child in element)


def boxes(root: ET.Element) -> list[tuple[str, float, float, float, float]]:
    """Every drawn, unrotated text's box, sized at 0.6 em per character (sans-serif's average)."""
    out = []
    default = float(root.get("font-size", "11"))
    for e in root.iter(f"{SVG}text"):
        text = visible(e)
        if not text or e.get("transform"):
            continue
        size = float(e.get("font-size", default))
        width, x, y = len(text) * size * 0.6, float(e.get("x", "0")), float(e.get("y", "0"))
        left = {"middle": x - width / 2, "end": x - width}.get(e.get("text-anchor", "start"), x)
        out.append((text, left, left + width, y - size, y))
    return out


def overlaps(root: ET.Element) -> list[tuple[str, str]]:
    found = []
    for a, b in itertools.combinations(boxes(root), 2):
        if a[1] < b[2] and b[1] < a[2] and a[3] < b[4] and b[3] < a[4]:
            found.append((a[0], b[0]))
    return found


def run(wall: float, exit_code: int = 0, stderr: str = "") -> compare.Run:
    return compare.Run(
        exit_code, False, wall, 1.0, wall / 3, wall / 7, None, None, 0, False, None,
        {"added": 0, "modified": 0, "deleted": 0, "flagged": 0}, stderr,
    )  # fmt: skip


def crowded(workspace: Path) -> compare.Report:
    """Many cells, long names, every kind of label: big figures, failures, skips, a baseline."""
    plan = compare.make_plan(["true"], workspace, backends="bwrap", mounts="ro", repeat=3, baseline=True)
    cells = [compare.Cell("host", "baseline", runs=[run(900.0), run(1000.0), run(1100.0)], baseline=True)]
    for i in range(14):
        backend = "docker-rootless-on-a-remote-engine" if i % 2 else f"bwrap-call-{i}"
        cell = compare.Cell(backend, ["ro", "rw", "copy", "overlay"][i % 4])
        cell.runs = [run(12345.0 * (i + 1), i % 3, "error: a very long reason that goes on and on")] * 3
        cell.safety = compare.Safety(
            None,
            2,
            False,
            {"added": 0, "modified": 0, "deleted": 0},
            None,
            inconclusive="probe could not write: Permission denied",
        )
        cells.append(cell)
    cells.append(compare.Cell("docker-rootless-on-a-remote-engine", "overlay", "skipped", "no overlay here"))
    return compare.Report(plan, cells=cells)


def test_chart_labels_never_collide(workspace: Path, tmp_path: Path) -> None:
    compare.write(crowded(workspace), tmp_path)
    root = ET.parse(tmp_path / "chart.svg").getroot()
    assert overlaps(root) == []
    verdicts = [e for e in root.iter(f"{SVG}text") if e.get("class") == "verdict"]
    assert len(verdicts) == 15 and {e.get("data-verdict") for e in verdicts[1:]} == {"n/a"}


@pytest.mark.bwrap
@pytest.mark.anyio
async def test_chart_shows_verdict_and_spread(workspace: Path, tmp_path: Path) -> None:
    backend_or_skip("bwrap")
    plan = compare.make_plan(["sh", "-c", "echo hi > out.txt"], workspace, backends="bwrap", mounts="ro,rw", repeat=3)
    report = await compare.compare(plan)
    compare.write(report, tmp_path)
    root = ET.parse(tmp_path / "chart.svg").getroot()
    verdicts = {e.get("data-verdict"): visible(e) for e in root.iter(f"{SVG}text") if e.get("class") == "verdict"}
    assert verdicts == {"yes": "survives: yes", "NO": "survives: NO"}
    cells = {c["mount"]: c for c in json.loads((tmp_path / "report.json").read_text())["cells"]}
    spreads = [e for e in root.iter(f"{SVG}path") if e.get("class") == "spread"]
    assert len(spreads) == 2 * 3  # two cells, three series each
    for e in spreads:
        walls = [r[str(e.get("data-series"))] for r in cells[str(e.get("data-cell")).split("/")[1]]["runs"]]
        assert (float(e.get("data-min", "-1")), float(e.get("data-max", "-1"))) == (min(walls), max(walls))
    assert overlaps(root) == []


# ------------------------------------------------------------------------------ progress and --json


@pytest.mark.bwrap
@pytest.mark.anyio
async def test_progress_start_finish_elapsed_and_throttled_heartbeat(workspace: Path) -> None:
    backend_or_skip("bwrap")
    plan = compare.make_plan(["sleep", "1.2"], workspace, backends="bwrap", mounts="rw", repeat=1)
    lines: list[str] = []
    await compare.compare(plan, lines.append, heartbeat_s=0.5)
    assert lines[0] == "[1/1] bwrap/rw: started"
    beats = [line for line in lines if "still running" in line]
    assert beats, lines  # the cell outlasts one heartbeat: it says so at least once
    said = [float(re.search(r", ([\d.]+) s so far", line)[1]) for line in beats]  # type: ignore[index]
    # throttled to one beat per 0.5 s (each figure rounded to 0.1 s)
    assert all(later - earlier >= 0.35 for earlier, later in itertools.pairwise(said)), beats
    assert beats[0].startswith("[1/1] bwrap/rw: still running (run 1/1), ")
    assert lines[-1].startswith("[1/1] bwrap/rw: exit 0") and lines[-1].endswith(" s]"), lines


@pytest.mark.bwrap
def test_json_report_on_stdout_progress_on_stderr(workspace: Path, tmp_path: Path) -> None:
    backend_or_skip("bwrap")
    done = run_cli("--json", "--backends", "bwrap", "--mounts", "ro", "--repeat", "1", "--workspace",
                   str(workspace), "--report", str(tmp_path), "--", "true")  # fmt: skip
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["cells"][0]["mount"] == "ro" and data["cells"][0]["exit_codes"] == [0]
    assert "[1/1] bwrap/ro: started" in done.stderr and "[1/1] bwrap/ro: exit 0" in done.stderr
    refused = run_cli("--json", "--workspace", str(workspace), "--report", str(tmp_path / "r"), "--mounts", "zfs",
                      "--", "true")  # fmt: skip
    assert refused.returncode == 125 and json.loads(refused.stdout)["error"]["code"] == "INVALID_ARGUMENT"


# ------------------------------------------------------------------------------ network and image


@pytest.fixture(scope="module")
def lab() -> Iterator[NetLab]:
    from tests.netlab import NetLab

    with NetLab() as running:
        yield running


@pytest.mark.parametrize("name", BACKENDS)
def test_cells_reach_what_allow_index_and_allow_host_name(
    name: str, lab: NetLab, workspace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend_or_skip(name)
    ws = docker_workspace(workspace) if name == "docker" else workspace
    for key in [k for k in os.environ if k.lower().endswith("_proxy")]:
        monkeypatch.delenv(key)  # the proxy chains to no upstream proxy of this machine
    resolver = {"SANDBOX_NET_RESOLVER": f"{lab.dns[0]}:{lab.dns[1]}"}  # and resolves with the lab's DNS
    mirror = f"pypi={lab.http_url(None, '/hello.txt')}"  # the index by its address: that host:port alone
    named = lab.http_url("allowed.test", "/hello.txt")  # the same server by a name only --allow-host opens
    script = f'curl -sSf -o /dev/null "$PIP_INDEX_URL" && curl -sSf -o /dev/null {named}'
    base = ["--backends", name, "--mounts", "copy", "--repeat", "1", "--workspace", str(ws)]
    opened = run_cli(*base, "--report", str(tmp_path / "open"), "--allow-index", mirror, "--allow-host",
                     f"allowed.test:{lab.http_port}", "--", "sh", "-c", script, env=resolver)  # fmt: skip
    assert opened.returncode == 0, opened.stderr
    data = json.loads((tmp_path / "open" / "report.json").read_text())
    assert data["network"]["mode"] == "allowlist" and data["network"]["indexes"] == [mirror]
    assert data["cells"][0]["exit_codes"] == [0], data["cells"][0]
    closed = run_cli(*base, "--report", str(tmp_path / "closed"), "--allow-index", mirror,
                     "--", "sh", "-c", script, env=resolver)  # fmt: skip
    assert closed.returncode == 0, closed.stderr  # a failing command is data
    cell = json.loads((tmp_path / "closed" / "report.json").read_text())["cells"][0]
    assert cell["exit_codes"] not in ([0], [127]), cell  # the index answered, the name nobody allowed did not
    bad = run_cli(*base, "--report", str(tmp_path / "bad"), "--allow-index", "cpan", "--", "true")
    assert bad.returncode == 125 and "unknown package index 'cpan'" in bad.stderr


@pytest.mark.docker
def test_image_flag_runs_the_docker_cells_in_that_image(workspace: Path, tmp_path: Path) -> None:
    backend_or_skip("docker")
    ws = docker_workspace(workspace)
    base = ["--backends", "docker", "--mounts", "rw", "--repeat", "1", "--workspace", str(ws)]
    node = run_cli(*base, "--image", "sandbox-runtime:node", "--report", str(tmp_path / "n"), "--", "node", "-e", "1")
    assert node.returncode == 0, node.stderr
    data = json.loads((tmp_path / "n" / "report.json").read_text())
    assert data["docker_image"] == "sandbox-runtime:node" and data["cells"][0]["exit_codes"] == [0], data["cells"]
    refused = run_cli("--backends", "bwrap", "--image", "sandbox-runtime:node", "--workspace", str(ws),
                      "--report", str(tmp_path / "r"), "--", "true")  # fmt: skip
    assert refused.returncode == 125 and "--image" in refused.stderr


def test_report_states_its_network(workspace: Path) -> None:
    plan = compare.make_plan(["true"], workspace, backends="bwrap", allow_hosts=["example.org"])
    data: dict[str, Any] = compare.Report(plan).to_dict()
    assert data["network"] == {"mode": "allowlist", "allow": ["example.org"], "indexes": []}
