"""The policy describes what a command does (issue 31, category 12): a path a command writes is a write.

Copying, moving, installing, tee-ing, ``dd of=``, truncating, touching … onto a path outside the
session's writable roots (workspace, scratch, the jail's private /tmp) is judged as a write to an
outside path: confirmed in every permission mode, never covered by an allow-session grant, never run
unasked by the classifier's ``rules`` mode, and never called a read. The operands a command only
reads stay reads. Wrappers (env, command, builtin, exec, nice, timeout, xargs, sudo, find -exec)
are seen through; ``~``, ``$HOME``, ``${HOME}``, ``..`` and ``--target-directory=~/x`` all reach the
same target.
"""

from __future__ import annotations

import shlex
from typing import TYPE_CHECKING

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sandbox.policy import commands
from sandbox.policy.gate import SessionState

if TYPE_CHECKING:
    from sandbox.policy.gate import Decision
    from tests.unit.policy.policy_world import World

MODES = ("ask", "accept-edits", "auto")
CLASSIFIERS = (None, "rules")

# Each writes {target} (a path outside every writable root) and nothing else outside.
WRITERS = (
    "cp notes.txt {target}",
    "cp -r src {target}",
    "cp -t {target} notes.txt",
    "cp --target-directory={target} notes.txt",
    "cp --target-directory {target} notes.txt",
    "mv notes.txt {target}",
    "install -m 0755 notes.txt {target}",
    "install -d {target}",
    "ln -s notes.txt {target}",
    "ln -sf src {target}",
    "rsync -a src/ {target}",
    "echo x | tee {target}",
    "echo x | tee -a {target}",
    "echo x | tee out.txt {target}",
    "dd if=notes.txt of={target}",
    "dd of={target} bs=1k count=1",
    "truncate -s 0 {target}",
    "touch {target}",
    "touch -r notes.txt {target}",
    "mkdir -p {target}",
    "rm -f {target}",
    "chmod 0777 {target}",
    "chmod -R u+x {target}",
    "chown 1000:1000 {target}",
    "sed -i s/a/b/ {target}",
    "sed -i.bak -e s/a/b/ {target}",
    "sort -o {target} notes.txt",
    "sort --output={target} notes.txt",
    "shuf -o {target} notes.txt",
    "uniq notes.txt {target}",
    "split -l 10 notes.txt {target}",
    "patch {target} fix.diff",
    "patch -o {target} notes.txt fix.diff",
    "tar -xf a.tar -C {target}",
    "tar xzf a.tar --directory={target}",
    "tar -czf {target} src",
    "unzip a.zip -d {target}",
    "curl -sSLo {target} https://example.com/x",
    "curl --output {target} https://example.com/x",
    "wget -O {target} https://example.com/x",
    "wget -P {target} https://example.com/x",
    "git -C {target} init",
    "git clone https://example.com/r.git {target}",
    "gzip {target}",
    "mktemp -p {target}",
)
# Outside the workspace, the scratch directory and /tmp; each spelling of one home path.
TARGETS = ("~/.bashrc", "~/bin/tool", "$HOME/.profile", "${HOME}/.profile", "/etc/cron.d/x", "/tmp/../home/x", "../x")
WRAPPERS = ("env", "command", "builtin", "exec", "nice -n 5", "timeout 5", "env FOO=1", "stdbuf -o0")


def _decide(world: World, command: str, mode: str = "ask", classifier: str | None = None) -> Decision:
    table: dict[str, object] | None = {"classifier": classifier} if classifier is not None else None
    gate = world.gate(mode=mode, settings_table=table)
    return gate.evaluate(world.call("Bash", {"command": command}), SessionState("s1"))


def _granted(world: World, command: str, mode: str) -> Decision:
    state = SessionState("s1")
    state.grant_session("Bash")
    return world.gate(mode=mode).evaluate(world.call("Bash", {"command": command}), state)


def _external_write(decision: Decision) -> None:
    assert decision.level != "allow", decision
    assert decision.level == "confirm" and not decision.grantable, decision
    assert decision.rule_id in ("path.external-write", "path.confirm-write"), decision
    assert not decision.reason.startswith("reads"), decision.reason


@pytest.mark.parametrize("writer", WRITERS)
@pytest.mark.parametrize("mode", MODES)
def test_a_write_outside_is_confirmed_in_every_mode(world: World, writer: str, mode: str) -> None:
    decision = _decide(world, writer.format(target="~/bin/tool"), mode)
    _external_write(decision)
    assert decision.rule_id == "path.external-write"


