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

from sandbox import calls, remedy
from sandbox.backends import landlock_audit
from sandbox.cli import options
from sandbox.cli.output import EXIT_SIGPIPE, emit, guard, say
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
_HELD_LINES = 4  # conflicts and held-back entries a run names; `sandbox changes show` has the rest

# Which flag sets which profile key: errors in a flag's value name the flag, not the file.
_FLAGS = {
    "mount.strategy": "--mount",
    "limits.memory": "--memory",
    "limits.pids": "--pids",
    "network.mode": "--network",
    "network.allow": "--allow-host",
    "network.indexes": "--allow-index",
    "backend": "--backend",
    "docker.image": "--image",
    "mount.download_cache": "--download-cache",
}


def register(sub: Subparsers) -> None:
    run = sub.add_parser("run", help="run a command in a jail", description="Run ARGV in a jail.")
    options.add_profile(run)
    options.add_backend(run)
    options.add_image(run)
    options.add_workspace(run)
    options.add_mount(run)
    run.add_argument(
        "--timeout",
        type=float,
        help="seconds, from 1 to the profile's timeouts.max_s (default: its timeouts.default_s)",
    )
    run.add_argument("--memory", help="memory limit, binary units as Docker reads them: 512m, 2g = 2GiB")
    run.add_argument("--pids", type=int, help="process limit (at least 8)")
    run.add_argument(
        "--download-cache",
        choices=("off", "project"),
        help="project: keep pip's, npm's, uv's, Go's and cargo's downloads across runs of this workspace, in the "
        "data directory (never the host's home), bound into the jail (default: the profile's mount.download_cache)",
    )
    options.add_network(run)
    options.add_json(run, help="one JSON object on stdout at the end")
    run.add_argument(
        "--apply",
        action="store_true",
        help="copy/overlay mount: apply the kept changeset to the workspace, except flagged entries (git hooks, "
        "dotfiles, new executables…), which are held back until `sandbox changes apply ID --include-flagged`",
    )
    run.add_argument(
        "--include-environment",
        action="store_true",
        help="with --apply: apply the environment directories too (the profile's mount.environment: .venv, "
        "node_modules…), which are otherwise held back until `sandbox changes apply ID --only DIR`",
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
        "network.indexes": [*prof.network.indexes, *args.allow_index] if args.allow_index else None,
        "backend": args.backend,
        "docker.image": args.image,
        "mount.download_cache": args.download_cache,
        "bwrap.lifecycle": "call",  # one call: a warm jail would only add its agent's start
    }
    implied = options.network_flag(args) if args.network is None else None  # who asked for the allowlist
    return prof.override(values, {**_FLAGS, "network.mode": implied} if implied else _FLAGS)


def cmd_run(args: argparse.Namespace) -> int:
    argv = options.command(args.argv)
    if not argv:
        raise InvalidArgument("no command given: sandbox run [options] -- ARGV...")
    args.backend = options.image_backend(args)  # before the quick path: --image is Docker's
    quick: launch.Outcome | None = None
    if sys.platform != "win32":  # the quick path is bubblewrap's (and POSIX through and through)
        from sandbox.cli import launch

        quick = launch.run(args, argv)
    if quick is not None:
        with contextlib.suppress(OSError):  # a closed stderr: the review has no reader either
            _review(quick, None, None, apply=False, timeout=getattr(args, "timeout_source", None))
        return _exit_status(quick, quick.received)
    import anyio

    prof = _load_profile(args)
    args.timeout_s = calls.check_timeout(args.timeout, prof)
    args.timeout_source = remedy.for_run(args.timeout, args.timeout_s, prof)
    workspace = args.workspace or Path.cwd()
    return anyio.run(_run, args, prof, workspace, argv)


async def _run(args: argparse.Namespace, prof: profiles.Profile, workspace: Path, argv: list[str]) -> int:
    import anyio

    from sandbox import exec as executor
    from sandbox.backends import base
    from sandbox.cli import stdio

    backend = base.choose(prof.backend, prof, _flags_given(args))
    if (fallback := base.fallback_note(backend, prof)) is not None:
        print(f"sandbox: note: {fallback}", file=sys.stderr)
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
                await _cache_environment(jail, prof, result)
                kept = await _keep(jail, changes, prof)
                env = args.include_environment
                applied = await kept.apply(include_environment=env) if kept is not None and args.apply else None
            tg.cancel_scope.cancel()
    finally:
        out.close()
        err.close()
    if kept is not None and changes is not None:
        changes.changes = kept.changeset.changes  # as kept: an entry that could not be is never applicable
    return _report(args, prof, result, changes, kept, applied, received, backend.probe_for(prof).limits_in_force(prof))


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

    run_id, log = f"run-{uuid.uuid4().hex[:12]}", AuditLog()
    egress.listeners.append(lambda denial: log.record_denial(run_id, "", dataclasses.asdict(denial)))
    if prof.network.ask and sys.stdin.isatty():
        # Only here: the policy package loads the shell parser (0.2 s of a run that asks nobody).
        from sandbox.policy.approvals import ApprovalRequest, TerminalApprover

        terminal = TerminalApprover()
        egress.ask_with(lambda host, port: terminal.prompt(ApprovalRequest.for_connection(run_id, host, port)))


