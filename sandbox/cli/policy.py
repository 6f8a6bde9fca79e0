"""``sandbox policy …``, ``sandbox audit …`` and ``sandbox trust …``: judge without running,
manage rules and trust, read the audit log. Bad input prints one line on stderr and exits 2.

``policy test --json`` prints one JSON object on stdout for every outcome: a decision (with
``error_code`` null), a refusal at boundary 1 or 2 (``decision`` "deny", ``error_code``
TOOL_DENIED or INVALID_ARGUMENT, as a session would answer the call) and a test that could not
be made (``decision`` null); refusals and errors still exit 2 with their line on stderr."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, get_args

from sandbox.cli import netpolicy, options
from sandbox.cli.output import EXIT_ERROR, guard, message, say
from sandbox.errors import InvalidArgument, SandboxError, ToolDenied, ToolFailed
from sandbox.vocabulary import CLASSIFIER_MODES, PERMISSION_MODES, RuleAction

if TYPE_CHECKING:
    import argparse

    from pydantic import BaseModel

    from sandbox.cli.options import Subparsers
    from sandbox.cli.output import Handler
    from sandbox.policy.gate import Decision, Gate
    from sandbox.profile import Profile

RULE_ACTIONS: tuple[RuleAction, ...] = get_args(RuleAction)


def _guard(handler: Handler) -> Handler:
    """Every policy, audit and trust command: the error's message alone, exit 2."""
    return guard(handler, EXIT_ERROR, render=message)


def register(subparsers: Subparsers) -> None:
    _register_policy(subparsers)
    _register_audit(subparsers)
    trust = subparsers.add_parser("trust", help="trust a project directory's .sandbox/policy.toml")
    trust.add_argument("directory", nargs="?")
    trust.add_argument("--revoke", action="store_true", help="record the directory as untrusted")
    trust.add_argument("--list", action="store_true", help="list stored trust decisions")
    trust.add_argument(
        "--show",
        action="store_true",
        help="the effective decision for the directory (default: here) and where it comes from",
    )
    options.add_profile(trust)
    options.add_json(trust)
    trust.set_defaults(func=_guard(_trust))


def _register_policy(subparsers: Subparsers) -> None:
    policy = subparsers.add_parser("policy", help="test and manage the permission policy")
    sub = policy.add_subparsers(dest="policy_command", required=True)
    test = sub.add_parser("test", help="print the decision for a command or tool call, without running it")
    options.add_mode(test)
    test.add_argument(
        "--classifier", choices=CLASSIFIER_MODES, default=None, help="evaluate with this classifier mode (seed 004)"
    )
    options.add_operating_mode(test, help="evaluate in this operating mode (default agent)")
    options.add_workspace(test, default=Path.cwd())
    options.add_profile(test)  # its policy table, its timeouts.max_s and its PATH: as a session would judge
    test.add_argument("--tool", help="a tool name (default Bash)")
    test.add_argument("--args", dest="tool_args", help="the tool's arguments as a JSON object")
    options.add_json(test)
    trust = test.add_mutually_exclusive_group()
    trust.add_argument("--trust-project", dest="trust_override", action="store_const", const=True)
    trust.add_argument("--no-trust-project", dest="trust_override", action="store_const", const=False)
    options.add_argv(test, dest="command", help='-- "<bash command>"')
    test.set_defaults(func=_guard(_test_outcome))
    for action in RULE_ACTIONS:
        rule = sub.add_parser(action, help=f"add a user {action} rule (substring / command pattern)")
        rule.add_argument("text")
        rule.add_argument("--tool", default="Bash")
        rule.set_defaults(func=_guard(_add_rule), action=action)
    remove = sub.add_parser("remove", help="delete a user rule or disable a built-in rule by id")
    remove.add_argument("rule_id")
    remove.set_defaults(func=_guard(_remove_rule))
    restore = sub.add_parser("restore", help="re-enable a disabled built-in rule")
    restore.add_argument("rule_id")
    restore.set_defaults(func=_guard(_restore_rule))
    mode = sub.add_parser(
        "mode",
        help="show or set the global default permission mode (ask, accept-edits, auto); "
        "off and rules set the classifier mode, as `policy classifier` does",
    )
    mode.add_argument("mode", nargs="?", choices=(*PERMISSION_MODES, "off", "rules", "unset"))
    mode.set_defaults(func=_guard(_mode))
    classifier = sub.add_parser(
        "classifier", help="show or set the global classifier mode (seed 004's mode: off, rules, auto)"
    )
    classifier.add_argument("mode", nargs="?", choices=(*CLASSIFIER_MODES, "unset"))
    classifier.set_defaults(func=_guard(_classifier))
    export = sub.add_parser(
        "export", help="copy the policy (rules, disabled built-ins) to DIR, without settings or logs"
    )
    export.add_argument("directory", type=Path)
    export.set_defaults(func=_guard(_export_policy))
    where = sub.add_parser("where", help="print where each policy, trust and audit file lives")
    options.add_workspace(where, default=Path.cwd())
    options.add_json(where)
    where.set_defaults(func=_guard(_where))
    listing = sub.add_parser("list", help="list built-in and user rules")
    options.add_json(listing)
    listing.set_defaults(func=_guard(_list_rules))
    show = sub.add_parser(
        "show",
        help="what a session of the profile in the workspace would enforce: the modes, the protected "
        "paths, the trusted paths, domains and git remotes, the network's hosts, and the project's trust",
    )
    options.add_workspace(show, default=Path.cwd())
    options.add_profile(show)
    options.add_json(show)
    show.set_defaults(func=_guard(_show))
    netpolicy.register(sub, _guard)