@pytest.mark.parametrize("writer", WRITERS)
def test_the_rules_classifier_never_runs_a_write_outside_unasked(world: World, writer: str) -> None:
    _external_write(_decide(world, writer.format(target="/etc/cron.d/x"), "auto", "rules"))


@pytest.mark.parametrize("writer", WRITERS[:20])
def test_a_session_grant_for_bash_does_not_cover_a_write_outside(world: World, writer: str) -> None:
    _external_write(_granted(world, writer.format(target="~/bin/tool"), "ask"))


@pytest.mark.parametrize("target", TARGETS)
def test_every_spelling_of_an_outside_target_is_one(world: World, target: str) -> None:
    for writer in ("cp notes.txt {target}", "tee {target}", "dd of={target}", "install notes.txt {target}"):
        _external_write(_decide(world, writer.format(target=target), "auto"))


@pytest.mark.parametrize("wrapper", WRAPPERS)
def test_wrappers_are_seen_through(world: World, wrapper: str) -> None:
    for writer in ("cp notes.txt ~/.bashrc", "tee /tmp/../home/x", "dd if=/dev/zero of=~/x count=1"):
        _external_write(_decide(world, f"{wrapper} {writer}", "auto"))


@pytest.mark.parametrize(
    "command",
    [
        "sudo cp notes.txt ~/x",
        "xargs cp -t ~/bin",
        "find . -name '*.sh' -exec cp {} ~/bin \\;",
        "bash -c 'cp notes.txt ~/x'",
        "echo $(tee ~/x < notes.txt)",
    ],
)
def test_commands_behind_escalation_xargs_find_and_shells(world: World, command: str) -> None:
    decision = _decide(world, command, "auto")
    assert decision.level == "confirm" and not decision.grantable, decision
    verdict = commands.judge(command, world.gate().paths, world.gate().rules)
    assert "path.external-write" in {f.rule_id for f in verdict.findings}, verdict.findings


def test_the_reason_says_writes_not_reads(world: World) -> None:
    gate = world.gate()
    for command in ("cp notes.txt ~/x", "tee ~/x", "truncate -s0 ~/x", "mv notes.txt ~/x"):
        verdict = commands.judge(command, gate.paths, gate.rules)
        reasons = [f.reason for f in verdict.findings if str(world.home) in f.reason]
        assert reasons and all("writes" in r and "reads" not in r for r in reasons), (command, reasons)


def test_a_protected_target_keeps_its_stronger_rule(world: World) -> None:
    assert _decide(world, "cp notes.txt ~/.ssh/authorized_keys", "auto").level == "deny"
    assert _decide(world, "dd of=~/.aws/credentials", "auto").level == "deny"
    hook = _decide(world, "cp x.sh .git/hooks/pre-commit", "auto")
    assert (hook.level, hook.rule_id) == ("confirm", "path.confirm-write")
    rc = _decide(world, "python3 tool.py ~/.bashrc", "auto")  # a program that may write its operand
    assert (rc.level, rc.rule_id) == ("confirm", "path.confirm-write")


@pytest.mark.parametrize(
    ("reads", "writes"),
    [
        ("cp ~/notes.txt .", "cp notes.txt ~/"),
        ("cp -r ../app2/src copy", "cp -r src ../app2/copy"),
        ("dd if=/etc/hostname of=out.bin", "dd if=out.bin of=/etc/hostname"),
        ("tar -cf out.tar -C /etc hostname", "tar -cf /etc/out.tar hostname"),
        ("tar -xf ~/a.tar -C vendor", "tar -xf vendor/a.tar -C ~/"),
        ("sort -o sorted.txt /etc/hosts", "sort -o /etc/hosts sorted.txt"),
        ("rsync -a ~/lib/ vendor/", "rsync -a vendor/ ~/lib/"),
        ("sed -n 1p /etc/hosts", "sed -i 1d /etc/hosts"),
    ],
)
def test_what_a_command_reads_stays_a_read_and_what_it_writes_is_a_write(world: World, reads: str, writes: str) -> None:
    for mode in MODES:
        read = _decide(world, reads, mode)
        assert (read.level, read.rule_id) == ("allow" if mode == "auto" else "confirm", "path.external"), read
        assert read.reason.removeprefix("auto mode: ").startswith("reads"), read.reason
        _external_write(_decide(world, writes, mode))


