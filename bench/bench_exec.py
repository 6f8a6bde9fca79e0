"""Executor benchmarks against raw bubblewrap, as ratios measured in one run.

- per-call overhead (``lifecycle = "call"``): exec.run over N calls of `true` in one jail vs spawning bare `bwrap` with
  the same flags N times (subprocess, no cgroups, no rlimits, no capture);
- kill latency: from the deadline to the last process dead, for a tree of setsid'd,
  double-forked and TERM-ignoring children (target: grace + 200 ms);
- streaming: 1 GiB of stdout through the jail vs the same through bare bwrap read by a plain
  loop (``bench_streams``' own, best of ``BENCH_STREAM_ROUNDS``, taken in turns with the warm jail's),
  and the executor's peak RSS while streaming;
- the warm jail (``[bwrap] lifecycle = "session"``, the default; issue 13 items 2 and 6): the same `true`, kill
  and 1 GiB figures through one bwrap whose PID 1 is the agent (target: `true` <= 0.5x bare bwrap,
  1 GiB >= 0.8x bare bwrap's speed), and the file tools' runner round trip (Read, Write, LS) in
  both jails: served by the agent itself in the warm one, ``python3`` started per call otherwise;
- the file tools through ``sandbox serve`` (issue 13 item 3, target: median Read/Write/LS <= 5 ms):
  one session, the default (warm) jail, calls back to back and spaced by 50 ms (an agent's calls
  are spaced by its model's thinking: the jail prepares the next call's process meanwhile).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import anyio
import psutil

from sandbox import exec as executor
from sandbox import profile as profiles
from sandbox.backends import base, bwrap_argv
from sandbox.backends.environment import base_env

CALLS = int(os.environ.get("BENCH_CALLS", "40"))
KILLS = int(os.environ.get("BENCH_KILLS", "5"))
STREAM = 1 << 30
STREAM_ROUNDS = int(os.environ.get("BENCH_STREAM_ROUNDS", "3"))
TREE = (
    "trap '' TERM; setsid sh -c 'trap \"\" TERM; sleep 1000' & ( (sleep 1000 &) & ); "
    "nohup sleep 1000 >/dev/null 2>&1 & sleep 1000"
)


def raw_cmd(prof: profiles.Profile, ws: Path, argv: list[str]) -> list[str]:
    env = [a for k, v in base_env(prof).items() for a in ("--setenv", k, v)]
    return [
        bwrap_argv.bwrap_path() or "bwrap",
        *bwrap_argv.jail_args(prof, ws, ws),
        "--chdir",
        str(ws),
        "--clearenv",
        *env,
        "--",
        *argv,
    ]


def raw_calls(prof: profiles.Profile, ws: Path) -> list[float]:
    cmd = raw_cmd(prof, ws, ["true"])
    times = []
    for _ in range(CALLS):
        t = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True)
        times.append(time.perf_counter() - t)
    return times


async def sandbox_calls(jail: base.Jail) -> list[float]:
    times = []
    for _ in range(CALLS):
        t = time.perf_counter()
        result = await executor.run(jail, ["true"])
        assert result.exit_code == 0
        times.append(time.perf_counter() - t)
    return times


async def kill_latencies(jail: base.Jail) -> list[float]:
    out = []
    for _ in range(KILLS):
        result = await executor.run(jail, ["/bin/sh", "-c", TREE], timeout=1)
        assert result.timed_out and result.kill_ms is not None
        out.append(result.kill_ms)
    return out


async def streams(prof: profiles.Profile, ws: Path, jail: base.Jail, warm: base.Jail) -> dict[str, float]:
    """Best seconds of ``STREAM_ROUNDS`` for 1 GiB of stdout, taken in turns: a jail per call, the warm
    jail, bare bwrap (a noisy moment falls on all alike); ``peak``: the executor's RSS meanwhile."""
    from bench_streams import bare_bwrap, through

    peak = [psutil.Process().memory_info().rss]
    times: dict[str, list[float]] = {"call": [], "warm": [], "bare": []}
    for _ in range(STREAM_ROUNDS):
        times["call"].append(await through(jail, STREAM, peak))
        times["warm"].append(await through(warm, STREAM, peak))
        times["bare"].append(await anyio.to_thread.run_sync(bare_bwrap, prof, ws, STREAM))
    return {**{name: min(values) for name, values in times.items()}, "peak": peak[0]}


async def interleaved_calls(prof: profiles.Profile, ws: Path, jail: base.Jail) -> tuple[list[float], list[float]]:
    """`true` through bare bwrap and through ``jail`` taken in turns: a load that drifts hits both alike."""
    cmd = raw_cmd(prof, ws, ["true"])
    raw, ours = [], []
    for _ in range(CALLS):
        t = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True)  # noqa: ASYNC221 - timed as it is, loop idle
        raw.append(time.perf_counter() - t)
        t = time.perf_counter()
        result = await executor.run(jail, ["true"])
        assert result.exit_code == 0
        ours.append(time.perf_counter() - t)
    return raw, ours


