"""``sandbox run``: one command in a jail, as a Unix tool.

Its contract is the one in :mod:`sandbox.cli`'s docstring. A call takes the quick path
(:mod:`sandbox.cli.launch`: no event loop, no pydantic) where that path keeps every promise of
this one; otherwise the profile is validated here, the flags applied to it (a bad value is blamed
on the flag that gave it), and the call runs through the executor with our stdio driven by the
event loop (:mod:`sandbox.cli.stdio`). The full path on bwrap leaves the validated profile for
the next run's quick path.
"""

from __future__ import annotations

import contextlib
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sandbox import calls
from sandbox.cli import options
from sandbox.cli.output import emit, guard, say
from sandbox.errors import InvalidArgument
from sandbox.textsafe import printable
from sandbox.vocabulary import EXIT_SANDBOX

if TYPE_CHECKING:
    import argparse

    import anyio

    from sandbox import changes as kept_changes
    from sandbox import exec as executor
    from sandbox import profile as profiles
    from sandbox.backends import base
    from sandbox.cli import launch
    from sandbox.cli.options import Subparsers
    from sandbox.errors import SandboxError

EXIT_TIMEOUT = 124
SIGPIPE = getattr(signal, "SIGPIPE", 13)  # Windows has none; a closed stdout still ends the call as 141
EXIT_SIGPIPE = 128 + SIGPIPE

# Which flag sets which profile key: errors in a flag's value name the flag, not the file.
_FLAGS = {
    "mount.strategy": "--mount",
    "limits.memory": "--memory",
    "limits.pids": "--pids",
    "network.mode": "--network",
    "network.allow": "--allow-host",
    "backend": "--backend",
}


def register(sub: Subparsers) -> None:
    run = sub.add_parser("run", help="run a command in a jail", description="Run ARGV in a jail.")
    options.add_profile(run)
    options.add_backend(run)
    options.add_workspace(run)
    options.add_mount(run)
    run.add_argument(
        "--timeout",
        type=float,
        help="seconds, from 1 to the profile's timeouts.max_s (default: its timeouts.default_s)",
    )
    run.add_argument("--memory", help="memory limit, binary units as Docker reads them: 512m, 2g = 2GiB")
    run.add_argument("--pids", type=int, help="process limit (at least 8)")
    options.add_network(run)
    options.add_json(run, help="one JSON object on stdout at the end")
    run.add_argument(
        "--apply",
        action="store_true",
        help="copy/overlay mount: apply the kept changeset to the workspace, except flagged entries (git hooks, "
        "dotfiles, new executables…), which are held back until `sandbox changes apply ID --include-flagged`",
    )
    options.add_argv(run)
    run.set_defaults(func=guard(cmd_run, EXIT_SANDBOX, answer=_json_refusal))


def _json_refusal(args: argparse.Namespace, error: SandboxError) -> None:
    if args.json:
        emit({"error": error.to_dict(), "exit_code": EXIT_SANDBOX})


def _load_profile(args: argparse.Namespace) -> profiles.Profile:
    from sandbox import profile as profiles

    options.check_backend(args.backend)
    prof = profiles.load(args.profile)
    values = {
        "mount.strategy": args.mount,
        "limits.memory": args.memory,
        "limits.pids": args.pids,
        "network.mode": options.network_mode(args),
        "network.allow": [*prof.network.allow, *args.allow_host] if args.allow_host else None,
        "backend": args.backend,
        "bwrap.lifecycle": "call",  # one call: a warm jail would only add its agent's start
    }
    return prof.override(values, _FLAGS)