def _register_audit(subparsers: Subparsers) -> None:
    audit = subparsers.add_parser("audit", help="read the audit log")
    sub = audit.add_subparsers(dest="audit_command", required=True)
    stats = sub.add_parser("stats", help="decisions by outcome, tool and rule")
    options.add_json(stats)
    stats.set_defaults(func=_guard(_stats))
    export = sub.add_parser("export", help="export every record")
    export.add_argument("--jsonl", action="store_true", required=True)
    export.add_argument("--output", type=Path)
    export.set_defaults(func=_guard(_export))
    network = sub.add_parser("network", help="the connections an allowlist refused (host, port, rule, reason)")
    network.add_argument("--session", help="only this session's")
    options.add_json(network)
    network.set_defaults(func=_guard(_network))


class _Refused(Exception):
    """The call itself is refused before the policy sees it (boundaries 1 and 2)."""

    def __init__(self, error: SandboxError, rule_id: str) -> None:
        super().__init__(error.message)
        self.error = error
        self.rule_id = rule_id


def _test_outcome(args: argparse.Namespace) -> int:
    """``_test``, and the JSON a ``--json`` reader is owed when it gives no decision."""
    try:
        return _test(args)
    except _Refused as refused:
        _json_refusal(args, "deny", refused.error, refused.rule_id)
        raise refused.error from None
    except SandboxError as exc:
        _json_refusal(args, None, exc, None)
        raise


def _json_refusal(args: argparse.Namespace, decision: str | None, error: SandboxError, rule_id: str | None) -> None:
    if args.json:
        print_refusal(decision, error, rule_id, tool=args.tool or "Bash")


def print_refusal(
    decision: str | None, error: SandboxError, rule_id: str | None = None, tool: str | None = None
) -> None:
    """The one JSON object of ``policy test --json`` for an outcome that is not a policy decision."""
    print(
        json.dumps(
            {
                "decision": decision,
                "error_code": error.code,
                "reason": error.message,
                "rule_id": rule_id,
                "tool": tool,
                "details": error.data,
            },
            indent=2,
            default=str,
        )
    )


