"""Request rules: method/path rules, ambiguous paths, git smart-HTTP fetch and push, a push's ref commands."""

from __future__ import annotations

import os
import shutil
import subprocess
from typing import TYPE_CHECKING, Any

import pytest

from sandbox.network.reqrules import (
    COMMAND_SECTION_LIMIT,
    READ_ONLY_METHODS,
    RefCommand,
    RequestRules,
    read_ref_commands,
)

if TYPE_CHECKING:
    from pathlib import Path

EXAMPLE = ("GET,HEAD /repos/org/*", "POST /repos/org/repo/git/*", "* /status")
OLD = "1" * 40
NEW = "2" * 40
ZERO = "0" * 40


def rules(*allow: str) -> RequestRules:
    return RequestRules.parse(allow)


def pkt(payload: bytes) -> bytes:
    return b"%04x" % (len(payload) + 4) + payload


# -- method/path rules --------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("method", "target", "rule"),
    [
        ("GET", "/repos/org/repo/pulls/1", "GET,HEAD /repos/org/*"),
        ("HEAD", "/repos/org/repo", "GET,HEAD /repos/org/*"),
        ("GET", "/repos/org/", "GET,HEAD /repos/org/*"),
        ("POST", "/repos/org/repo/git/refs", "POST /repos/org/repo/git/*"),
        ("DELETE", "/status", "* /status"),
        ("BREW", "/status", "* /status"),
    ],
)
def test_the_example_rules_allow_what_they_name(method: str, target: str, rule: str) -> None:
    verdict = rules(*EXAMPLE).judge(method, target)
    assert verdict.allowed and verdict.rule == rule, verdict


@pytest.mark.parametrize(
    ("method", "target"),
    [
        ("POST", "/repos/org/x/issues"),
        ("PUT", "/repos/org/repo/pulls/1"),
        ("GET", "/repos/other/x"),
        ("GET", "/repos/org"),
        ("GET", "/status/x"),
        ("POST", "/repos/org/repo/pulls"),
        ("GET", "/Repos/org/x"),
    ],
)
def test_the_example_rules_refuse_what_they_do_not_name(method: str, target: str) -> None:
    verdict = rules(*EXAMPLE).judge(method, target)
    assert not verdict.allowed and verdict.rule is None, verdict
    assert "no request rule allows it" in verdict.message


def test_a_refusal_names_the_request_and_every_rule() -> None:
    verdict = rules(*EXAMPLE).judge("POST", "/repos/org/x/issues?state=open")
    assert verdict.message == (
        "POST /repos/org/x/issues: no request rule allows it "
        "(rules: GET,HEAD /repos/org/*; POST /repos/org/repo/git/*; * /status)"
    )


def test_no_rules_allow_nothing() -> None:
    verdict = RequestRules.parse().judge("GET", "/")
    assert not verdict.allowed and "no request rule allows it (rules: none)" in verdict.message


def test_methods_are_upper_cased_on_parse_and_on_judging() -> None:
    assert rules("get, head /x").judge("HEAD", "/x").allowed
    assert rules("GET /x").judge("get", "/x").allowed
    assert not rules("GET /x").judge("POST", "/x").allowed


def test_the_query_takes_no_part_in_matching() -> None:
    assert rules("GET /search").judge("GET", "/search?q=a/b&x=..").rule == "GET /search"
    assert not rules("GET /search").judge("GET", "/other?/search").allowed


def test_the_read_only_preset_allows_reads_anywhere() -> None:
    preset = RequestRules.parse(preset="read-only")
    for method in READ_ONLY_METHODS:
        verdict = preset.judge(method, "/anything/at/all?x=1")
        assert verdict.allowed and verdict.rule == "preset read-only", verdict
    assert not preset.judge("POST", "/anything").allowed
    assert "preset read-only" in preset.judge("DELETE", "/x").message


