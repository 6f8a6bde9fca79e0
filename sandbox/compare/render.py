"""Renderings of a comparison: the progress line of a cell, the terminal table, the markdown
report, the SVG chart (hand-written: no plotting dependency) and the report files.

Timings are medians over a cell's runs, in milliseconds; ``n/a`` where a figure does not apply
(no changeset under ``ro``/``rw``, no peak memory where the backend cannot tell). The probe's
verdict is ``yes``, ``NO``, ``error`` or ``n/a (why)`` when the probe proved nothing.

The chart is laid out so that no two labels overlap, whatever the names and the number of cells:
each group is as wide as its longest label (capped: a longer name is cut with an ellipsis and
given whole in a tooltip), a bar's figure is at most four characters (``950``, ``9.5s``, ``12m``),
and the legend's entries are spaced by their own widths. Under each group: its backend, its
strategy, the probe's verdict (``survives: yes``) and, when the command failed, why.
"""

from __future__ import annotations

import html
import json
import math
import shlex
from typing import TYPE_CHECKING

from sandbox.compare.results import BASELINE, PROBE_SCRIPT
from sandbox.errors import map_errors

if TYPE_CHECKING:
    from pathlib import Path

    from sandbox.compare.results import Cell, Report

REPORT_FILES = ("report.json", "report.md", "chart.svg", "table.txt")


def progress_line(cell: Cell, repeat: int, elapsed_s: float | None = None) -> str:
    """The line a cell ends with; ``elapsed_s``: the cell's own time, runs and probe together."""
    took = f" [{elapsed_s:.1f} s]" if elapsed_s is not None else ""
    if cell.status != "ran":
        return f"{cell.label}: {cell.status}: {cell.reason}{took}"
    survived = {"yes": "survived", "NO": "host DAMAGED"}.get(_survived(cell), _survived(cell))
    survived = "not run on the host" if cell.baseline else survived
    why = f" ({cell.failure})" if cell.failure else ""
    return (
        f"{cell.label}: exit {_exits(cell)}{why}, wall {_num(cell.median('wall_ms'))} ms "
        f"(median of {repeat}), setup {_num(cell.median('setup_ms'))} ms, "
        f"teardown {_num(cell.median('teardown_ms'))} ms; destructive probe: {survived}{took}"
    )


# ------------------------------------------------------------------------------ formatting


def _num(value: float | None) -> str:
    if value is None:
        return "n/a"
    return f"{value:.0f}" if abs(value) >= 100 else f"{value:.1f}"


def _size(value: float | None) -> str:
    if value is None:
        return "n/a"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return "n/a"  # unreachable


def _copied(copied: int | None, untracked: int | None) -> str:
    """Bytes copied, and what ``mount.exclude`` saved: ``1.2 KiB (+35.0 MiB bound)``."""
    return f"{_size(copied)} (+{_size(untracked)} bound)" if untracked else _size(copied)


def _exits(cell: Cell) -> str:
    if any(r.timed_out for r in cell.runs):
        return "timeout"
    codes = cell.exit_codes
    return str(codes[0]) if len(set(codes)) == 1 else "/".join(map(str, codes))


def _failed_why(cell: Cell) -> str:
    """``exit 2`` / ``timeout`` for a cell whose command failed, else ``""``."""
    if not cell.failed:
        return ""
    exits = _exits(cell)
    return exits if exits == "timeout" else f"exit {exits}"


def _failed_mark(cell: Cell) -> str:
    return f"✗ {_failed_why(cell)}" if cell.failed else ""


def _wall(cell: Cell, value: float | None) -> str:
    mark = _failed_mark(cell)
    return f"{_num(value)} {mark}" if mark else _num(value)


def _ratio(value: float | None) -> str:
    if value is None:
        return "n/a"
    return f"{value:.2f}x" if value < 10 else f"{value:.0f}x"


def _changes(summary: dict[str, int] | None) -> str:
    if summary is None:
        return "n/a"
    text = f"+{summary['added']} ~{summary['modified']} -{summary['deleted']}"
    return text + (f" !{summary['flagged']}" if summary.get("flagged") else "")


