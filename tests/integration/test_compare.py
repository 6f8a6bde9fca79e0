"""``sandbox compare`` against real bubblewrap (and a real dockerd where one runs).

Through the library and through the installed console script: the report's JSON, markdown and
SVG chart, the safety column (only ``rw`` lets the destructive probe through), the user's own
workspace never touched, bad input answered with 125, an unavailable named backend with 2.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from sandbox import compare
from sandbox.errors import InvalidArgument
from sandbox.mounts import overlay_support
from tests.conftest import backend_or_skip

SANDBOX = str(Path(sys.executable).with_name("sandbox"))
COMMAND = ["sh", "-c", "echo hi > out.txt"]
ALL_MOUNTS = "ro,rw,copy,overlay"
SVG = "{http://www.w3.org/2000/svg}"
SANDBOX_UID = 1000


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [SANDBOX, "compare", *args],
        capture_output=True,
        text=True,
        timeout=110,
        env={**os.environ, **(env or {})},
        check=False,
    )


def into(workspace: Path, report: Path, repeat: int = 1) -> list[str]:
    """``--repeat N --workspace WORKSPACE --report REPORT``: how often each cell runs, on what, reported where."""
    return ["--repeat", str(repeat), "--workspace", str(workspace), "--report", str(report)]


def snapshot(root: Path) -> dict[str, bytes | None]:
    return {str(p.relative_to(root)): p.read_bytes() if p.is_file() else None for p in sorted(root.rglob("*"))}


def by_mount(data: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {cell["mount"]: cell for cell in data["cells"]}


def docker_workspace(workspace: Path) -> Path:
    """Docker runs a root-owned workspace's commands as uid 1000: give it to that uid so rw can write."""
    if os.geteuid() == 0:
        for path in [workspace, *workspace.rglob("*")]:
            os.chown(path, SANDBOX_UID, SANDBOX_UID, follow_symlinks=False)
    return workspace


def check_ran(cell: dict[str, Any], mount: str) -> None:
    assert cell["status"] == "ran", cell["reason"]
    assert len(cell["runs"]) == 1
    for key in ("wall_ms", "setup_ms", "teardown_ms"):
        assert cell[key] is not None and cell[key] >= 0, key
    assert (cell["changeset_ms"] is not None) == (mount in ("copy", "overlay"))
    assert cell["exit_codes"] == ([2] if mount == "ro" else [0])
    assert cell["host_changed"] is (mount == "rw")
    assert cell["files_changed"] == (0 if mount == "ro" else 1)
    assert cell["changes"]["added"] == (0 if mount == "ro" else 1)


def check_safety(cell: dict[str, Any], mount: str) -> None:
    safety = cell["safety"]
    assert safety["survived"] is (mount != "rw"), safety
    # No mount lets the probe plant a hook: rw binds .git/hooks read-only (sandbox/backends/seal.py).
    assert safety["hook_planted"] is False, safety
    if mount in ("copy", "overlay"):
        assert safety["changes"]["deleted"] >= 3 and safety["changes"]["flagged"] >= 1  # the hook is flagged


def check_overlay(cell: dict[str, Any], backend: str) -> None:
    if backend == "bwrap" and overlay_support() is None:
        check_ran(cell, "overlay")
        check_safety(cell, "overlay")
    else:
        assert cell["status"] == "skipped" and "overlay" in cell["reason"], cell