# -- ambiguous paths ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "target",
    [
        "/repos/org/../admin",
        "/repos/org/..",
        "/repos/./org/x",
        "/repos/org/..;x/admin",
        "/repos//org/x",
        "/repos/org\\x",
        "/repos/org%2Fx",
        "/repos/org%2fx",
        "/repos/org%5Cx",
        "/repos/org/%2E%2E/admin",
        "/repos/org/%2e",
        "/repos/org/%252F",
        "/repos/org/x%00",
        "/repos/org/x%0a",
        "/repos/org/x\x00",
        "/repos/org/x\r\nHost: evil",
        "/repos/org/x y",
        "/repos/org/\u00e9",
        "/repos/org/x%",
        "/repos/org/x%4",
        "/repos/org/x%zz",
        "/repos/org/x#frag",
        "repos/org/x",
        "*",
        "http://api.github.com/repos/org/x",
        "",
    ],
)
def test_an_ambiguous_path_is_refused_before_any_rule(target: str) -> None:
    verdict = RequestRules.parse(["* /*"], preset="read-only", git_fetch=True).judge("GET", target)
    assert not verdict.allowed and verdict.rule is None, verdict
    assert "the path is ambiguous" in verdict.message
    assert all(" " <= char <= "~" for char in verdict.message), verdict.message


def test_escapes_of_unreserved_characters_are_decoded_before_matching() -> None:
    assert rules("GET /repos/org/*").judge("GET", "/repos/%6Frg/x").allowed
    assert rules("GET /repos/org/*").judge("GET", "/repos/%6frg/x").allowed
    assert rules("GET /a-b_c~d").judge("GET", "/a%2Db%5Fc%7Ed").allowed
    assert rules("GET /repos/%6Frg/x").judge("GET", "/repos/org/x").allowed


def test_other_escapes_stay_encoded_and_compare_regardless_of_hex_case() -> None:
    assert rules("GET /files/a%3ab").judge("GET", "/files/a%3Ab").allowed
    assert rules("GET /files/*").judge("GET", "/files/my%20file").allowed
    assert not rules("GET /files/a:b").judge("GET", "/files/a%3Ab").allowed


@pytest.mark.parametrize(
    ("allow", "complaint"),
    [
        ("GET", "expected 'METHODS PATH'"),
        ("/x", "expected 'METHODS PATH'"),
        ("GET x", "not origin form"),
        ("GET,* /x", "'*' alone"),
        ("G@T /x", "HTTP method names"),
        ("GET,,HEAD /x", "HTTP method names"),
        ("GET /a/../b", "ambiguous"),
        ("GET /a//b", "ambiguous"),
        ("GET /a%2Fb", "ambiguous"),
        ("GET /x?y=1", "query"),
    ],
)
def test_a_bad_rule_is_a_value_error_naming_it(allow: str, complaint: str) -> None:
    with pytest.raises(ValueError, match="request rule") as caught:
        rules(allow)
    assert complaint in str(caught.value) and repr(allow) in str(caught.value)


@pytest.mark.parametrize(
    ("options", "complaint"),
    [
        ({"preset": "write"}, "unknown"),
        ({"git_push": ["org/../x"]}, "git_push pattern"),
        ({"git_push": ["/"]}, "names no repository"),
        ({"git_push": ["org/a b"]}, "git_push pattern"),
        ({"git_refs": ["heads/agent/*"]}, "full ref name"),
        ({"git_refs": ["refs/heads/a b"]}, "full ref name"),
    ],
)
def test_bad_presets_and_git_patterns_are_value_errors(options: dict[str, Any], complaint: str) -> None:
    with pytest.raises(ValueError, match=complaint):
        RequestRules.parse(**options)


# -- git smart HTTP -------------------------------------------------------------------------------
FETCHES = [
    ("GET", "/org/repo.git/info/refs?service=git-upload-pack"),
    ("GET", "/org/repo/info/refs?service=git-upload-pack"),
    ("POST", "/org/repo.git/git-upload-pack"),
    ("POST", "/org/repo/git-upload-pack"),
]
PUSHES = [
    ("GET", "/org/repo.git/info/refs?service=git-receive-pack"),
    ("GET", "/org/repo/info/refs?service=git-receive-pack"),
    ("POST", "/org/repo.git/git-receive-pack"),
    ("POST", "/org/repo/git-receive-pack"),
]


@pytest.mark.parametrize(("method", "target"), FETCHES)
def test_git_fetch_allows_a_smart_http_fetch_with_or_without_dot_git(method: str, target: str) -> None:
    verdict = RequestRules.parse(git_fetch=True).judge(method, target)
    assert verdict.allowed and verdict.rule == "git fetch", verdict
    assert not RequestRules.parse().judge(method, target).allowed


