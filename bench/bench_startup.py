"""Start-up cost of one whole process, ours against the raw tool and the peers, in one run.

Every row is a fresh process timed from spawn to exit (wall), N repetitions interleaved round
by round, so a noisy neighbour slows every row alike; medians and p90 are printed with ratios.

* ``sandbox run --backend bwrap -- true``, default profile: the console script of this checkout
  installed as a wheel into a venv of the run's own (what ``pip install`` users run), and of the
  editable checkout (``make bench``'s .venv: its import hook costs tens of ms); then the wheel's
  first run of a profile here (its cache of accepted profiles emptied before each run: the
  full path, pydantic and asyncio), where the other rows measure later runs (the quick path);
* bare ``bwrap`` with our jail's flags (``jail_args``, ``--clearenv`` and the scrubbed env),
  without what the executor adds per call (info/block fds, cgroups, rlimits, capture);
* ``srt`` (npm ``@anthropic-ai/sandbox-runtime``) and the Codex CLI's native ``codex sandbox``
  (npm ``@openai/codex``), installed on first use into bench/.peers at pinned versions;
* ``sandbox run --backend docker -- true`` against ``docker run --rm`` of our image;
* ``sandbox --version``, and ``sandbox serve``: spawn to the ``initialize`` reply, one more
  ``initialize`` on the warm server (the protocol's own cost); in a process of its own, spawn to
  the ``session.open`` reply (so that work made lazy shows where it went).

Our rows run from cached bytecode (``PYTHONDONTWRITEBYTECODE`` dropped, as an installed wheel has
it) and keep their state in the run's temp dir (``SANDBOX_DATA_DIR``). Each row runs once unmeasured
first. Targets: ours within 1.5x of Codex's native binary; ``initialize`` <= 100 ms from spawn.
A row that cannot run here prints why instead of a figure; exit 1 when a target is missed.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import select
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from sandbox import __version__
from sandbox import profile as profiles
from sandbox.backends import bwrap_argv
from sandbox.backends.environment import base_env

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

T = TypeVar("T")
HERE = Path(__file__).resolve().parent
PEERS_DIR = HERE / ".peers"
# Pinned: a figure is only comparable with the version it was measured on. srt needs Node >= 22.12,
# newer than Debian's; the npm "node" package brings one (as integrations/pi does for pi).
PEERS = {"node": "22.23.3", "@anthropic-ai/sandbox-runtime": "0.0.83", "@openai/codex": "0.171.0"}
CODEX_TRIPLES = {"x86_64": ("x64", "x86_64-unknown-linux-musl"), "aarch64": ("arm64", "aarch64-unknown-linux-musl")}
IMAGE = f"sandbox-runtime:{__version__}"
TARGET_VS_CODEX = 1.5
TARGET_INITIALIZE_MS = 100.0
REPLY_TIMEOUT_S = 60.0
SPAWN_TRIES = 5
FAILURE_STREAK = 3  # a row whose runs fail this often in a row is stopped, with the reason
BWRAP_REFS = ("codex", "bwrap")  # what a bubblewrap-based row is divided by
INITIALIZE = "initialize"


def say(text: str) -> None:
    print(text, flush=True)


class Unavailable(Exception):
    """This row cannot run here; the message says exactly why."""


def last_line(text: str | bytes) -> str:
    """The message that says why: the last line that names an error, else the last line with words
    in it (an exception group's traceback ends in box-drawing lines)."""
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    lines = [line.strip(" \t|+-") for line in text.splitlines()]
    lines = [line for line in lines if line]
    errors = [line for line in lines if "error" in line.lower()]  # docker ends with a usage hint
    return (errors or lines or ["no message"])[-1][:300]


def forking(spawn: Callable[[], T]) -> T:
    """``spawn()``, again when fork() itself failed: EAGAIN means the host is out of processes for
    a moment (a fork-bomb test next door), which says nothing about the row being measured."""
    for _ in range(SPAWN_TRIES - 1):
        try:
            return spawn()
        except BlockingIOError:
            time.sleep(1)
    return spawn()


def run_once(argv: Sequence[str], cwd: Path, env: dict[str, str] | None = None) -> float:
    """Wall seconds from spawn to exit of one process; a non-zero exit makes the row unavailable."""

    def spawn() -> tuple[float, subprocess.CompletedProcess[bytes]]:
        started = time.perf_counter()
        done = subprocess.run(
            argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, capture_output=True, timeout=120, check=False
        )
        return time.perf_counter() - started, done

    elapsed, done = forking(spawn)
    if done.returncode != 0:
        raise Unavailable(f"exit {done.returncode}: {last_line(done.stderr or done.stdout)}")
    return elapsed


@dataclass
class Row:
    label: str
    key: str  # short name, as other rows' ratio columns name it
    refs: tuple[str, ...] = ()  # the rows this one is divided by in the ratio column
    samples: list[float] = field(default_factory=list)
    why_not: str | None = None  # why it was never measured: no figure at all
    failures: list[str] = field(default_factory=list)  # runs that failed; their time is no sample


@dataclass
class Case:
    """One process per repetition; ``once`` returns a sample in seconds for each of ``rows``."""

    rows: list[Row]
    once: Callable[[], Sequence[float]]
    why_not: str | None = None
    streak: int = 0

    def mark(self, reason: str) -> None:
        self.why_not = reason
        for row in self.rows:
            row.why_not, row.samples = reason, []

    def failed(self, rnd: int, reason: str) -> None:
        """One run failed (a daemon that hiccups, say): count it; after a streak, stop the case
        (the runs that succeeded before still count)."""
        self.streak += 1
        stop = self.streak >= FAILURE_STREAK
        for row in self.rows:
            row.failures.append(f"round {rnd}: {reason}" + (f" (stopped after {self.streak} in a row)" if stop else ""))
        if stop:
            self.why_not = reason


def process_case(row: Row, argv: Sequence[str], cwd: Path, env: dict[str, str] | None = None) -> Case:
    return Case([row], lambda: (run_once(argv, cwd, env),))


def absent(row: Row, reason: str) -> Case:
    case = Case([row], lambda: ())
    case.mark(reason)
    return case


# --------------------------------------------------------------------------------------- ours


def ours_bin() -> Path:
    """The console script of the venv this benchmark runs in (make bench: .venv/bin/sandbox)."""
    return Path(sys.executable).parent / "sandbox"


def ours_env(data_dir: Path) -> dict[str, str]:
    """Our rows' environment: their state (audit log, scratch dirs) goes to the run's temp dir."""
    # An installed wheel runs from compiled bytecode; without it every run would compile each
    # module of an editable checkout again (about 100 ms here), which no user pays twice.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    return {**env, "SANDBOX_DATA_DIR": str(data_dir)}


def bare_bwrap_argv(ws: Path) -> list[str]:
    # Exactly the jail's mounts, namespaces and env; what the executor adds per call (info and
    # block fds, cgroup placement, rlimits, capture) is the cost the ratio shows.
    prof = profiles.load("default")
    env = [a for k, v in base_env(prof).items() for a in ("--setenv", k, v)]
    path = bwrap_argv.bwrap_path()
    if path is None:
        raise Unavailable("bubblewrap is not installed (apt-get install bubblewrap)")
    return [path, *bwrap_argv.jail_args(prof, ws, ws), "--chdir", str(ws), "--clearenv", *env, "--", "true"]


class ServeCase:
    """``sandbox serve``: spawn and send ``initialize`` at once (as the pi client does); then, once the
    full server is up, one more ``initialize`` times the request -> reply path alone. With ``open_session``
    (a process of its own, so that a failure there costs the other rows nothing) it goes on to
    ``session.open`` on the workspace: a start-up made lazy shows there where its cost went."""

    def __init__(self, sandbox: Path, workspace: Path, env: dict[str, str], open_session: bool) -> None:
        self.argv = [str(sandbox), "serve"]
        self.workspace = workspace
        self.env = env
        self.open_session = open_session

    def once(self) -> tuple[float, ...]:
        with tempfile.TemporaryFile() as log:
            # The clock starts with each try: a fork that failed is no part of the sample.
            started, proc = forking(
                lambda: (
                    time.perf_counter(),
                    subprocess.Popen(
                        self.argv,
                        cwd=self.workspace,
                        env=self.env,
                        stdin=subprocess.PIPE,
                        stdout=subprocess.PIPE,
                        stderr=log,
                    ),
                )
            )
            try:
                cold = self._call(proc, 1, "initialize", {"client": "bench"}) - started
                if self.open_session:
                    return (self._call(proc, 2, "session.open", {"workspace": str(self.workspace)}) - started,)
                # The first reply comes before the full server has imported (sandbox.protocol); the
                # second waits for it; the third times the protocol's own request -> reply path.
                self._call(proc, 2, "initialize", {"client": "bench"})
                sent = time.perf_counter()
                return cold, self._call(proc, 3, "initialize", {"client": "bench"}) - sent
            except Unavailable as exc:
                log.seek(0)
                raise Unavailable(f"{exc}; stderr: {last_line(log.read())}") from None
            finally:
                self._stop(proc)

    @staticmethod
    def _call(proc: subprocess.Popen[bytes], rid: int, method: str, params: dict[str, str]) -> float:
        """Send one request; the time its reply arrived."""
        assert proc.stdin is not None and proc.stdout is not None
        request = {"jsonrpc": "2.0", "id": rid, "method": method, "params": params}
        proc.stdin.write(json.dumps(request).encode() + b"\n")
        proc.stdin.flush()
        line = _read_line(proc.stdout.fileno(), REPLY_TIMEOUT_S)
        at = time.perf_counter()
        reply = json.loads(line)
        if reply.get("id") != rid or "result" not in reply:
            raise Unavailable(f"{method} did not succeed: {line[:300]!r}")
        return at

    @staticmethod
    def _stop(proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdin is not None
        proc.stdin.close()  # end of input: the server closes every session and exits
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def _read_line(fd: int, timeout: float) -> bytes:
    """One protocol line, without buffering past it (the next reply must not be read early)."""
    deadline = time.monotonic() + timeout
    data = b""
    while not data.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            raise Unavailable(f"no reply within {timeout:.0f} s")
        chunk = os.read(fd, 1)
        if not chunk:
            raise Unavailable("the server closed stdout before replying")
        data += chunk
    return data


# -------------------------------------------------------------------------------------- peers


def installed(package: str) -> str | None:
    meta = PEERS_DIR / "node_modules" / package / "package.json"
    try:
        version = json.loads(meta.read_text())["version"]
    except (OSError, ValueError, KeyError):
        return None
    return str(version)


def ensure_peers() -> str | None:
    """npm-install the pinned peers into bench/.peers when missing; ``None`` or why not."""
    missing = [f"{name}@{version}" for name, version in PEERS.items() if installed(name) != version]
    if not missing:
        return None
    npm = shutil.which("npm")
    if npm is None:
        return "npm is not installed (apt-get install npm), so the peers cannot be installed"
    say(f"installing {' '.join(missing)} into {PEERS_DIR.relative_to(HERE.parent)} ...")
    PEERS_DIR.mkdir(exist_ok=True)
    cmd = [
        npm,
        "install",
        "--prefix",
        str(PEERS_DIR),
        "--no-audit",
        "--no-fund",
        "--save-exact",
        *(f"{name}@{version}" for name, version in PEERS.items()),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=900)
    if done.returncode != 0:
        return f"npm install failed (exit {done.returncode}): {last_line(done.stderr)}"
    return None


def node_bin() -> Path:
    return PEERS_DIR / "node_modules" / "node" / "bin" / "node"


def srt_case(ws: Path, cfg_dir: Path, problem: str | None) -> Case:
    row = Row(f"srt {PEERS['@anthropic-ai/sandbox-runtime']} -- true", "srt", BWRAP_REFS)
    if problem:
        return absent(row, problem)
    # Closest to our default: no domain allowed (no network), the workspace (cwd) writable,
    # everything else read-only. Per call srt starts Node, checks bwrap/socat/rg, scans for
    # deny paths, starts its HTTP and SOCKS proxies on the host, then runs bwrap (net, pid and
    # user namespaces, / bound read-only) with socat bridges inside and applies its seccomp filter.
    settings = cfg_dir / "srt-settings.json"
    settings.write_text(
        json.dumps(
            {
                "network": {"allowedDomains": [], "deniedDomains": []},
                "filesystem": {"denyRead": [], "allowWrite": ["."], "denyWrite": []},
            }
        )
    )
    cli = PEERS_DIR / "node_modules" / "@anthropic-ai" / "sandbox-runtime" / "dist" / "cli.js"
    return process_case(row, [str(node_bin()), str(cli), "--settings", str(settings), "true"], ws)


def codex_binary() -> Path:
    arch, triple = CODEX_TRIPLES.get(platform.machine(), (None, None))
    if sys.platform != "linux" or arch is None or triple is None:
        raise Unavailable(f"no Codex native binary for {sys.platform}/{platform.machine()}")
    path = PEERS_DIR / "node_modules" / "@openai" / f"codex-linux-{arch}" / "vendor" / triple / "bin" / "codex"
    if not path.is_file():
        raise Unavailable(f"the Codex package has no native binary at {path}")
    return path


def codex_case(ws: Path, problem: str | None) -> Case:
    row = Row(f"codex sandbox {PEERS['@openai/codex']} (native) -- true", "codex", ("bwrap",))
    try:
        if problem:
            raise Unavailable(problem)
        binary = codex_binary()
    except Unavailable as exc:
        return absent(row, str(exc))
    # The built-in ":workspace" permission profile is the closest to our default: / read-only,
    # the workspace (-C) and /tmp writable, network restricted. Per call the binary reads its
    # config from CODEX_HOME, links its helper there, re-executes itself as codex-linux-sandbox,
    # runs the system bwrap (user, pid, ipc and net namespaces) and applies seccomp before exec.
    # 0.171 has no `sandbox linux` subcommand any more: `codex sandbox linux` would run `linux`.
    home = PEERS_DIR / "codex-home"  # not under /tmp: codex refuses to link its helpers there
    home.mkdir(exist_ok=True)
    env = {**os.environ, "CODEX_HOME": str(home)}
    return process_case(row, [str(binary), "sandbox", "-P", ":workspace", "-C", str(ws), "--", "true"], ws, env)


# ------------------------------------------------------------------------------------- docker


def docker_problem() -> str | None:
    cli = shutil.which("docker")
    if cli is None:
        return "no docker CLI"
    info = subprocess.run([cli, "info", "--format", "{{.ServerVersion}}"], capture_output=True, text=True, check=False)
    if info.returncode != 0:
        return f"dockerd is not reachable: {last_line(info.stderr)}"
    image = subprocess.run([cli, "image", "inspect", IMAGE], capture_output=True, check=False)
    if image.returncode != 0:
        return f"the image {IMAGE} is not built (make image)"
    return None


def docker_cases(sandbox: Path, ws: Path, env: dict[str, str]) -> list[Case]:
    ours = Row("sandbox run --backend docker -- true", "ours docker", ("docker run",))
    theirs = Row(f"docker run --rm {IMAGE} true", "docker run")
    problem = docker_problem()
    if problem:
        return [absent(ours, problem), absent(theirs, problem)]
    # The raw CLI with our default's confinement: no network, read-only root, no capabilities,
    # the workspace bound at its path, the same memory and pids limits, uid 1000 (the executor's
    # choice for a root-owned workspace).
    raw = [
        "docker",
        "run",
        "--rm",
        "--network",
        "none",
        "--read-only",
        "--cap-drop",
        "ALL",
        "--security-opt",
        "no-new-privileges",
        "--tmpfs",
        "/tmp",
        "--memory",
        "2g",
        "--memory-swap",
        "2g",
        "--pids-limit",
        "512",
        "-u",
        "1000:1000",
        "-v",
        f"{ws}:{ws}",
        "-w",
        str(ws),
        IMAGE,
        "true",
    ]
    return [
        process_case(ours, [str(sandbox), "run", "--backend", "docker", "--", "true"], ws, env),
        process_case(theirs, raw, ws),
    ]


# ----------------------------------------------------------------------------------- the run


def wheel_venv(root: Path) -> Path:
    """This checkout installed as a wheel (``pip install .``) into a fresh venv; its console script."""
    venv = root / "wheel-venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    done = subprocess.run(
        [str(venv / "bin" / "pip"), "install", "-q", str(Path(__file__).resolve().parents[1])],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise Unavailable(f"pip install of this checkout failed: {last_line(done.stderr)}")
    return venv / "bin" / "sandbox"


def first_run_case(row: Row, sandbox: Path, ws: Path, env: dict[str, str], cache: Path) -> Case:
    """A profile's first run here: the quick path's cache emptied before each (not timed) run."""
    argv = [str(sandbox), "run", "--backend", "bwrap", "--", "true"]

    def once() -> list[float]:
        shutil.rmtree(cache, ignore_errors=True)
        return [run_once(argv, ws, env)]

    return Case([row], once)


def build_cases(root: Path) -> list[Case]:
    def ws(name: str) -> Path:
        path = root / name  # one workspace per row: peers leave mount points in theirs
        path.mkdir()
        return path

    sandbox = ours_bin()
    env = ours_env(root / "data")
    problem = ensure_peers()
    ours = Row("sandbox run -- true (bwrap), installed wheel", "ours", BWRAP_REFS)
    first = Row("  the same, a profile's first run here (full path)", "first run", BWRAP_REFS)
    try:
        wheel = wheel_venv(root)
    except (Unavailable, subprocess.CalledProcessError) as exc:
        cases = [absent(ours, str(exc)), absent(first, str(exc))]
    else:
        cases = [
            process_case(ours, [str(wheel), "run", "--backend", "bwrap", "--", "true"], ws("ours"), env),
            first_run_case(
                first, wheel, ws("first"), ours_env(root / "data-first"), root / "data-first" / "cache" / "profiles"
            ),
        ]
    editable = Row("  the same, editable checkout (.venv)", "editable", BWRAP_REFS)
    cases.append(process_case(editable, [str(sandbox), "run", "--backend", "bwrap", "--", "true"], ws("editable"), env))
    landlock = Row("sandbox run -- true (landlock, ro, nothing required), editable", "landlock", BWRAP_REFS)
    profile = root / "landlock.toml"
    profile.write_text('description = "bench"\nrequires = []\n[mount]\nstrategy = "ro"\n')
    landlock_argv = [str(sandbox), "run", "--backend", "landlock", "--profile", str(profile), "--", "true"]
    cases.append(process_case(landlock, landlock_argv, ws("landlock"), env))
    bare = Row("bare bwrap, our jail's flags -- true", "bwrap")
    try:
        cases.append(process_case(bare, bare_bwrap_argv(ws("bwrap")), root))
    except Unavailable as exc:
        cases.append(absent(bare, str(exc)))
    cases += [srt_case(ws("srt"), root, problem), codex_case(ws("codex"), problem)]
    cases += docker_cases(sandbox, ws("docker"), env)
    version = Row("sandbox --version", "version", ("codex",))
    cases.append(process_case(version, [str(sandbox), "--version"], root, env))
    serve = ServeCase(sandbox, ws("serve"), env, open_session=False)
    cases.append(
        Case(
            [
                Row("sandbox serve: spawn -> initialize reply", INITIALIZE),
                Row("sandbox serve: initialize request -> reply (warm)", "warm initialize"),
            ],
            serve.once,
        )
    )
    opening = ServeCase(sandbox, ws("session"), env, open_session=True)
    cases.append(Case([Row("sandbox serve: spawn -> initialize, session.open reply", "session.open")], opening.once))
    return cases


def warm_up(cases: list[Case]) -> None:
    """One unmeasured run each (page cache, codex's helper links, docker layers); a row whose
    warm-up fails FAILURE_STREAK times is not measured, and that failure is its reason."""
    for case in cases:
        for attempt in range(FAILURE_STREAK):
            if case.why_not is not None:
                break
            try:
                case.once()
                break
            except (Unavailable, OSError, subprocess.TimeoutExpired) as exc:
                if attempt == FAILURE_STREAK - 1:
                    case.mark(str(exc))


def measure(cases: list[Case], n: int) -> None:
    for rnd in range(n):
        shift = rnd % len(cases)  # rotate the order so no row always follows the same one
        for case in cases[shift:] + cases[:shift]:
            if case.why_not is not None:
                continue
            try:
                samples = case.once()
            except (Unavailable, OSError, subprocess.TimeoutExpired) as exc:
                case.failed(rnd + 1, str(exc))
                continue
            case.streak = 0
            for row, sample in zip(case.rows, samples, strict=True):
                row.samples.append(sample)


def p90(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.9 * len(ordered)) - 1)]