def cmd_run(args: argparse.Namespace) -> int:
    argv = options.command(args.argv)
    if not argv:
        raise InvalidArgument("no command given: sandbox run [options] -- ARGV...")
    quick: launch.Outcome | None = None
    if sys.platform != "win32":  # the quick path is bubblewrap's (and POSIX through and through)
        from sandbox.cli import launch

        quick = launch.run(args, argv)
    if quick is not None:
        with contextlib.suppress(OSError):  # a closed stderr: the review has no reader either
            _review(quick, None, None, apply=False)
        return _exit_status(quick, quick.received)
    import anyio

    prof = _load_profile(args)
    args.timeout_s = calls.check_timeout(args.timeout, prof)
    workspace = args.workspace or Path.cwd()
    return anyio.run(_run, args, prof, workspace, argv)


async def _run(args: argparse.Namespace, prof: profiles.Profile, workspace: Path, argv: list[str]) -> int:
    import anyio

    from sandbox import exec as executor
    from sandbox.backends import base
    from sandbox.cli import stdio

    backend = base.choose(prof.backend, prof)
    if backend.name == "bwrap":
        from sandbox.cli import launch

        launch.remember(args, prof)  # the next run of this profile here may take the quick path
    abort = anyio.Event()
    received: list[int] = []

    def reader_gone() -> None:
        received.append(SIGPIPE)
        abort.set()

    out, err = stdio.Sink(1, reader_gone), stdio.Sink(2, reader_gone)
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(_watch_signals, abort, received)
            async with await backend.open_jail(workspace, prof) as jail:
                _watch_network(jail, prof)
                result = await executor.run(
                    jail,
                    calls.checked_argv(jail, argv),
                    timeout=args.timeout,
                    abort=abort,
                    stdin=stdio.stdin_source(),
                    on_stdout=None if args.json else out.write,
                    on_stderr=None if args.json else err.write,
                )
                changes = await jail.changes()
                kept = await _keep(jail, changes, prof)
                applied = await kept.apply() if kept is not None and args.apply else None
            tg.cancel_scope.cancel()
    finally:
        out.close()
        err.close()
    if kept is not None and changes is not None:
        changes.changes = kept.changeset.changes  # as kept: an entry that could not be is never applicable
    return _report(args, prof, result, changes, kept, applied, received, backend.probe().limits_in_force(prof))


def _watch_network(jail: base.Jail, prof: profiles.Profile) -> None:
    """An allowlist run: each refused connection goes to the audit (``sandbox audit network``), and
    with ``network.ask`` a host no rule names is asked about on the terminal, if stdin is one (it
    is then not the command's); otherwise it is refused (``ask-unavailable``), never waited on."""
    egress = jail.egress
    if egress is None:
        return
    import dataclasses
    import uuid

    from sandbox.audit import AuditLog
    from sandbox.policy.approvals import ApprovalRequest, TerminalApprover

    run_id, log = f"run-{uuid.uuid4().hex[:12]}", AuditLog()
    egress.listeners.append(lambda denial: log.record_denial(run_id, "", dataclasses.asdict(denial)))
    if prof.network.ask and sys.stdin.isatty():
        terminal = TerminalApprover()
        egress.ask_with(lambda host, port: terminal.prompt(ApprovalRequest.for_connection(run_id, host, port)))


async def _keep(jail: base.Jail, changes: Any, prof: profiles.Profile) -> kept_changes.Kept | None:
    """Keep a non-empty changeset under an id before the jail's close removes its private tree."""
    if jail.tree is None or changes is None or not changes.changes:
        return None
    from sandbox import changes as kept_changes

    limit = prof.limits.kept_changes
    return await kept_changes.keep(
        jail.tree, changes, source="run", profile=prof.name, backend=jail.backend, limit=limit
    )


async def _watch_signals(abort: anyio.Event, received: list[int]) -> None:
    import anyio

    if sys.platform == "win32":  # no signal receiver there: Ctrl-C cancels the run, which kills the job
        return
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM, signal.SIGHUP) as signals:
        async for signum in signals:
            received.append(signum)
            abort.set()


def _exit_status(result: executor.ExecResult | launch.Outcome, received: list[int]) -> int:
    if SIGPIPE in received:
        return EXIT_SIGPIPE  # as a Unix tool ends when its reader has gone: quietly
    if result.timed_out:
        return EXIT_TIMEOUT
    if result.aborted and received:
        return 128 + received[0]
    return result.exit_code