async def runner_calls(jail: base.Jail, ws: Path) -> dict[str, float]:
    """Median milliseconds of one runner round trip per file tool (issue 13 item 3; target <= 5 ms via serve)."""
    from sandbox.tools.run import run_in_jail

    (ws / "bench.txt").write_text("line\n" * 100)
    requests = {
        "Read": {"op": "read", "path": str(ws / "bench.txt")},
        "Write": {"op": "write", "path": str(ws / "bench-out.txt"), "content": "x\n" * 100},
        "LS": {"op": "ls", "path": str(ws)},
    }
    out = {}
    for tool, request in requests.items():
        times = []
        for _ in range(max(10, CALLS // 2)):
            t = time.perf_counter()
            reply = await run_in_jail(jail, request)
            assert reply["ok"], reply
            times.append(time.perf_counter() - t)
        out[tool] = ms(times)
    return out


SERVE_CALLS = {
    "Read": {"path": "bench.txt"},
    "Write": {"path": "bench-serve.txt", "content": "x\n" * 100},
    "LS": {"path": "."},
}


async def serve_calls(ws: Path, gap_s: float) -> dict[str, float]:
    """Median milliseconds of Read, Write and LS through ``sandbox serve`` (JSON-RPC, the gate, the audit)."""
    from bench_mcp import via_serve

    (ws / "bench.txt").write_text("line\n" * 100)
    medians = await via_serve(ws, max(10, CALLS // 2) + 2, SERVE_CALLS, gap_s)
    return {tool: seconds * 1000 for tool, seconds in medians.items()}


def ms(values: list[float]) -> float:
    return statistics.median(values) * 1000


async def main() -> int:
    ws = Path(tempfile.mkdtemp(prefix="bench-ws-"))
    prof = profiles.load("default").with_overrides(**{"bwrap.lifecycle": "call"})  # a fresh jail per call
    backend = base.get("bwrap")
    warm_prof = prof.with_overrides(**{"bwrap.lifecycle": "session"})
    async with await backend.open_jail(ws, prof) as jail, await backend.open_jail(ws, warm_prof) as warm:
        await executor.run(jail, ["true"])  # warm caches (probe, masks, cgroup discovery)
        await executor.run(warm, ["true"])
        rss_before = psutil.Process().memory_info().rss
        best = await streams(prof, ws, jail, warm)
        raw = raw_calls(prof, ws)
        ours = await sandbox_calls(jail)
        kills = await kill_latencies(jail)
        tools_cold = await runner_calls(jail, ws)
        warm_raw, warm_ours = await interleaved_calls(prof, ws, warm)
        warm_kills = await kill_latencies(warm)
        tools_warm = await runner_calls(warm, ws)
    serve_tight = await serve_calls(ws, 0)
    serve_spaced = await serve_calls(ws, 0.05)
    grace_ms = prof.timeouts.kill_grace_s * 1000
    print(
        f"exec overhead   : exec.run median {ms(ours):.2f} ms, bare bwrap {ms(raw):.2f} ms over {CALLS} calls "
        f"-> ratio {ms(ours) / ms(raw):.2f}x (target <= 1.30x)"
    )
    print(
        f"tree kill       : median {statistics.median(kills):.0f} ms, max {max(kills):.0f} ms after the deadline "
        f"(grace {grace_ms:.0f} ms; target <= {grace_ms + 200:.0f} ms every time) over {KILLS} kills"
    )
    print(
        f"stdout 1 GiB    : through the jail {STREAM / best['call'] / 2**20:.0f} MiB/s, bare bwrap "
        f"{STREAM / best['bare'] / 2**20:.0f} MiB/s -> ratio {best['bare'] / best['call']:.2f}x of raw speed "
        f"(best of {STREAM_ROUNDS}, taken in turns)"
    )
    print(
        f"executor memory : peak RSS {best['peak'] / 2**20:.0f} MiB while streaming 1 GiB "
        f"(+{(best['peak'] - rss_before) / 2**20:.1f} MiB over the start)"
    )
    warm_ratio = ms(warm_ours) / ms(warm_raw)
    print(
        f"warm jail true  : exec.run median {ms(warm_ours):.2f} ms, bare bwrap {ms(warm_raw):.2f} ms over {CALLS} "
        f"calls, taken in turns -> ratio {warm_ratio:.2f}x (target <= 0.50x)"
    )
    print(
        f"warm jail kill  : median {statistics.median(warm_kills):.0f} ms, max {max(warm_kills):.0f} ms after "
        f"the deadline (target <= {grace_ms + 200:.0f} ms)"
    )
    print(
        f"warm jail 1 GiB : {STREAM / best['warm'] / 2**20:.0f} MiB/s -> ratio {best['bare'] / best['warm']:.2f}x of "
        f"bare bwrap's speed (target >= 0.80x; best of {STREAM_ROUNDS}, taken in turns)"
    )
    print(
        "file tools      : runner round trip median, warm jail against a jail per call: "
        + ", ".join(f"{t} {tools_warm[t]:.1f} ms vs {tools_cold[t]:.1f} ms" for t in tools_warm)
        + " (target <= 5 ms through serve)"
    )
    worst = max(serve_spaced.values())
    print(
        "file tools serve: median through sandbox serve, spaced 50 ms / back to back: "
        + ", ".join(f"{t} {serve_spaced[t]:.1f} / {serve_tight[t]:.1f} ms" for t in serve_spaced)
        + f" (target <= 5 ms: {'met' if worst <= 5 else 'not met'})"
    )
    ok = ms(ours) / ms(raw) <= 1.3 and max(kills) <= grace_ms + 200
    ok = ok and warm_ratio <= 0.5 and max(warm_kills) <= grace_ms + 200 and best["bare"] / best["warm"] >= 0.8
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(anyio.run(main))