def median_ms(row: Row | None) -> float | None:
    if row is None or not row.samples:
        return None
    return statistics.median(row.samples) * 1000


def report(cases: list[Case], n: int) -> int:
    rows = {row.key: row for case in cases for row in case.rows}
    say(f"\nstart-up, wall time of one process from spawn to exit; {n} runs of each, interleaved")
    if "PYTHONDONTWRITEBYTECODE" in os.environ:
        say("(PYTHONDONTWRITEBYTECODE is set here; our rows run without it, from cached bytecode as a wheel does)")
    say(f"{'':56}{'median ms':>10}{'p90 ms':>9}  ratio of the medians")
    for row in rows.values():
        mine = median_ms(row)
        if mine is None:
            why = row.why_not or (row.failures[-1] if row.failures else "no run")
            say(f"{row.label:56}{'-':>10}{'-':>9}  not measured: {why}")
            continue
        ratios = [f"{mine / theirs:.2f}x {key}" for key in row.refs if (theirs := median_ms(rows.get(key))) is not None]
        say(f"{row.label:56}{mine:10.1f}{p90(row.samples) * 1000:9.1f}  {', '.join(ratios)}")
        if row.failures:
            say(f"{'':8}{len(row.failures)} runs failed and are left out; last: {row.failures[-1]}")
    return targets(rows)


