"""Seed 004's classifier layer: how often a realistic session needs the model, and what the
deterministic layers cost before it.

Replays ``data/coding_session.txt`` (a recorded coding session: reads, greps, edits, tests, an
install, a commit and a push) through a gate with ``policy.classifier = "auto"`` and reports the
fraction of calls that reach the classifier (target: under 10 %), the fraction that would cost a
model call once identical judgements are cached, and the median cost of ``Gate.evaluate`` per call
(the exempt, ask and deny layers decide in microseconds). Run: ``python bench/bench_classifier.py``.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from sandbox.policy.gate import Gate, SessionState, ToolCall
from sandbox.profile import Policy
from sandbox.tools.params import validate

HERE = Path(__file__).resolve().parent
SESSION = HERE / "data" / "coding_session.txt"
TARGET = 0.10


def _calls() -> list[ToolCall]:
    calls = []
    for index, line in enumerate(SESSION.read_text().splitlines()):
        if not line.strip() or line.startswith("#"):
            continue
        tool, args = line.split("\t", 1)
        calls.append(ToolCall("s1", "t1", f"c{index}", tool, validate(tool, json.loads(args))))
    return calls


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
        samples = []
        for _round in range(20):
            for call in calls:
                start = time.perf_counter_ns()
                gate.evaluate(call, state)
                samples.append(time.perf_counter_ns() - start)
    share = len(judged) / len(calls)
    print(f"{len(calls)} calls replayed from {SESSION.name}")
    print(f"{len(judged)} reach the classifier: {share:.1%} (target < {TARGET:.0%})")
    print(f"{len(distinct)} distinct judgements after the per-session cache: {len(distinct) / len(calls):.1%}")
    for _call, decision in judged:
        print(f"    judged: {decision.tool} {decision.resource}  ({decision.rule_id})")
    print(
        f"{statistics.median(samples) / 1000:9.1f} µs  median Gate.evaluate over the session (the deterministic layers)"
    )
    if share >= TARGET:
        print(f"above the {TARGET:.0%} target: test runs are judged (they run the project's code)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
