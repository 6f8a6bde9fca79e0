"""``sandbox compare``'s failed cells and its ``--baseline`` host cell, against real bubblewrap.

A cell whose command failed is marked in the table (``✗ exit N`` beside its wall time), the
markdown (the same, with a legend line) and the chart (outlined, hatched bars and a ``failed``
label); a passing cell is not. ``--baseline`` adds ``host/baseline`` (the command on the host,
unsandboxed, on fresh copies) and a ``vs host`` ratio per cell; the user's workspace is untouched.
"""

from __future__ import annotations

import json
import re
import subprocess
import xml.etree.ElementTree as ET
from typing import TYPE_CHECKING, Any

import pytest

from sandbox import compare
from tests.conftest import backend_or_skip
from tests.integration.test_compare import SANDBOX, SVG, run_cli, snapshot

if TYPE_CHECKING:
    from pathlib import Path

WRITE = ["sh", "-c", "echo hi > out.txt"]  # exits 2 under ro, 0 under rw
DESTROY = ["sh", "-c", "rm -rf ./* && echo x > planted.txt"]


def chart(directory: Path) -> ET.Element:
    return ET.parse(directory / "chart.svg").getroot()


def texts(root: ET.Element, cls: str) -> list[str]:
    return [e.text or "" for e in root.iter(f"{SVG}text") if e.get("class") == cls]


def bars(root: ET.Element, cell: str) -> list[ET.Element]:
    return [e for e in root.iter(f"{SVG}rect") if e.get("class") == "bar" and e.get("data-cell") == cell]


def row(text: str, label: str) -> str:
    backend, mount = label.split("/")
    return next(line for line in text.splitlines() if line.startswith(f"| {backend} | {mount} |"))


def run_baseline(workspace: Path, report: Path, argv: list[str], mounts: str) -> subprocess.CompletedProcess[str]:
    args = ["--baseline", "--backends", "bwrap", "--mounts", mounts, "--repeat", "1"]
    return run_cli(*args, "--workspace", str(workspace), "--report", str(report), "--", *argv)


# ------------------------------------------------------------------------------ failed cells


@pytest.mark.bwrap
@pytest.mark.anyio
async def test_failed_cell_is_marked_in_table_markdown_and_chart(workspace: Path, tmp_path: Path) -> None:
    backend_or_skip("bwrap")
    plan = compare.make_plan(WRITE, workspace, backends="bwrap", mounts="ro,rw", repeat=1)
    report = await compare.compare(plan)
    compare.write(report, tmp_path)
    table = compare.table(report)
    assert "✗ exit 2" in next(line for line in table.splitlines() if line.split()[:2] == ["bwrap", "ro"])
    assert "✗" not in next(line for line in table.splitlines() if line.split()[:2] == ["bwrap", "rw"])
    assert "the command failed in this cell" in table and "vs host" not in table  # no --baseline: no ratio
    md = (tmp_path / "report.md").read_text()
    assert "✗ exit 2" in row(md, "bwrap/ro") and "✗" not in row(md, "bwrap/rw")
    assert "- ✗ exit N / ✗ timeout: the command failed in this cell" in md
    root = chart(tmp_path)
    assert {b.get("data-failed") for b in bars(root, "bwrap/ro")} == {"true"}
    assert {b.get("data-failed") for b in bars(root, "bwrap/rw")} == {None}
    assert len([e for e in root.iter(f"{SVG}rect") if e.get("class") == "failed-hatch"]) == 3
    assert texts(root, "failed") == ["failed (exit 2)"]
    assert all("vs_host" not in cell for cell in report.to_dict()["cells"])


def test_timed_out_cell_is_marked_timeout(workspace: Path, tmp_path: Path) -> None:
    plan = compare.make_plan(["sleep", "9"], workspace, backends="bwrap", mounts="rw", repeat=1)
    run = compare.Run(
        exit_code=137,
        timed_out=True,
        wall_ms=1000.0,
        spawn_ms=1.0,
        setup_ms=1.0,
        teardown_ms=1.0,
        changeset_ms=None,
        bytes_copied=None,
        files_changed=0,
        host_changed=False,
        peak_memory_bytes=None,
        changes={"added": 0, "modified": 0, "deleted": 0, "flagged": 0},
    )
    report = compare.Report(plan, cells=[compare.Cell("bwrap", "rw", runs=[run])])
    compare.write(report, tmp_path)
    assert "1000 ✗ timeout" in compare.table(report)
    assert texts(chart(tmp_path), "failed") == ["failed (timeout)"]


# ------------------------------------------------------------------------------ the baseline


def check_ratios(data: dict[str, Any]) -> None:
    host, *cells = data["cells"]
    assert (host["backend"], host["mount"], host["baseline"], host["status"]) == ("host", "baseline", True, "ran")
    assert host["vs_host"] == 1.0 and host["safety"] is None and len(host["runs"]) == 1
    for cell in cells:
        assert "baseline" not in cell
        assert cell["vs_host"] == round(cell["wall_ms"] / host["wall_ms"], 3)


@pytest.mark.bwrap
def test_baseline_adds_the_host_cell_and_ratios(workspace: Path, tmp_path: Path) -> None:
    backend_or_skip("bwrap")
    done = run_baseline(workspace, tmp_path, WRITE, "rw,copy")
    assert done.returncode == 0, done.stderr
    data = json.loads((tmp_path / "report.json").read_text())
    check_ratios(data)
    header = done.stdout.splitlines()[0]
    assert re.split(r"\s{2,}", header)[:5] == ["backend", "mount", "exit", "wall ms", "vs host"]
    assert [line.split()[:2] for line in done.stdout.splitlines()[2:5]] == [
        ["host", "baseline"],
        ["bwrap", "rw"],
        ["bwrap", "copy"],
    ]
    assert "[1/3] host/baseline: exit 0" in done.stderr and "destructive probe: not run on the host" in done.stderr
    md = (tmp_path / "report.md").read_text()
    assert "| wall ms | vs host | setup ms |" in md and "| 1.00x |" in row(md, "host/baseline")
    lines = [e for e in chart(tmp_path).iter(f"{SVG}line") if e.get("class") == "baseline"]
    assert [float(e.get("data-value", "-1")) for e in lines] == [data["cells"][0]["wall_ms"]]


@pytest.mark.bwrap
def test_baseline_leaves_the_users_workspace_untouched(workspace: Path, tmp_path: Path) -> None:
    backend_or_skip("bwrap")
    before = snapshot(workspace)
    done = run_baseline(workspace, tmp_path, DESTROY, "ro")
    assert done.returncode == 0, done.stderr
    assert snapshot(workspace) == before
    host = json.loads((tmp_path / "report.json").read_text())["cells"][0]
    assert host["exit_codes"] == [0] and host["host_changed"] is True  # it did wreck its own copy
    assert host["changes"]["deleted"] >= 2 and host["changes"]["added"] == 1


def test_help_says_the_baseline_is_unsandboxed() -> None:
    done = subprocess.run([SANDBOX, "compare", "--help"], capture_output=True, text=True, timeout=30, check=False)
    assert (
        "runs the command on the host, unsandboxed, to measure its own time: only for commands you trust"
        in " ".join(done.stdout.split())
    )