def _report(
    args: argparse.Namespace,
    prof: profiles.Profile,
    result: executor.ExecResult,
    changes: Any,
    kept: kept_changes.Kept | None,
    applied: Any,
    received: list[int],
    enforced: dict[str, Any],
) -> int:
    from sandbox.network.egress import summary as network_summary

    code = _exit_status(result, received)
    if args.json:
        emitted = emit(
            {
                **result.model_dump(exclude={"spawn_ms", "kill_ms", "oom_killed", "peak_memory_bytes"}),
                "profile": prof.name,
                "network": result.network or network_summary(prof.network),
                "limits": prof.limits.in_force(),
                "limits_enforced": enforced,  # how this host enforces each (cgroup per call, rlimit per process)
                "timeout_s": args.timeout_s,
                "changes": changes.to_list() if changes is not None else None,
                "untracked": changes.untracked if changes is not None else None,
                "changeset_id": kept.id if kept is not None else None,
                "git": kept.git.to_dict() if kept is not None and kept.git is not None else None,
                "applied": applied.to_dict() if applied is not None else None,
                "exit_status": code,
            }
        )
        return code if emitted else EXIT_SIGPIPE
    with contextlib.suppress(OSError):  # a closed stderr: the review has no reader either
        for denial in (result.network or {}).get("denials", []):
            say(denial["line"].removeprefix("sandbox: "))
        _review(result, changes, applied, args.apply, kept)
    return code


def _review(
    result: executor.ExecResult | launch.Outcome,
    changes: Any,
    applied: Any,
    apply: bool,
    kept: kept_changes.Kept | None = None,
) -> None:
    if result.timed_out:
        say(f"timed out; every process of the call was killed ({result.kill_ms} ms after the deadline)")
    if result.oom_killed:
        say("the memory limit killed a process of the call")
    if result.quarantined:
        from sandbox.gitsweep import summary

        say(summary(result.quarantined).strip("[]"))
    if changes is None:
        return
    if changes.untracked:
        say(f"not tracked (bound read-only from the host, mount.exclude): {', '.join(changes.untracked)}")
    if not changes.changes:
        say("no changes in the private copy")
        return
    say(f"changes in the private copy ({'applied, except as said below' if apply else 'not applied'}):")
    git = kept.git_lines() if kept is not None else []
    for line in git:  # a repository's .git entries: summed up, not listed
        print(f"  {line}", file=sys.stderr)
    for change in changes.changes:
        if git and _in_git(change.path):
            continue
        flags = f"  [{', '.join(change.flags)}]" if change.flags else ""
        skip = f"  (never applied: {change.reason})" if not change.applicable else ""
        line = f"  {change.status[0].upper()} {change.path}{flags}{skip}"
        print(printable(line), file=sys.stderr)  # a name is data: it cannot forge or hide a line
    if applied is not None:
        _applied(applied)
    if kept is not None:
        _kept(kept.id, applied)


def _in_git(path: str) -> bool:
    from sandbox import gitreview

    return gitreview.in_git(path)


def _applied(applied: Any) -> None:
    from sandbox.changes import held_back_line

    for conflict in applied.conflicts:
        say(printable(f"CONFLICT {conflict['path']}: {conflict['reason']}"))
    for held in applied.held_back:
        say(f"held back {held_back_line(held)}: flagged entries need consent")


def _kept(changeset_id: str, applied: Any) -> None:
    done = applied is not None and not (applied.conflicts or applied.held_back)
    review = f"review: sandbox changes show {changeset_id}"
    if done:
        say(f"changes kept as {changeset_id} (applied); {review}")
        return
    say(f"changes kept as {changeset_id}; {review}; apply: sandbox changes apply {changeset_id}")
    if applied is not None and applied.held_back:
        say(f"apply what was held back: sandbox changes apply {changeset_id} --include-flagged (or --only PATH)")