@pytest.mark.parametrize(("method", "target"), PUSHES)
def test_git_fetch_alone_refuses_a_push(method: str, target: str) -> None:
    verdict = RequestRules.parse(git_fetch=True).judge(method, target)
    assert not verdict.allowed and "a git push to org/repo: no request rule allows it" in verdict.message


@pytest.mark.parametrize(
    "target",
    [
        "/org/repo/info/refs",
        "/org/repo/info/refs?service=git-upload-pack&service=git-receive-pack",
        "/org/repo/info/refs/x?service=git-upload-pack",
        "/org/repo/objects/info/packs",
    ],
)
def test_git_fetch_is_smart_http_only(target: str) -> None:
    assert not RequestRules.parse(git_fetch=True).judge("GET", target).allowed


def test_git_fetch_needs_the_methods_git_uses() -> None:
    fetch = RequestRules.parse(git_fetch=True)
    assert not fetch.judge("GET", "/org/repo/git-upload-pack").allowed
    assert not fetch.judge("POST", "/org/repo/info/refs?service=git-upload-pack").allowed


@pytest.mark.parametrize(("method", "target"), PUSHES + FETCHES)
def test_git_push_allows_pushing_to_the_named_repository_and_fetching(method: str, target: str) -> None:
    verdict = RequestRules.parse(git_push=["org/repo"]).judge(method, target)
    assert verdict.allowed and verdict.rule in ("git push org/repo", "git fetch"), verdict


def test_git_push_globs_match_repositories_and_drop_dot_git() -> None:
    push = RequestRules.parse(git_push=["org/repo.git", "org/tools-*"])
    assert push.judge("POST", "/org/repo/git-receive-pack").rule == "git push org/repo.git"
    assert push.judge("POST", "/org/tools-lint.git/git-receive-pack").rule == "git push org/tools-*"
    assert push.judge("GET", "/org/tools-/info/refs?service=git-receive-pack").allowed
    assert RequestRules.parse(git_push=["/org/*/"]).judge("POST", "/org/a/b/git-receive-pack").allowed


def test_a_push_to_an_unnamed_repository_is_refused() -> None:
    verdict = RequestRules.parse(git_push=["org/repo", "org/tools-*"]).judge("POST", "/org/other.git/git-receive-pack")
    assert not verdict.allowed and verdict.rule is None
    assert verdict.message == (
        "POST /org/other.git/git-receive-pack: a git push to org/other, which git_push does not name "
        "(org/repo, org/tools-*)"
    )
    assert not RequestRules.parse(git_push=["org/repo"]).judge("POST", "/org/repo2/git-receive-pack").allowed
    assert not RequestRules.parse(git_push=["org/repo"]).judge("POST", "/Org/repo/git-receive-pack").allowed


def test_a_push_path_is_checked_for_ambiguity_first() -> None:
    verdict = RequestRules.parse(git_push=["org/repo"]).judge("POST", "/org/x/../repo/git-receive-pack")
    assert not verdict.allowed and "ambiguous" in verdict.message


def test_push_repository_names_the_repository_only_when_refs_are_checked() -> None:
    checked = RequestRules.parse(git_push=["org/*"], git_refs=["refs/heads/agent/*"])
    assert checked.checks_refs
    assert checked.push_repository("POST", "/org/repo.git/git-receive-pack") == "org/repo"
    assert checked.push_repository("POST", "/other/repo.git/git-receive-pack") is None
    assert checked.push_repository("GET", "/org/repo/info/refs?service=git-receive-pack") is None
    assert checked.push_repository("POST", "/org/repo/git-upload-pack") is None
    unchecked = RequestRules.parse(git_push=["org/*"])
    assert not unchecked.checks_refs
    assert unchecked.push_repository("POST", "/org/repo.git/git-receive-pack") is None


def test_git_refs_also_bind_a_push_that_an_allow_rule_lets_through() -> None:
    broad = RequestRules.parse(allow=["POST /org/*"], git_refs=["refs/heads/agent/*"])
    assert broad.push_repository("POST", "/org/repo/git-receive-pack") == "org/repo"