def _arguments(args: argparse.Namespace, tool: str, command: str) -> dict[str, Any]:
    if tool == "Bash" and args.tool_args is None:
        if not command:
            raise InvalidArgument('nothing to test: give -- "<bash command>" or --tool NAME --args JSON')
        return {"command": command}
    if command or args.tool_args is None:
        raise InvalidArgument("--tool needs --args JSON and no command")
    try:
        raw = json.loads(args.tool_args)
    except ValueError as exc:
        raise _Refused(InvalidArgument(f"--args is not valid JSON: {exc}", tool=tool), "capability.params") from exc
    if not isinstance(raw, dict):
        raise _Refused(InvalidArgument("--args must be a JSON object", tool=tool), "capability.params")
    return raw


def _test(args: argparse.Namespace) -> int:
    from sandbox import profile
    from sandbox.tools.params import validate

    command = " ".join(options.command(args.command)).strip()
    tool = args.tool or "Bash"
    raw = _arguments(args, tool, command)
    if not args.workspace.is_dir():
        raise InvalidArgument(f"workspace {args.workspace} is not a directory")
    prof = profile.load(args.profile)  # the session's: ``default`` unless --profile names another
    try:
        params = validate(tool, raw, max_timeout_s=prof.timeouts.max_s)
    except ToolDenied as exc:
        raise _Refused(exc, "capability.unknown-tool") from exc
    except InvalidArgument as exc:
        raise _Refused(exc, "capability.params") from exc
    decision = _evaluate(args, tool, params, prof)
    _print_decision(decision, args.json)
    return 0


def _evaluate(args: argparse.Namespace, tool: str, params: BaseModel, prof: Profile) -> Decision:
    from sandbox.policy.gate import SessionState, ToolCall

    # The profile's [policy] table, with what the flags say instead.
    flags = {"mode": args.mode, "operating_mode": args.operating_mode or "agent", "classifier": args.classifier}
    gate = _gate(args.workspace, prof, flags, args.trust_override)
    call = ToolCall("policy-test", "turn-1", "call-1", tool, params)
    return gate.evaluate(call, SessionState("policy-test"))


def _gate(workspace: Path, prof: Profile, flags: dict[str, Any], trust_override: bool | None) -> Gate:
    """The gate a session of ``prof`` in ``workspace`` would have (its notices said on stderr)."""
    from sandbox import datadir
    from sandbox.policy import load_ruleset
    from sandbox.policy.gate import Gate
    from sandbox.policy.rules import RuleStore

    settings = prof.policy.model_copy(update={k: v for k, v in flags.items() if v is not None})
    rules = load_ruleset(settings, workspace, trust_override=trust_override)
    for notice in rules.notices:
        say(notice)
    scratch = datadir.data_dir() / "scratch" / "policy-test"
    programs = prof.env.workspace_path  # what the jail's PATH finds first
    return Gate(workspace, scratch, settings, rules, global_mode=RuleStore().mode(), programs=programs)


