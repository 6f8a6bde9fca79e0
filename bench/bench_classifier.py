"""Seed 004's classifier layer: how often a realistic session needs the model, and what the
deterministic layers cost before it.

Replays ``data/coding_session.txt`` (a recorded coding session: reads, greps, edits, tests, an
install, a commit and a push) through a gate with ``policy.classifier = "auto"`` and reports the
fraction of calls that reach the classifier (target: under 10 %), the fraction that would cost a
model call once identical judgements are cached, and the median cost of ``Gate.evaluate`` per call
and per layer (exempt, classifier: the deterministic part before the model, ask, deny), the ask and
deny layers timed on the seed's own examples since the session has none. Run:
``python bench/bench_classifier.py``.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from sandbox.policy.gate import Decision, Gate, SessionState, ToolCall
from sandbox.profile_policy import Policy
from sandbox.tools.params import validate

HERE = Path(__file__).resolve().parent
SESSION = HERE / "data" / "coding_session.txt"
TARGET = 0.10
ROUNDS = 20
# The seed's examples for the layers the session never reaches (timed only, not counted).
PROBES = (
    ("Bash", {"command": "mkfs.ext4 /dev/sda1"}),
    ("Bash", {"command": "rm -rf /"}),
    ("Bash", {"command": "rm -rf ~"}),
    ("Write", {"path": ".env", "content": "TOKEN=x"}),
    ("Bash", {"command": "echo x >> .git/config"}),
    ("Bash", {"command": "npm publish"}),
    ("Bash", {"command": "git push --force origin main"}),
)


def _calls() -> list[ToolCall]:
    calls = []
    for index, line in enumerate(SESSION.read_text().splitlines()):
        if not line.strip() or line.startswith("#"):
            continue
        tool, args = line.split("\t", 1)
        calls.append(ToolCall("s1", "t1", f"c{index}", tool, validate(tool, json.loads(args))))
    return calls


def layer(decision: Decision) -> str:
    if decision.classify:
        return "classifier"
    return {"allow": "exempt", "confirm": "ask", "deny": "deny"}[decision.level]


def timed(gate: Gate, state: SessionState, calls: list[ToolCall]) -> dict[str, list[int]]:
    """Nanoseconds per ``Gate.evaluate``, by the layer that decided the call."""
    by_layer: dict[str, list[int]] = {}
    for _round in range(ROUNDS):
        for call in calls:
            start = time.perf_counter_ns()
            decision = gate.evaluate(call, state)
            elapsed = time.perf_counter_ns() - start
            by_layer.setdefault(layer(decision), []).append(elapsed)
    return by_layer


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        ws = root / "work" / "app"
        for sub in ("src/app", "tests", "web/src", "docs", ".github/workflows"):
            (ws / sub).mkdir(parents=True, exist_ok=True)
        os.environ["SANDBOX_DATA_DIR"] = str(root / "data")
        gate = Gate(ws, root / "data" / "scratch" / "s1", Policy(mode="ask", classifier="auto"), data_dir=root / "data")
        state = SessionState("s1")
        calls = _calls()
        decisions = [gate.evaluate(call, state) for call in calls]
        judged = [(c, d) for c, d in zip(calls, decisions, strict=True) if d.classify]
        distinct = {(d.tool, d.resource) for _c, d in judged}
        by_layer = timed(gate, state, calls)
        probes = [ToolCall("s1", "t1", f"p{i}", tool, validate(tool, args)) for i, (tool, args) in enumerate(PROBES)]
        probed = timed(gate, state, probes)
    samples = [sample for values in by_layer.values() for sample in values]
    share = len(judged) / len(calls)
    print(f"{len(calls)} calls replayed from {SESSION.name}")
    print(f"{len(judged)} reach the classifier: {share:.1%} (target < {TARGET:.0%})")
    print(f"{len(distinct)} distinct judgements after the per-session cache: {len(distinct) / len(calls):.1%}")
    for _call, decision in judged:
        print(f"    judged: {decision.tool} {decision.resource}  ({decision.rule_id})")
    print(
        f"{statistics.median(samples) / 1000:9.1f} µs  median Gate.evaluate over the session (the deterministic layers)"
    )
    for name in ("exempt", "classifier", "ask", "deny"):
        for source, table in (("session", by_layer), ("seed's examples", probed)):
            values = table.get(name)
            if values:
                median, p90 = statistics.median(values) / 1000, statistics.quantiles(values, n=10)[-1] / 1000
                what = f"{name} layer, {len(values) // ROUNDS} calls ({source})"
                print(f"{median:9.1f} µs  median (p90 {p90:.1f} µs) {what}")
    if share >= TARGET:
        print(
            f"above the {TARGET:.0%} target: every judged call runs code or leaves the machine (test runs execute "
            "the project's code, which this session edited; npx may fetch a package; a push to an untrusted "
            "remote), which seed 004 sends to the model; identical ones are judged once per session"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