def _yes_no(value: bool | None) -> str:
    return "n/a" if value is None else ("yes" if value else "no")


def _survived(cell: Cell) -> str:
    if cell.safety is None:
        return "n/a"
    if cell.safety.error:
        return "error"
    if cell.safety.inconclusive:
        return f"n/a ({cell.safety.inconclusive})"
    return "yes" if cell.safety.survived else "NO"


HEADERS = (
    "backend",
    "mount",
    "exit",
    "wall ms",
    "setup ms",
    "teardown ms",
    "changeset ms",
    "copied",
    "files changed",
    "host changed",
    "peak mem",
    "changes",
    "survives probe",
)
VS_HOST = "vs host"  # the column --baseline adds, after "wall ms"


def headers(report: Report) -> list[str]:
    """The table's columns: ``HEADERS``, with ``vs host`` after the wall time under ``--baseline``."""
    names = list(HEADERS)
    if report.plan.baseline:
        names.insert(names.index("wall ms") + 1, VS_HOST)
    return names


def notes(report: Report) -> list[str]:
    """The lines explaining the table's markers: failed cells, the baseline's ratio."""
    out = []
    if any(c.failed for c in report.ran):
        out.append("✗ exit N / ✗ timeout: the command failed in this cell; its times are those of a failing run.")
    if report.plan.baseline:
        out.append(
            f"{VS_HOST}: the cell's median wall time over host/{BASELINE}'s, the command run on the host, "
            "unsandboxed, on a fresh copy (setup and teardown not included)."
        )
    out += [f"host/{BASELINE} {c.reason}." for c in report.ran if c.baseline and c.reason]
    if any(c.safety and c.safety.inconclusive for c in report.ran):
        out.append(
            "n/a (why): the destructive probe proved nothing about this strategy (it could not write or run at "
            "all), so the workspace's survival is not credited to it."
        )
    return out


def rows(report: Report) -> list[list[str]]:
    out = []
    for cell in report.cells:
        if cell.status != "ran":
            out.append([cell.backend, cell.mount, cell.status, *["-"] * (len(HEADERS) - 3)])
            continue
        s = cell.summary()
        out.append(
            [
                cell.backend,
                cell.mount,
                _exits(cell),
                _wall(cell, s["wall_ms"]),
                _num(s["setup_ms"]),
                _num(s["teardown_ms"]),
                _num(s["changeset_ms"]),
                _copied(s["bytes_copied"], s["bytes_untracked"]),
                str(s["files_changed"]),
                _yes_no(s["host_changed"]),
                _size(s["peak_memory_bytes"]),
                _changes(s["changes"]),
                _survived(cell),
            ]
        )
    if report.plan.baseline:
        at = HEADERS.index("wall ms") + 1
        for row, cell in zip(out, report.cells, strict=True):
            row.insert(at, _ratio(report.vs_host(cell)) if cell.status == "ran" else "-")
    return out


def table(report: Report) -> str:
    """The plain-text table for a terminal: aligned columns, skipped cells' reasons below."""
    body = [headers(report), *rows(report)]
    widths = [max(len(r[i]) for r in body) for i in range(len(body[0]))]
    lines = ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() for r in body]
    lines.insert(1, "  ".join("-" * w for w in widths))
    lines += [f"{c.label} {c.status}: {c.reason}" for c in report.cells if c.status != "ran"]
    return "\n".join(lines + notes(report)) + "\n"


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def markdown(report: Report, chart: str | None = "chart.svg") -> str:
    plan = report.plan
    stats = report.workspace_stats
    lines = [
        "# sandbox compare",
        "",
        f"Command `{_md_cell(shlex.join(plan.argv))}` on a fresh copy of `{plan.workspace}` "
        f"({stats.get('files', 0)} files, {_size(stats.get('bytes', 0))}) per run, profile `{plan.profile.name}`, "
        f"{plan.repeat} run(s) per cell (times are medians, in ms). {report.started} - {report.finished}.",
        "",
        "| " + " | ".join(headers(report)) + " |",
        "|" + "|".join("---" for _ in headers(report)) + "|",
        *("| " + " | ".join(_md_cell(v) for v in r) + " |" for r in rows(report)),
        "",
    ]
    if notes(report):
        lines += [*(f"- {_md_cell(n)}" for n in notes(report)), ""]
    skipped = [c for c in report.cells if c.status != "ran"]
    if skipped:
        lines += ["Not run:", "", *(f"- `{c.label}` {c.status}: {_md_cell(c.reason)}" for c in skipped), ""]
    failed = [c for c in report.ran if c.failure]
    if failed:
        lines += [
            "Command failures (the last line it printed):",
            "",
            *(f"- `{c.label}` exit {_exits(c)}: `{_md_cell(c.failure)}`" for c in failed),
            "",
        ]
    if chart:
        lines += [f"![time per backend and mount strategy]({chart})", ""]
    lines += _md_safety(report) + _md_legend()
    return "\n".join(lines)