def _show(args: argparse.Namespace) -> int:
    """``sandbox policy show``: what is enforced, read from the gate a session would build."""
    from sandbox import profile
    from sandbox.network.egress import for_profile
    from sandbox.network.userlist import UserNetwork
    from sandbox.policy.gate import SessionState
    from sandbox.policy.trust import PROJECT_POLICY, TrustStore

    if not args.workspace.is_dir():
        raise InvalidArgument(f"workspace {args.workspace} is not a directory")
    prof = profile.load(args.profile)
    gate = _gate(args.workspace, prof, {}, None)
    settings, paths = gate.settings, gate.paths
    default_trust = settings.default_project_trust
    trust = TrustStore().decision(args.workspace, default=default_trust == "always")
    enforced = for_profile(prof)
    shown = {
        "profile": prof.name,
        "workspace": paths.workspace,
        "mode": gate.mode_for(SessionState("policy-show")),
        "operating_mode": settings.operating_mode,
        "classifier": gate.classifier_mode(),
        "protected": {
            "deny_read": list(paths.deny_read.patterns),
            "deny_write": list(paths.deny_write.patterns),
            "confirm_write": list(paths.confirm_write.patterns),
        },
        "trusted": {
            "paths": list(settings.trusted.paths),
            "domains": list(settings.trusted.domains),
            "git_remotes": list(settings.trusted.git_remotes),
        },
        "network": {
            "mode": prof.network.mode,
            "allow": list(enforced.allow),  # what the proxy enforces: with the trusted domains, the
            "deny": list(enforced.deny),  # secrets' and rules' hosts and your own network list
            "indexes": [str(index) for index in prof.network.indexes],  # package indexes the proxy admits
            "ask": prof.network.ask,
            # The hosts whose TLS the proxy terminates: the secrets (never a value) and the request rules.
            "secrets": {name: {"hosts": list(s.hosts), "as": s.as_} for name, s in prof.secrets.items()},
            "requests": [rule.model_dump() for rule in prof.network.requests],
            "user_list": {k: list(v) for k, v in UserNetwork().load().items()},  # sandbox policy network
        },
        "project": {
            "policy_file": str(Path(paths.workspace) / PROJECT_POLICY),
            "exists": (Path(paths.workspace) / PROJECT_POLICY).is_file(),
            **trust.explain(default_trust),
        },
    }
    if args.json:
        print(json.dumps(shown, indent=2))
        return 0
    print(f"profile {shown['profile']} in {shown['workspace']}")
    print(f"  modes: {shown['mode']}, {shown['operating_mode']}; classifier {shown['classifier']}")
    for title, table in (("protected", shown["protected"]), ("trusted", shown["trusted"])):
        for key, values in table.items():
            print(f"  {title} {key.replace('_', ' ')}: {', '.join(values) or '-'}")
    network = shown["network"]
    listed = {key: ", ".join(network[key]) or "-" for key in ("allow", "deny", "indexes")}
    print(f"  network: {network['mode']}; allow {listed['allow']}; deny {listed['deny']}; indexes {listed['indexes']}")
    for name, secret in network["secrets"].items():
        print(f"  secret {name}: {secret['as']} to {', '.join(secret['hosts'])} (the jail holds a placeholder)")
    for rule in network["requests"]:
        print(f"  requests to {', '.join(rule['hosts'])}: {_rule_line(rule)}")
    user = network["user_list"]
    if user["allow"] or user["deny"]:
        print(f"  your network list: allow {', '.join(user['allow']) or '-'}; deny {', '.join(user['deny']) or '-'}")
    project = shown["project"]
    present = "present" if project["exists"] else "absent"
    print(f"  project policy file ({present}): {project['trusted_word']}, {project['why']}")
    return 0


def _rule_line(rule: dict[str, Any]) -> str:
    parts = [*rule["allow"], *([f"preset {rule['preset']}"] if rule["preset"] else [])]
    if rule["git_fetch"] or rule["git_push"]:
        parts.append("git fetch")
    if rule["git_push"]:
        refs = f" (refs {', '.join(rule['git_refs'])})" if rule["git_refs"] else ""
        parts.append(f"git push to {', '.join(rule['git_push'])}{refs}")
    return "; ".join(parts) or "nothing"


def _print_decision(decision: Decision, as_json: bool) -> None:
    if as_json:
        print(
            json.dumps(
                {
                    "decision": decision.level,
                    "error_code": None,
                    "reason": decision.reason,
                    "rule_id": decision.rule_id,
                    "resource": decision.resource,
                    "root": decision.root,
                    "external": decision.external,
                    "mode": decision.mode,
                    "tool": decision.tool,
                    "decided_by": decision.decided_by,
                    "classify": decision.classify,
                    "hints": list(decision.hints),
                },
                indent=2,
            )
        )
        return
    level = "classify (the model judges; asked if it blocks)" if decision.classify else decision.level
    print(
        f"{level}: {decision.reason}\n  rule: {decision.rule_id}  mode: {decision.mode}  resource: {decision.resource}"
    )
    for hint in decision.hints:
        print(f"  hint: {hint}")


def _add_rule(args: argparse.Namespace) -> int:
    from sandbox.policy.rules import RuleStore

    rule = RuleStore().add(args.action, args.text, args.tool)
    print(f"added {args.action} rule {rule.id}: {rule.text!r}")
    return 0