def test_judge_push_allows_the_named_refs() -> None:
    push = RequestRules.parse(git_push=["org/repo"], git_refs=["refs/heads/agent/*", "refs/tags/v*"])
    commands = [
        RefCommand(ZERO, NEW, "refs/heads/agent/new"),
        RefCommand(OLD, NEW, "refs/heads/agent/a/b"),
        RefCommand(ZERO, NEW, "refs/tags/v1"),
    ]
    verdict = push.judge_push("org/repo", commands)
    assert verdict.allowed and verdict.rule == "git refs refs/heads/agent/*, refs/tags/v*", verdict


@pytest.mark.parametrize(
    ("command", "action"),
    [
        (RefCommand(OLD, NEW, "refs/heads/main"), "update"),
        (RefCommand(ZERO, NEW, "refs/heads/main"), "create"),
        (RefCommand(OLD, ZERO, "refs/heads/main"), "delete"),
    ],
)
def test_judge_push_refuses_a_ref_not_named(command: RefCommand, action: str) -> None:
    push = RequestRules.parse(git_push=["org/repo"], git_refs=["refs/heads/agent/*"])
    verdict = push.judge_push("org/repo", [RefCommand(ZERO, NEW, "refs/heads/agent/x"), command])
    assert not verdict.allowed and verdict.rule is None
    assert verdict.message == (
        f"a push to org/repo: the {action} of refs/heads/main is refused; git_refs allows only refs/heads/agent/*"
    )


def test_a_deletion_of_a_named_ref_is_allowed() -> None:
    push = RequestRules.parse(git_push=["org/repo"], git_refs=["refs/heads/agent/*"])
    assert push.judge_push("org/repo", [RefCommand(OLD, ZERO, "refs/heads/agent/x")]).allowed


def test_without_git_refs_any_ref_may_change() -> None:
    verdict = RequestRules.parse(git_push=["org/repo"]).judge_push(
        "org/repo", [RefCommand(OLD, NEW, "refs/heads/main")]
    )
    assert verdict.allowed


# -- a push's ref commands -------------------------------------------------------------------------
CAPS = b" report-status side-band-64k agent=git/2.39.5"
SECTION = (
    pkt(f"{ZERO} {NEW} refs/heads/agent/x".encode() + b"\0" + CAPS + b"\n")
    + pkt(f"{OLD} {ZERO} refs/heads/agent/old\n".encode())
    + pkt(f"{OLD} {NEW} refs/heads/main".encode())
    + b"0000"
)


def test_read_ref_commands_reads_a_hand_built_section() -> None:
    read = read_ref_commands(SECTION + b"PACK\x00\x00\x00\x02")
    assert read == (
        [
            RefCommand(ZERO, NEW, "refs/heads/agent/x"),
            RefCommand(OLD, ZERO, "refs/heads/agent/old"),
            RefCommand(OLD, NEW, "refs/heads/main"),
        ],
        len(SECTION),
    )
    assert [command.action for command in read[0]] == ["create", "delete", "update"]


def test_read_ref_commands_waits_for_the_whole_section() -> None:
    for end in range(len(SECTION)):
        assert read_ref_commands(SECTION[:end]) is None, end


def test_read_ref_commands_reads_sha256_ids_and_upper_case_hex() -> None:
    section = pkt(f"{'0' * 64} {'AB' * 32} refs/heads/x\0".encode()) + b"0000"
    assert read_ref_commands(section) == ([RefCommand("0" * 64, "ab" * 32, "refs/heads/x")], len(section))


def test_an_empty_command_list_is_read() -> None:
    assert read_ref_commands(b"0000PACK") == ([], 4)