def _md_safety(report: Report) -> list[str]:
    lines = [
        "## What each strategy protects",
        "",
        f"Destructive probe, on its own fresh copy with a seeded `.git/hooks`: `{_md_cell(PROBE_SCRIPT)}`",
        "",
        "| backend | mount | probe exit | host workspace survived | host changes | hook planted on host "
        "| changeset (what `--apply` would bring back) |",
        "|---|---|---|---|---|---|---|",
    ]
    for cell in report.ran:
        s = cell.safety
        if s is None:
            continue
        exit_text = "n/a" if s.exit_code is None else str(s.exit_code)
        lines.append(
            f"| {cell.backend} | {cell.mount} | {exit_text} | {_survived(cell)} | "
            f"{_changes(s.host_changes) if not s.error else _md_cell(s.error)} | {_yes_no(s.hook_planted)} | "
            f"{_changes(s.changes)} |"
        )
    return [*lines, ""]


def _md_legend() -> list[str]:
    return [
        "## Columns",
        "",
        "- **setup**: opening the jail (the copy-in for `copy`, the mount for `overlay`); **teardown**: closing it;",
        "  **changeset**: computing what a `copy`/`overlay` jail changed; **wall**: the command itself.",
        "- **copied**: bytes copied into a private tree; `(+N bound)`: the bytes the profile's `mount.exclude`",
        "  kept out of the copy and bound read-only from the host instead (the setup it saved);",
        "  **files changed**: entries the command added, modified or",
        "  deleted (the changeset for `copy`/`overlay`, the workspace itself for `ro`/`rw`); **host changed**:",
        "  whether the workspace the user would have was modified; **changes**: `+added ~modified -deleted !flagged`.",
        "- **peak mem**: the call's peak memory (cgroup), `n/a` where the backend cannot tell.",
        "",
    ]


# ------------------------------------------------------------------------------ the chart


SERIES = (
    ("setup_ms", "setup", "#4e79a7"),
    ("wall_ms", "command (wall)", "#f28e2b"),
    ("teardown_ms", "teardown", "#59a14f"),
)
_BAR_W, _GAP, _LEFT, _TOP, _PLOT_H = 22, 26, 64, 76, 240
_FONT, _VALUE_FONT = 11, 8  # a bar's figure is at most 4 characters of 8 px: narrower than its bar
_EM = 0.62  # a generous average character width, in ems, for sans-serif (bold included)
_MAX_LABEL = 24  # characters of a name under a group; a longer one is cut, whole in its tooltip
_ROWS = (16, 30, 44, 58)  # below the axis: backend, strategy, probe verdict, failure
_FAILED = "#d62728"  # the outline and label of a cell whose command failed
_VERDICT_COLOURS = {"yes": "#2a7d2a", "NO": _FAILED}
_HATCH = (
    '<defs><pattern id="failed-hatch" width="6" height="6" patternUnits="userSpaceOnUse" '
    'patternTransform="rotate(45)"><line x1="0" y1="0" x2="0" y2="6" stroke="white" stroke-width="2.5" '
    'stroke-opacity="0.8"/></pattern></defs>'
)


def _text_w(text: str, size: int = _FONT) -> float:
    return len(text) * size * _EM