def check_report(directory: Path, backend: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((directory / "report.json").read_text())
    assert data["command"] == COMMAND and data["repeat"] == 1
    assert data["backends"][backend]["available"] is True
    cells = by_mount(data)
    assert list(cells) == ["ro", "rw", "copy", "overlay"]
    for mount in ("ro", "rw", "copy"):
        check_ran(cells[mount], mount)
        check_safety(cells[mount], mount)
    check_overlay(cells["overlay"], backend)
    assert cells["copy"]["bytes_copied"] > 0
    check_markdown((directory / "report.md").read_text(), data)
    check_chart(directory / "chart.svg", data)
    assert (directory / "table.txt").read_text().startswith("backend  mount")
    return data


def check_markdown(text: str, data: dict[str, Any]) -> None:
    assert "| backend | mount | exit | wall ms | setup ms |" in text
    assert "survives probe |" in text and "![time per backend and mount strategy](chart.svg)" in text
    table = [line for line in text.splitlines() if line.startswith(("| bwrap |", "| docker |"))]
    assert len(table) == len(data["cells"]) + sum(c["status"] == "ran" for c in data["cells"])  # + safety rows
    rw = next(line for line in table if "| rw |" in line)
    assert rw.rstrip().endswith("| NO |")


def check_chart(path: Path, data: dict[str, Any]) -> None:
    root = ET.parse(path).getroot()
    assert root.tag == f"{SVG}svg"
    bars = [e for e in root.iter(f"{SVG}rect") if e.get("class") == "bar"]
    ran = [f"{c['backend']}/{c['mount']}" for c in data["cells"] if c["status"] == "ran"]
    assert len(bars) == 3 * len(ran)
    assert {b.get("data-cell") for b in bars} == set(ran)
    assert {b.get("data-series") for b in bars} == {"setup_ms", "wall_ms", "teardown_ms"}
    assert all(float(b.get("height", "-1")) >= 0 for b in bars)
    legend = "".join(e.text or "" for e in root.iter(f"{SVG}text"))
    assert "setup" in legend and "teardown" in legend


async def library_compare(workspace: Path, backend: str, report: Path) -> compare.Report:
    plan = compare.make_plan(COMMAND, workspace, backends=backend, mounts=ALL_MOUNTS, repeat=1)
    lines: list[str] = []
    result = await compare.compare(plan, lines.append)
    compare.write(result, report)
    # A line as each cell starts, one as it ends (with its elapsed time): cells are short, so no heartbeat.
    assert len(lines) == 8 and all(line.startswith(f"[{i // 2 + 1}/4] {backend}/") for i, line in enumerate(lines))
    assert all(line.endswith(": started") for line in lines[::2]) and all(line.endswith(" s]") for line in lines[1::2])
    return result


# ------------------------------------------------------------------------------ per backend


@pytest.mark.anyio
@pytest.mark.parametrize(
    "name", [pytest.param("bwrap", marks=pytest.mark.bwrap), pytest.param("docker", marks=pytest.mark.docker)]
)
async def test_library_compare_every_mount(name: str, workspace: Path, tmp_path: Path) -> None:
    backend_or_skip(name)
    ws = docker_workspace(workspace) if name == "docker" else workspace
    before = snapshot(ws)
    result = await library_compare(ws, name, tmp_path / "report")
    assert compare.exit_status(result) == 0
    check_report(tmp_path / "report", name)
    assert snapshot(ws) == before  # every cell ran on a copy; rw and the probe never touched this one


@pytest.mark.parametrize(
    "name", [pytest.param("bwrap", marks=pytest.mark.bwrap), pytest.param("docker", marks=pytest.mark.docker)]
)
def test_cli_compare_writes_table_json_markdown_chart(name: str, workspace: Path, tmp_path: Path) -> None:
    backend_or_skip(name)
    ws = docker_workspace(workspace) if name == "docker" else workspace
    done = run_cli("--backends", name, "--mounts", ALL_MOUNTS, *into(ws, tmp_path / "report"), "--", *COMMAND)
    assert done.returncode == 0, done.stderr
    header = done.stdout.splitlines()[0].split()
    assert header[:4] == ["backend", "mount", "exit", "wall"]
    assert [line.split()[1] for line in done.stdout.splitlines()[2:6]] == ["ro", "rw", "copy", "overlay"]
    assert sum(f"[{i}/4] {name}/" in done.stderr for i in range(1, 5)) == 4  # one progress line per cell
    check_report(tmp_path / "report", name)
    assert not (ws / "out.txt").exists()


# ------------------------------------------------------------------------------ availability and bad input


@pytest.mark.bwrap
def test_unavailable_named_backend_exits_2_default_one_is_skipped(workspace: Path, tmp_path: Path) -> None:
    backend_or_skip("bwrap")
    nowhere = {"DOCKER_HOST": f"unix://{tmp_path}/no-docker.sock"}
    named = run_cli(
        "--backends", "bwrap,docker", "--mounts", "rw", *into(workspace, tmp_path / "named"), "--", "true", env=nowhere
    )
    assert named.returncode == 2, named.stderr
    cells = json.loads((tmp_path / "named" / "report.json").read_text())["cells"]
    assert [(c["backend"], c["status"]) for c in cells] == [("bwrap", "ran"), ("docker", "skipped")]
    assert "unavailable" in cells[1]["reason"] and "no-docker.sock" in cells[1]["reason"]
    default = run_cli("--mounts", "rw", *into(workspace, tmp_path / "default"), "--", "true", env=nowhere)
    assert default.returncode == 0, default.stderr
    assert "docker/rw: skipped: backend docker unavailable" in default.stderr


@pytest.mark.bwrap
def test_failing_command_is_data_not_an_error(workspace: Path, tmp_path: Path) -> None:
    backend_or_skip("bwrap")
    done = run_cli(
        "--backends",
        "bwrap",
        "--mounts",
        "ro",
        *into(workspace, tmp_path, repeat=2),
        "--",
        "sh",
        "-c",
        "echo boom >&2; exit 3",
    )
    assert done.returncode == 0, done.stderr
    cell = json.loads((tmp_path / "report.json").read_text())["cells"][0]
    assert cell["exit_codes"] == [3, 3] and len(cell["runs"]) == 2
    assert "(boom)" in done.stderr and "`boom`" in (tmp_path / "report.md").read_text()


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--backends", "podman", "--", "true"], "unknown backends 'podman'"),
        (["--mounts", "ro,tmpfs", "--", "true"], "unknown mounts 'tmpfs'"),
        (["--repeat", "0", "--", "true"], "--repeat must be between"),
        (["--repeat", "x", "--", "true"], "--repeat must be a whole number"),
        (["--timeout", "9999", "--", "true"], "timeout must be between"),
        (["--workspace", "/nonexistent/ws", "--", "true"], "does not exist"),
        (["--"], "no command given"),
    ],
)
def test_bad_input_exits_125(args: list[str], needle: str, workspace: Path, tmp_path: Path) -> None:
    ws = [] if "--workspace" in args else ["--workspace", str(workspace)]
    done = run_cli(*ws, "--report", str(tmp_path / "r"), *args)
    assert done.returncode == 125, done.stderr
    assert needle in done.stderr and "INVALID_ARGUMENT" in done.stderr
    assert not (tmp_path / "r").exists()


def test_library_rejects_bad_input_before_running(workspace: Path) -> None:
    with pytest.raises(InvalidArgument, match="no command given"):
        compare.make_plan([], workspace)
    with pytest.raises(InvalidArgument, match="unknown mounts"):
        compare.make_plan(["true"], workspace, mounts=["overlay", "zfs"])


def test_chart_and_table_render_skipped_and_failed_cells(workspace: Path, tmp_path: Path) -> None:
    plan = compare.make_plan(["true"], workspace, backends="bwrap", mounts="ro,overlay", repeat=1)
    report = compare.Report(
        plan,
        cells=[
            compare.Cell("bwrap", "ro", "skipped", "no <bwrap> & no luck"),
            compare.Cell("bwrap", "overlay", "error", "BACKEND_UNAVAILABLE: x"),
        ],
    )
    assert compare.exit_status(report) == 1
    compare.write(report, tmp_path)
    root = ET.parse(tmp_path / "chart.svg").getroot()
    assert not [e for e in root.iter(f"{SVG}rect") if e.get("class") == "bar"]
    assert "bwrap/ro skipped: no <bwrap> & no luck" in compare.table(report)