@pytest.mark.parametrize(
    ("data", "complaint"),
    [
        (b"zzzz", "not four hex digits|pkt-line length"),
        (b"0003", "pkt-line length"),
        (b"0004", "pkt-line length"),
        (b"0001", "pkt-line length"),
        (b"fff1", "pkt-line length"),
        (pkt(f"{'x' * 40} {NEW} refs/heads/x".encode()) + b"0000", "not a ref command"),
        (pkt(f"{OLD} {'2' * 64} refs/heads/x".encode()) + b"0000", "not a ref command"),
        (pkt(f"{OLD} {NEW}".encode()) + b"0000", "not a ref command"),
        (pkt(f"{OLD} {NEW} refs/heads/x y".encode()) + b"0000", "not a ref command"),
        (pkt(f"{OLD}  {NEW} refs/heads/x".encode()) + b"0000", "not a ref command"),
        (SECTION[:-4] + pkt(f"{OLD} {NEW} refs/heads/x\0caps".encode()) + b"0000", "not a ref command"),
        (pkt(f"shallow {OLD}\n".encode()) + SECTION, "shallow"),
        (pkt(b"push-cert\0" + CAPS + b"\n") + pkt(b"certificate version 0.1\n"), "push-cert"),
    ],
)
def test_malformed_ref_commands_raise(data: bytes, complaint: str) -> None:
    with pytest.raises(ValueError, match=complaint):
        read_ref_commands(data)


def test_ref_commands_beyond_64_kib_raise_even_before_the_flush_arrives() -> None:
    line = pkt(f"{OLD} {NEW} refs/heads/{'x' * 900}".encode())
    fitting = COMMAND_SECTION_LIMIT // len(line)
    data = line * (fitting + 1)
    assert read_ref_commands(data[: len(line) * fitting]) is None
    with pytest.raises(ValueError, match="64 KiB"):
        read_ref_commands(data[: len(line) * fitting + 4])  # the next pkt-line would cross the limit
    rest = COMMAND_SECTION_LIMIT - len(line) * fitting
    filling = line * fitting + pkt(f"{OLD} {NEW} refs/heads/{'y' * (rest - 4 - 82 - 11)}".encode())
    assert len(filling) == COMMAND_SECTION_LIMIT
    with pytest.raises(ValueError, match="64 KiB"):  # no room is left for the flush
        read_ref_commands(filling)


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_read_ref_commands_reads_what_git_send_pack_sends(tmp_path: Path) -> None:
    env = {**os.environ, "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1", "GIT_TERMINAL_PROMPT": "0"}
    env |= {"GIT_AUTHOR_NAME": "a", "GIT_AUTHOR_EMAIL": "a@example.com", "GIT_COMMITTER_NAME": "a"}
    env |= {"GIT_COMMITTER_EMAIL": "a@example.com"}

    def git(*args: str, stdin: bytes = b"", check: bool = True) -> bytes:
        done = subprocess.run(["git", *args], input=stdin, capture_output=True, env=env, cwd=tmp_path, timeout=60)
        assert done.returncode == 0 or not check, done.stderr
        return done.stdout

    git("init", "-q", "--bare", "remote.git")
    git("init", "-q", "work")
    git("-C", "work", "commit", "-q", "--allow-empty", "-m", "one")
    git("-C", "work", "push", "-q", "../remote.git", "HEAD:refs/heads/main")
    git("-C", "work", "commit", "-q", "--allow-empty", "-m", "two")
    head = git("-C", "work", "rev-parse", "HEAD").decode().strip()
    main = git("-C", "work", "rev-parse", "HEAD~1").decode().strip()
    advertised = git("receive-pack", "--stateless-rpc", "--advertise-refs", "remote.git")
    # remote-curl drives send-pack like this: the refspecs as pkt-lines, then the server's
    # advertisement; send-pack frames each write once more as a pkt-line, which remote-curl strips.
    refspecs = pkt(b"HEAD:refs/heads/agent/x\n") + pkt(b":refs/heads/main\n") + b"0000"
    sent = git(
        "-C",
        "work",
        "send-pack",
        "--stateless-rpc",
        "--stdin",
        "../remote.git",
        stdin=refspecs + advertised,
        check=False,
    )
    body = unframed(sent)
    read = read_ref_commands(body)
    assert read is not None and body[read[1] : read[1] + 4] == b"PACK"
    assert set(read[0]) == {RefCommand(ZERO, head, "refs/heads/agent/x"), RefCommand(main, ZERO, "refs/heads/main")}
    push = RequestRules.parse(git_push=["remote"], git_refs=["refs/heads/agent/*"])
    assert "the delete of refs/heads/main is refused" in push.judge_push("remote", read[0]).message


def unframed(stream: bytes) -> bytes:
    body, at = b"", 0
    while at + 4 <= len(stream):
        length = int(stream[at : at + 4], 16)
        body += stream[at + 4 : at + length] if length else b""
        at += length or 4
    return body