def _mode(args: argparse.Namespace) -> int:
    """Permission modes as before; seed 004's ``off`` and ``rules`` set the classifier mode. Its
    ``auto`` is ambiguous here: it stays the permission mode (which allows what no rule decides),
    and the command says so and names ``policy classifier auto``, the seed's rules-and-model mode."""
    from sandbox.policy.rules import RuleStore

    store = RuleStore()
    if args.mode in ("off", "rules"):
        return _classifier(args)
    if args.mode is not None:
        store.set_mode(None if args.mode == "unset" else args.mode)
    current = store.mode()
    print(f"global default mode: {current or 'ask (not set)'}; a session's own mode and a profile's take precedence")
    if args.mode == "auto":
        say(
            "note: this is the permission mode auto: what no rule decides runs without asking. "
            "For seed 004's auto (rules, then a model judges what they leave open; a block is asked) "
            "run: sandbox policy classifier auto"
        )
    print(f"classifier mode: {store.classifier() or 'off (not set)'}")
    return 0


def _classifier(args: argparse.Namespace) -> int:
    from sandbox.policy.rules import RuleStore

    store = RuleStore()
    if args.mode is not None:
        store.set_classifier(None if args.mode == "unset" else args.mode)
    current = store.classifier()
    meaning = {
        "off": "the permission mode decides what the rules leave open",
        "rules": "rules only: what no rule decides runs",
        "auto": "a model judges what the rules leave open (policy.classifier_endpoint, or the client's model)",
    }[current or "off"]
    print(f"classifier mode: {current or 'off (not set)'}: {meaning}; a profile's policy.classifier takes precedence")
    return 0


def _export_policy(args: argparse.Namespace) -> int:
    """Seed 004's ``export``: the rules alone (user rules, disabled built-ins, the built-in table),
    never the settings (global modes, trust decisions) nor the audit log."""
    from sandbox.datadir import atomic_write
    from sandbox.policy.rules import BUILTIN_RULES, RuleStore

    rules = RuleStore().ruleset()
    target: Path = args.directory
    if target.exists() and not target.is_dir():
        raise InvalidArgument(f"{target} exists and is not a directory")
    user = [r.model_dump(exclude_defaults=True) | {"id": r.id} for r in rules.user]
    policy = {"rules": user, "removed": sorted(rules.removed)}
    builtin = [{"id": r.id, "layer": r.layer, "description": r.description} for r in BUILTIN_RULES]
    try:
        atomic_write(target / "rules.json", json.dumps(policy, indent=2, sort_keys=True) + "\n")
        atomic_write(target / "builtin-rules.json", json.dumps(builtin, indent=2) + "\n")
    except OSError as exc:
        raise ToolFailed(f"cannot write {target}: {exc.strerror or exc}") from exc
    print(f"exported {len(user)} user rule(s) and {len(rules.removed)} disabled built-in(s) to {target}")
    return 0


def _where(args: argparse.Namespace) -> int:
    """Seed 004's ``/safety config``: where each file lives."""
    from sandbox import datadir, profile
    from sandbox.network.userlist import UserNetwork
    from sandbox.policy.rules import RuleStore
    from sandbox.policy.trust import PROJECT_POLICY, TrustStore

    files = {
        "data_dir": str(datadir.data_dir()),
        "rules": str(RuleStore().path),
        "trust": str(TrustStore().path),
        "network": str(UserNetwork().path),
        "audit": str(datadir.data_dir() / "audit" / "audit.sqlite3"),
        "project_policy": str(args.workspace.resolve() / PROJECT_POLICY),
        "profiles": str(next(iter(profile.available().values())).parent),
    }
    if args.json:
        print(json.dumps(files, indent=2))
        return 0
    for name, path in files.items():
        print(f"{name:15} {path}")
    return 0


def _remove_rule(args: argparse.Namespace) -> int:
    from sandbox.policy.rules import RuleStore

    print(RuleStore().remove(args.rule_id))
    return 0