def _fit(text: str, chars: int = _MAX_LABEL) -> str:
    """``text`` cut to ``chars`` characters with an ellipsis: what a group's width holds."""
    return text if len(text) <= chars else text[: chars - 1] + "…"


def _short(value: float) -> str:
    """A bar's figure in at most four characters: ``9.5``, ``950``, ``9.5s``, ``95s``, ``12m``."""
    if value < 9.95:
        return f"{value:.1f}"
    if value < 999.5:
        return f"{value:.0f}"
    if value < 9950:
        return f"{value / 1000:.1f}s"
    if value < 999_500:
        return f"{value / 1000:.0f}s"
    return f"{value / 60_000:.0f}m"


def _scale(value: float) -> tuple[float, int]:
    """A round tick step (1, 2 or 5 x 10^k) and the number of ticks that covers ``value``."""
    if value <= 0:
        return 1.0, 1
    rough = value / 5
    power = 10.0 ** math.floor(math.log10(rough))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= rough)
    return step, max(1, math.ceil(value / step - 1e-9))


def _verdict(cell: Cell) -> str:
    """The probe's verdict as the chart shows it under a group (the whole text in its tooltip)."""
    if cell.baseline:
        return "not probed"
    word = _survived(cell)
    return f"survives: {word.split(' ', 1)[0]}"


def _labels(cell: Cell) -> list[str]:
    """Every text a group shows under the axis, as drawn (cut to fit)."""
    texts = [cell.backend, cell.mount, _verdict(cell) if cell.status == "ran" else cell.status]
    return [_fit(t) for t in (*texts, _failed_text(cell))]


def _group_w(report: Report) -> float:
    """Wide enough for three bars and for the longest label of any group: labels never meet."""
    widest = max([_text_w(t) for c in report.cells for t in _labels(c)] + [0.0])
    return max(len(SERIES) * _BAR_W + _GAP, math.ceil(widest) + 12)


def _top_value(report: Report) -> float:
    values = [0.0]
    for cell in report.ran:
        for key, _, _ in SERIES:
            spread = cell.spread(key)
            values += [cell.median(key) or 0.0, spread[1] if spread else 0.0]
    return max(values)


def svg(report: Report) -> str:
    """Grouped bars, one group per backend/mount, with min-max whiskers over the repeats and the
    probe's verdict under each group; hand-written SVG (no plotting dependency)."""
    group_w = _group_w(report)
    legend, legend_end = _legend(report)
    width = math.ceil(max(600, _LEFT + len(report.cells) * group_w + 40, legend_end + 20))
    height = _TOP + _PLOT_H + _ROWS[-1] + 12
    step, ticks = _scale(_top_value(report))
    top = step * ticks
    title = (
        f"sandbox compare: median ms per backend and mount strategy ({report.plan.repeat} run(s) each, "
        "whiskers: min-max)"
    )
    files = report.workspace_stats.get("files", 0)
    room = int((width - _LEFT) / (_FONT * _EM))
    subtitle = _fit(f"{shlex.join(report.plan.argv)} on {files} files", room)
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="{_FONT}">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        *([_HATCH] if any(c.failed for c in report.ran) else []),
        f'<text x="{_LEFT}" y="20" font-size="{_FONT}" font-weight="bold">{html.escape(_fit(title, room))}</text>',
        f'<text x="{_LEFT}" y="37" fill="#555">{html.escape(subtitle)}</text>',
        *_axis(step, ticks, width),
        *legend,
    ]
    for index, cell in enumerate(report.cells):
        parts += _group(cell, _LEFT + index * group_w, group_w, top, report.vs_host(cell))
    parts += _baseline_line(report, top, width)
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def _y(value: float, top: float) -> float:
    return _TOP + _PLOT_H - value / top * _PLOT_H


def _axis(step: float, ticks: int, width: int) -> list[str]:
    mid = _TOP + _PLOT_H / 2
    out = [
        f'<line x1="{_LEFT}" y1="{_TOP + _PLOT_H}" x2="{width - 20}" y2="{_TOP + _PLOT_H}" stroke="#333"/>',
        f'<text x="14" y="{mid}" transform="rotate(-90 14 {mid})" text-anchor="middle">milliseconds</text>',
    ]
    for tick in range(ticks + 1):
        y = _y(step * tick, step * ticks)
        out += [
            f'<line x1="{_LEFT}" y1="{y:.1f}" x2="{width - 20}" y2="{y:.1f}" stroke="#e4e4e4"/>',
            f'<text x="{_LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{step * tick:g}</text>',
        ]
    return out