@pytest.mark.parametrize(
    ("inside", "outside"),
    [
        ("cp notes.txt copy.txt", "cp notes.txt ../copy.txt"),
        ("cp notes.txt {tmp}/x", "cp notes.txt /tmp/../x"),
        ("tee {tmp}/log.txt", "tee ~/log.txt"),
        ("mktemp", "mktemp -p ~"),
        ("dd if=/dev/zero of={tmp}/blob count=1", "dd if=/dev/zero of=/etc/blob count=1"),
        ("cp notes.txt {scratch}/x", "cp notes.txt {scratch}/../../../x"),
        ("mv a b", "mv a ~/b"),
        ("tar -xf a.tar", "tar -xf a.tar -C /opt"),
    ],
)
def test_writes_inside_the_writable_roots_follow_the_mode(world: World, inside: str, outside: str) -> None:
    places = {"{scratch}": str(world.scratch), "{tmp}": str(world.root / "tmp")}
    for key, value in places.items():
        inside, outside = inside.replace(key, value), outside.replace(key, value)
    assert _decide(world, inside, "auto").level == "allow"
    assert _decide(world, inside, "ask").level == "confirm"
    assert _granted(world, inside, "ask").level == "allow"
    _external_write(_granted(world, outside, "ask"))
    _external_write(_decide(world, outside, "auto"))


def test_git_with_a_directory_outside_is_not_exempt(world: World) -> None:
    assert _decide(world, "git -C src status", "ask").level == "allow"
    read = _decide(world, "git -C /etc log", "ask")
    assert (read.level, read.rule_id) == ("confirm", "path.external")
    _external_write(_decide(world, "git -C ~/other commit -m x", "auto"))


# -- generated lines --------------------------------------------------------------------------

_NAMES = st.text("abcxyz._-", min_size=1, max_size=8).filter(lambda s: s not in (".", "..") and s[0] != "-")
_OUTSIDE = st.one_of(
    st.builds(lambda n: f"~/{n}", _NAMES),
    st.builds(lambda n: f"$HOME/{n}", _NAMES),
    st.builds(lambda n: f"/tmp/../home/{n}", _NAMES),
    st.builds(lambda d, n: f"/{d}/{n}", st.sampled_from(["etc", "usr/local/bin", "opt", "var/lib", "root"]), _NAMES),
    st.builds(lambda k, n: "../" * k + n, st.integers(3, 6), _NAMES),
)
_LINES = st.one_of(
    st.builds(lambda s, t, f: f"cp {f} {s} {t}", _NAMES, _OUTSIDE, st.sampled_from(["", "-r", "-a", "-f"])),
    st.builds(lambda s, t, f: f"mv {f} {s} {t}", _NAMES, _OUTSIDE, st.sampled_from(["", "-f", "-n"])),
    st.builds(lambda s, t: f"cp -t {t} {s}", _NAMES, _OUTSIDE),
    st.builds(lambda s, t, m: f"install -m {m} {s} {t}", _NAMES, _OUTSIDE, st.sampled_from(["755", "0644"])),
    st.builds(lambda t, f: f"tee {f} {t}", _OUTSIDE, st.sampled_from(["", "-a", "-i", "--append"])),
    st.builds(
        lambda s, t, b: f"dd if={s} of={t} {b}", _NAMES, _OUTSIDE, st.sampled_from(["", "bs=1M", "conv=notrunc"])
    ),
)
_WRAP = st.sampled_from(["", "env ", "command ", "nice ", "timeout 9 ", "exec ", "sudo "])
_QUOTE = st.booleans()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(line=_LINES, wrap=_WRAP, quote=_QUOTE, mode=st.sampled_from(MODES), classifier=st.sampled_from(CLASSIFIERS))
def test_generated_writes_outside_are_never_allowed(
    world: World, line: str, wrap: str, quote: bool, mode: str, classifier: str | None
) -> None:
    if quote:  # quoting changes nothing a shell runs
        line = " ".join(shlex.quote(w) if "$" not in w else w for w in line.split())
    decision = _decide(world, wrap + line, mode, classifier)
    assert decision.level != "allow", (line, decision)
    assert decision.level == "deny" or not decision.grantable, (line, decision)