async def _cache_environment(jail: base.Jail, prof: profiles.Profile, result: executor.ExecResult) -> None:
    """A copy run whose command succeeded saves its environment directories for the next copy-in
    (``mount.environment_cache = "project"``, :mod:`sandbox.mounts.envdirs`); a failed one leaves the cache."""
    if jail.tree is None or prof.mount.environment_cache != "project" or prof.mount.strategy != "copy":
        return
    if result.exit_code != 0 or result.timed_out or result.aborted:
        return
    from sandbox.mounts import envdirs
    from sandbox.threads import off_loop

    await off_loop(envdirs.save, jail.workspace, jail.tree.root, prof.mount.environment)


async def _keep(jail: base.Jail, changes: Any, prof: profiles.Profile) -> kept_changes.Kept | None:
    """Keep a non-empty changeset under an id before the jail's close removes its private tree."""
    if jail.tree is None or changes is None or not changes.changes:
        return None
    from sandbox import changes as kept_changes

    limit = prof.limits.kept_changes
    return await kept_changes.keep(
        jail.tree,
        changes,
        source="run",
        profile=prof.name,
        backend=jail.backend,
        limit=limit,
        environment=prof.mount.environment,
        giving_up=True,  # the call is over and its tree killed; the jail's close removes the copy next
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
    hints = _network_hints(prof, result, code)
    if args.json:
        emitted = emit(
            {
                **result.model_dump(exclude={"spawn_ms", "kill_ms", "oom_killed", "peak_memory_bytes"}),
                "profile": prof.name,
                "network": result.network or network_summary(prof.network),
                "limits": prof.limits.in_force(),
                "limits_enforced": enforced,  # how this host enforces each (cgroup per call, rlimit per process)
                "timeout_s": args.timeout_s,
                "timeout_source": args.timeout_source.to_dict(),  # where the limit came from, how to raise it
                "changes": changes.to_list() if changes is not None else None,
                "untracked": changes.untracked if changes is not None else None,
                "changeset_id": kept.id if kept is not None else None,
                "git": kept.git.to_dict() if kept is not None and kept.git is not None else None,
                "applied": applied.to_dict() if applied is not None else None,
                "exit_status": code,
                "hints": hints,
            }
        )
        return code if emitted else EXIT_SIGPIPE
    with contextlib.suppress(OSError):  # a closed stderr: the review has no reader either
        for denial in (result.network or {}).get("denials", []):
            say(denial["line"].removeprefix("sandbox: "))
        for line in landlock_audit.lines(result.kernel_denials, most=50):
            say(line)
        for hint in hints:
            say(hint)
        _review(result, changes, applied, args.apply, kept, prof, timeout=args.timeout_source)
    return code


def _network_hints(prof: profiles.Profile, result: executor.ExecResult, code: int) -> list[str]:
    """The network-off line, for a failed call with no network whose stderr shows a resolver error
    (under ``allowlist`` the proxy's denial line says it already)."""
    if code == 0 or prof.network.mode != "none":
        return []
    from sandbox.network.hint import network_off

    line = network_off(result.stderr, profile=prof.name, needs_other_profile="net-none" in prof.requires)
    return [line] if line else []


def _review(
    result: executor.ExecResult | launch.Outcome,
    changes: Any,
    applied: Any,
    apply: bool,
    kept: kept_changes.Kept | None = None,
    prof: profiles.Profile | None = None,
    *,
    timeout: remedy.TimeoutSource | None = None,
) -> None:
    said = _outcome(result, timeout)
    if changes is None:
        return
    if changes.untracked:
        say(f"not tracked (bound read-only from the host, mount.exclude): {', '.join(changes.untracked)}")
        said += 1
    if not changes.changes:
        say("no changes in the private copy")
        return
    _summary(changes.changes, apply, kept, prof, applied, said)


def _outcome(result: executor.ExecResult | launch.Outcome, timeout: remedy.TimeoutSource | None = None) -> int:
    """The call's end, when it was not its own (a timeout, the memory limit, a quarantine); how many lines."""
    lines = []
    if result.timed_out:
        lines += _timed_out(result, timeout)
    if result.oom_killed:
        lines.append("the memory limit killed a process of the call")
    if result.quarantined:
        from sandbox.gitsweep import summary

        lines.append(summary(result.quarantined).strip("[]"))
    for line in lines:
        say(line)
    return len(lines)


def _timed_out(result: executor.ExecResult | launch.Outcome, timeout: remedy.TimeoutSource | None) -> list[str]:
    """The limit, where it came from (profile key, flag) and how to raise it: a suite killed at 96 % says why."""
    killed = f"every process of the call was killed ({result.kill_ms} ms after the deadline)"
    if timeout is None:
        return [f"timed out; {killed}"]
    return [f"{timeout.line()}; {killed}", timeout.how_to_raise()]


def _flags_given(args: argparse.Namespace) -> dict[str, str]:
    """Which profile key a flag set, as typed: a refusal blames ``--mount overlay``, not the profile."""
    given = {"mount.strategy": args.mount, "limits.memory": args.memory, "limits.pids": args.pids}
    given |= {"network.mode": args.network, "backend": args.backend}
    flags = {key: f"{_FLAGS[key]} {value}" for key, value in given.items() if value is not None}
    implied = options.network_flag(args) if args.network is None else None
    return flags | ({"network.mode": implied} if implied else {})


def _summary(
    entries: list[Any],
    apply: bool,
    kept: kept_changes.Kept | None,
    prof: profiles.Profile | None,
    applied: Any,
    said: int,
) -> None:
    """A total line and a summary of at most ``changesummary.MAX_LINES`` lines with what follows it,
    whatever the size: 14,000 installed files are a few lines, the flagged ones named."""
    from sandbox import changesummary

    changeset_id = kept.id if kept is not None else None
    tail = [*(_applied(applied, changeset_id) if applied is not None else [])]
    tail += _kept(changeset_id, applied) if changeset_id is not None else []
    if kept is not None and kept.pruned:  # the store's cap made room for this one: say what went
        gone = ", ".join(f"{p.id} ({p.why.split(';')[0]})" for p in kept.pruned[:3])
        more = f" and {len(kept.pruned) - 3} more" if len(kept.pruned) > 3 else ""
        tail.append(f"kept changesets pruned to stay under limits.kept_changes: {gone}{more}")
    workspace = kept.workspace if kept is not None else None
    rules = changesummary.Rules.of_profile(prof, workspace) if prof is not None else changesummary.Rules()
    git = kept.git_lines() if kept is not None else []  # a repository's .git entries: summed up, not listed
    state = "applied, except as said below" if apply else "not applied"
    say(f"{changesummary.total_line(entries)} in the private copy ({state}):")
    body = changesummary.summary_lines(
        entries,
        rules,
        git_lines=git,
        git_group={c.path for c in entries if _in_git(c.path)} if git else set(),
        changeset_id=changeset_id,
        budget=changesummary.MAX_LINES - 1 - len(tail) - said,
    )
    for line in body:  # each line printable: a name is data, it cannot forge or hide a line
        print(f"  {line}", file=sys.stderr)
    for line in tail:
        say(line)


def _in_git(path: str) -> bool:
    from sandbox.mounts import gitreview

    return gitreview.in_git(path)


def _applied(applied: Any, changeset_id: str | None) -> list[str]:
    """Conflicts and what was held back, at most ``_HELD_LINES`` lines (the held-back environment
    directories in one): the rest is counted, ``sandbox changes show`` has it all."""
    from sandbox.changes import held_back_line

    lines = [printable(f"CONFLICT {c['path']}: {c['reason']}") for c in applied.conflicts]
    environment = [h["path"] for h in applied.held_back if h.get("group") == "environment"]
    held = sorted(
        (h for h in applied.held_back if h.get("group") != "environment"),
        key=lambda h: set(h["flags"]) <= {"dotfile"},  # hooks, executables, links before dotfiles
    )
    lines += [f"held back {held_back_line(h)}: flagged entries need consent" for h in held]
    if len(lines) > _HELD_LINES:
        more = len(lines) - _HELD_LINES + 1
        lines = [
            *lines[: _HELD_LINES - 1],
            f"and {more:,} more held back or conflicting: sandbox changes show {changeset_id}",
        ]
    if environment:
        names = printable(", ".join(environment))
        lines.append(
            f"held back the environment ({names}): not applied unless asked (--only DIR or --include-environment)"
        )
    return lines


def _kept(changeset_id: str, applied: Any) -> list[str]:
    done = applied is not None and not (applied.conflicts or applied.held_back)
    review = f"review: sandbox changes show {changeset_id}"
    if done:
        return [f"changes kept as {changeset_id} (applied); {review} (for a day, then pruned)"]
    lines = [f"changes kept as {changeset_id}; {review}; apply: sandbox changes apply {changeset_id}"]
    if applied is not None and applied.held_back:
        lines.append(
            f"apply what was held back: sandbox changes apply {changeset_id} --include-flagged (or --only PATH)"
        )
    return lines