def _legend(report: Report) -> tuple[list[str], float]:
    """The series' swatches, then the failed one, the whiskers and the baseline's dashed line when
    the chart has them, each entry as wide as its name; and where the legend ends."""
    marks = [f'<rect class="legend" x="{{x}}" y="47" width="10" height="10" fill="{c}"/>' for _, _, c in SERIES]
    names = [name for _, name, _ in SERIES]
    if any(c.failed for c in report.ran):
        marks.append(
            '<rect class="legend" x="{x}" y="47" width="10" height="10" fill="#888" '
            f'stroke="{_FAILED}" stroke-width="1.5"/>'
            '<rect x="{x}" y="47" width="10" height="10" fill="url(#failed-hatch)"/>'
        )
        names.append("command failed")
    if any(c.spread(k) for c in report.ran for k, _, _ in SERIES):
        marks.append('<line class="legend" x1="{x5}" y1="46" x2="{x5}" y2="58" stroke="#222"/>')
        names.append(f"min-max of {report.plan.repeat} runs")
    wall = report.baseline.median("wall_ms") if report.baseline else None
    if wall is not None:
        marks.append('<line class="legend" x1="{x}" y1="52" x2="{x10}" y2="52" stroke="#333" stroke-dasharray="4 2"/>')
        names.append(f"host, unsandboxed: {_num(wall)} ms")
    out, x = [], float(_LEFT)
    for mark, name in zip(marks, names, strict=True):
        out += [mark.format(x=x, x5=x + 5, x10=x + 10), f'<text x="{x + 14}" y="56">{html.escape(name)}</text>']
        x += 14 + _text_w(name) + 18
    return out, x


def _baseline_line(report: Report, top: float, width: int) -> list[str]:
    """A dashed line across the plot at the unsandboxed host's median wall time (named in the
    legend, so that no label in the plot can meet a bar's)."""
    wall = report.baseline.median("wall_ms") if report.baseline else None
    if wall is None:
        return []
    y = _y(wall, top)
    return [
        f'<line class="baseline" data-value="{wall}" x1="{_LEFT}" y1="{y:.1f}" x2="{width - 20}" y2="{y:.1f}" '
        f'stroke="#333" stroke-width="1.2" stroke-dasharray="6 4"><title>host, unsandboxed: {wall} ms</title></line>',
    ]


def _failed_text(cell: Cell) -> str:
    return f"failed ({_failed_why(cell)})" if cell.status == "ran" and cell.failed else ""


def _below(cell: Cell, mid: float) -> list[str]:
    """The group's names, the probe's verdict and (a failed command) why, under the axis."""
    base_y = _TOP + _PLOT_H
    backend, mount, verdict, failed = _labels(cell)
    out = [
        f'<text class="label" x="{mid}" y="{base_y + _ROWS[0]}" text-anchor="middle">'
        f"{html.escape(backend)}<title>{html.escape(cell.label)}</title></text>",
        f'<text class="label" x="{mid}" y="{base_y + _ROWS[1]}" text-anchor="middle" font-weight="bold">'
        f"{html.escape(mount)}<title>{html.escape(cell.label)}</title></text>",
    ]
    if cell.status == "ran":
        word = _survived(cell)
        colour = _VERDICT_COLOURS.get(word, "#777")
        full = "not probed: the unsandboxed host run" if cell.baseline else f"destructive probe: {word}"
        out.append(
            f'<text class="verdict" data-verdict="{html.escape(word.split(" ", 1)[0])}" x="{mid}" '
            f'y="{base_y + _ROWS[2]}" text-anchor="middle" fill="{colour}">'
            f"{html.escape(verdict)}<title>{html.escape(full)}</title></text>"
        )
    if failed:
        out.append(
            f'<text class="failed" x="{mid}" y="{base_y + _ROWS[3]}" text-anchor="middle" fill="{_FAILED}">'
            f"{html.escape(failed)}<title>{html.escape(cell.failure or failed)}</title></text>"
        )
    return out


