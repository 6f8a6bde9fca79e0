"""Median cost of ``Gate.evaluate`` per call: file tools (target <= 50 µs) and Bash (<= 200 µs).

Bash is measured twice: "cold" with a distinct command text every call (the parse cache never
hits: the honest worst case) and "warm" with one repeated command (what an agent retrying or
re-running tests sees). Run: ``python bench/bench_policy.py``.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

from sandbox.policy.gate import Gate, SessionState, ToolCall
from sandbox.profile_policy import Policy
from sandbox.tools.params import validate

if TYPE_CHECKING:
    from collections.abc import Callable

ROUNDS = 3000


def _median_us(fn: Callable[[int], object], rounds: int = ROUNDS) -> float:
    for i in range(200):
        fn(i)  # warm-up: imports, regex compilation, the filesystem cache
    samples = []
    for i in range(rounds):
        start = time.perf_counter_ns()
        fn(i)
        samples.append(time.perf_counter_ns() - start)
    return statistics.median(samples) / 1000.0


def _world(root: Path) -> Gate:
    ws = root / "work" / "app"
    (ws / "src" / "pkg").mkdir(parents=True)
    (ws / "src" / "pkg" / "main.py").write_text("x")
    os.environ["SANDBOX_DATA_DIR"] = str(root / "data")
    return Gate(ws, root / "data" / "scratch" / "s1", Policy(mode="ask"), data_dir=root / "data")


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        gate = _world(Path(tmp))
        state = SessionState("s1")

        def call(tool: str, args: dict[str, object]) -> ToolCall:
            return ToolCall("s1", "t1", "c1", tool, validate(tool, args))

        read = call("Read", {"path": "src/pkg/main.py"})
        write = call("Write", {"path": "src/pkg/new.py", "content": "x"})
        grep = call("Grep", {"pattern": "TODO", "path": "src"})
        bash = "git status && ls -la src | grep foo"
        warm = call("Bash", {"command": bash})
        cold = [call("Bash", {"command": f"{bash}{i}"}) for i in range(ROUNDS + 200)]
        complex_cmd = [
            call("Bash", {"command": f'for f in $(ls src); do echo "$f" > /dev/null; done; cat README{i}.md | wc -l'})
            for i in range(ROUNDS + 200)
        ]
        results = {
            "Read (file tool)": _median_us(lambda _i: gate.evaluate(read, state)),
            "Write (file tool)": _median_us(lambda _i: gate.evaluate(write, state)),
            "Grep (file tool)": _median_us(lambda _i: gate.evaluate(grep, state)),
            f"Bash cold: {bash!r}": _median_us(lambda i: gate.evaluate(cold[i], state)),
            f"Bash warm: {bash!r}": _median_us(lambda _i: gate.evaluate(warm, state)),
            "Bash cold, bashlex path (loop + $(…) + redirect)": _median_us(
                lambda i: gate.evaluate(complex_cmd[i], state)
            ),
        }
    for name, value in results.items():
        print(f"{value:9.1f} µs  median  {name}")


if __name__ == "__main__":
    main()