def _restore_rule(args: argparse.Namespace) -> int:
    from sandbox.policy.rules import RuleStore

    print(RuleStore().restore(args.rule_id))
    return 0


def _list_rules(args: argparse.Namespace) -> int:
    from sandbox.policy.rules import BUILTIN_RULES, RuleStore

    rules = RuleStore().ruleset()
    builtin = [
        {"id": r.id, "layer": r.layer, "enabled": rules.enabled(r.id), "description": r.description}
        for r in BUILTIN_RULES
    ]
    user = [r.model_dump(exclude_defaults=True) | {"id": r.id} for r in rules.user]
    if args.json:
        print(json.dumps({"builtin": builtin, "user": user}, indent=2))
        return 0
    for item in builtin:
        state = "on " if item["enabled"] else "off"
        print(f"{state} {item['id']:22} {item['layer']:6} {item['description']}")
    for rule in user:
        print(f"on  {rule['id']:22} {rule['action']:6} {rule.get('text') or rule.get('command') or rule.get('path')}")
    return 0


def _stats(args: argparse.Namespace) -> int:
    from sandbox.audit import AuditLog

    stats = AuditLog().stats()
    if args.json:
        print(json.dumps(stats, indent=2))
        return 0
    print(f"{stats['total']} calls, {stats['prompted']} prompted (mean wait {stats['mean_permission_wait_ms']} ms)")
    for title in ("by_layer", "by_decision", "by_decided_by", "by_tool", "top_denying_rules"):
        pairs = ", ".join(f"{k}={v}" for k, v in stats[title].items()) or "-"
        print(f"  {title.replace('_', ' ')}: {pairs}")
    judged = stats["classifier"]
    verdicts = ", ".join(f"{k}={v}" for k, v in judged["by_verdict"].items()) or "-"
    after = ", ".join(f"{k}={v}" for k, v in judged["after_block"].items()) or "-"
    print(f"  classifier: {verdicts} (mean {judged['mean_latency_ms']} ms); after a block: {after}")
    return 0


def _network(args: argparse.Namespace) -> int:
    from sandbox.audit import AuditLog

    rows = AuditLog().denials(args.session)
    if args.json:
        print(json.dumps({"denials": rows}, indent=2))
        return 0
    for row in rows:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(row["ts"]))
        rule = f" rule {row['rule']}" if row["rule"] else ""
        request = f"{row['method']} {row['path']}  " if row.get("method") else ""
        where = f"{row['host']}:{row['port']}"
        print(f"{when}  {row['session_id']}  {request}{where}  {row['reason']}{rule}: {row['message']}")
    return 0


def _export(args: argparse.Namespace) -> int:
    from sandbox.audit import AuditLog

    log = AuditLog()
    if args.output is None:
        log.export_jsonl(sys.stdout)
        return 0
    try:
        with args.output.open("w", encoding="utf-8") as handle:
            count = log.export_jsonl(handle)
    except OSError as exc:
        raise ToolFailed(f"cannot write {args.output}: {exc.strerror}") from exc
    print(f"exported {count} records to {args.output}", file=sys.stderr)
    return 0


def _trust(args: argparse.Namespace) -> int:
    from sandbox.policy.trust import TrustStore

    store = TrustStore()
    if args.list:
        for path, trusted in store.entries().items():
            print(f"{'trusted  ' if trusted else 'untrusted'} {path}")
        return 0
    if args.show:
        from sandbox import profile

        default = profile.load(args.profile).policy.default_project_trust
        found = store.decision(args.directory or Path.cwd(), default=default == "always").explain(default)
        if args.json:
            print(json.dumps(found, indent=2))
        else:
            print(f"{found['trusted_word']}: {found['directory']} ({found['why']})")
        return 0
    if not args.directory:
        raise InvalidArgument("give a directory, or --list")
    path = store.set(args.directory, not args.revoke)
    print(f"{'untrusted' if args.revoke else 'trusted'}: {path}")
    return 0