def _group(cell: Cell, x: float, group_w: float, top: float, vs_host: float | None = None) -> list[str]:
    """One cell's bars (hatched and outlined in red when its command failed), whiskers and labels."""
    base_y = _TOP + _PLOT_H
    mid = x + group_w / 2
    label = _below(cell, mid)
    if cell.status != "ran":
        reason = html.escape(cell.reason)
        return [
            *label,
            f'<text class="skipped" x="{mid}" y="{base_y - 8}" text-anchor="middle" fill="#999">'
            f"<title>{reason}</title>{cell.status}</text>",
        ]
    bars: list[str] = []
    outline = f' data-failed="true" stroke="{_FAILED}" stroke-width="1.5"' if cell.failed else ""
    left = mid - len(SERIES) * _BAR_W / 2
    for i, (key, name, color) in enumerate(SERIES):
        value = cell.median(key) or 0.0
        y = _y(value, top)
        bx = left + i * _BAR_W
        spread = cell.spread(key)
        ratio = f" ({_ratio(vs_host)} host)" if key == "wall_ms" and vs_host is not None else ""
        span = f", min {spread[0]} max {spread[1]}" if spread else ""
        label_y = min(y, _y(spread[1], top)) if spread else y
        bars += [
            f'<rect class="bar" data-cell="{html.escape(cell.label)}" data-series="{key}" data-value="{value}" '
            f'x="{bx}" y="{y:.1f}" width="{_BAR_W - 2}" height="{base_y - y:.1f}" fill="{color}"{outline}>'
            f"<title>{html.escape(cell.label)} {name}: {value} ms{span}{ratio}{_failed_title(cell)}</title></rect>",
            *_hatch(cell, bx, y, base_y - y),
            *_whisker(cell, key, bx + (_BAR_W - 2) / 2, top),
            f'<text class="value" x="{bx + (_BAR_W - 2) / 2}" y="{label_y - 3:.1f}" text-anchor="middle" '
            f'font-size="{_VALUE_FONT}">{_short(value)}</text>',
        ]
    return label + bars


def _whisker(cell: Cell, key: str, cx: float, top: float) -> list[str]:
    """An I-beam from the smallest to the largest run of ``key``: the spread over the repeats."""
    spread = cell.spread(key)
    if spread is None:
        return []
    low, high = _y(spread[0], top), _y(spread[1], top)
    return [
        f'<path class="spread" data-cell="{html.escape(cell.label)}" data-series="{key}" data-min="{spread[0]}" '
        f'data-max="{spread[1]}" d="M{cx - 4},{high:.1f}H{cx + 4}M{cx},{high:.1f}V{low:.1f}M{cx - 4},{low:.1f}'
        f'H{cx + 4}" stroke="#222" stroke-width="1" fill="none"/>'
    ]


def _failed_title(cell: Cell) -> str:
    why = f": {cell.failure}" if cell.failure else ""
    return f", {_failed_why(cell)}{html.escape(why)}" if cell.failed else ""


def _hatch(cell: Cell, x: float, y: float, height: float) -> list[str]:
    if not cell.failed:
        return []
    return [
        f'<rect class="failed-hatch" x="{x}" y="{y:.1f}" width="{_BAR_W - 2}" height="{height:.1f}" '
        'fill="url(#failed-hatch)" pointer-events="none"/>'
    ]


# ------------------------------------------------------------------------------ report files


def write(report: Report, directory: Path) -> list[Path]:
    """report.json, report.md, chart.svg and table.txt in ``directory`` (created); returns their paths."""
    with map_errors(f"cannot write the report to {directory}"):
        directory.mkdir(parents=True, exist_ok=True)
        paths = [directory / name for name in REPORT_FILES]
        contents = (json.dumps(report.to_dict(), indent=2) + "\n", markdown(report), svg(report), table(report))
        for path, text in zip(paths, contents, strict=True):
            path.write_text(text, encoding="utf-8")
    return paths