def targets(rows: dict[str, Row]) -> int:
    ok = True
    mine, theirs, first = median_ms(rows["ours"]), median_ms(rows["codex"]), median_ms(rows[INITIALIZE])
    if mine is not None and theirs is not None:
        met = mine / theirs <= TARGET_VS_CODEX
        ok &= met
        say(
            f"target: sandbox run within {TARGET_VS_CODEX}x of Codex's native binary: "
            f"{mine / theirs:.2f}x -> {'met' if met else 'MISSED'}"
        )
    else:
        ok = False
        say("target: sandbox run against Codex's native binary: not measured (see above)")
    if first is not None:
        met = first <= TARGET_INITIALIZE_MS
        ok &= met
        say(
            f"target: initialize <= {TARGET_INITIALIZE_MS:.0f} ms from spawn: {first:.0f} ms -> "
            f"{'met' if met else 'MISSED'}"
        )
    else:
        ok = False
        say("target: initialize from spawn: not measured (see above)")
    return 0 if ok else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("-n", type=int, default=20, help="runs of each row (default 20)")
    opts = parser.parse_args()
    if opts.n < 1:
        parser.error("-n must be at least 1")
    if not ours_bin().exists():
        say(f"bench_startup: no console script at {ours_bin()} (run from the venv: make bench)")
        return 1
    with tempfile.TemporaryDirectory(prefix="bench-startup-") as tmp:
        cases = build_cases(Path(tmp))
        warm_up(cases)
        measure(cases, opts.n)
        return report(cases, opts.n)


if __name__ == "__main__":
    sys.exit(main())
