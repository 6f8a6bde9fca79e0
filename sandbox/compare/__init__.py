"""Compare mount strategies: one command under every backend x strategy, side by side.

:mod:`~sandbox.compare.engine` runs the matrix and measures each cell (setup, wall, changeset,
teardown, what changed in the workspace, a destructive safety probe), :mod:`~sandbox.compare.results`
holds what it finds, and :mod:`~sandbox.compare.render` turns a report into the terminal table,
report.md, chart.svg and report.json. ``sandbox compare`` (:mod:`sandbox.cli.compare`) is this
package behind the command line; anyio and pydantic are imported here, so the CLI imports it
only when the command runs.
"""

from __future__ import annotations

from sandbox.compare.engine import DEFAULT_BACKENDS, MAX_REPEAT, MOUNTS, compare, make_plan
from sandbox.compare.render import REPORT_FILES, markdown, progress_line, rows, svg, table, write
from sandbox.compare.results import PROBE_SCRIPT, Cell, Plan, Report, Run, Safety, exit_status

__all__ = [
    "DEFAULT_BACKENDS",
    "MAX_REPEAT",
    "MOUNTS",
    "PROBE_SCRIPT",
    "REPORT_FILES",
    "Cell",
    "Plan",
    "Report",
    "Run",
    "Safety",
    "compare",
    "exit_status",
    "make_plan",
    "markdown",
    "progress_line",
    "rows",
    "svg",
    "table",
    "write",
]
