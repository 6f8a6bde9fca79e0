"""Brace expansion, bash's first expansion: what the judge sees of ``/{,}`` and ``{rm,-rf,/}``."""

from __future__ import annotations

import pytest

from sandbox.policy.shell import MAX_BRACE_WORDS, Word, expand_braces, parse


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("/{,}", ["/", "/"]),
        ("~{,}", ["~", "~"]),
        ("/{usr,etc}", ["/usr", "/etc"]),
        ("a{b,c{d,e}}f", ["abf", "acdf", "acef"]),
        ("{a,b}{c,d}", ["ac", "ad", "bc", "bd"]),
        ("x{1..7..3}", ["x1", "x4", "x7"]),
        ("{c..a}", ["c", "b", "a"]),
        # Left alone, as bash leaves them: no comma, a parameter, unbalanced, mixed sequence ends.
        ("{x}", ["{x}"]),
        ("{}", ["{}"]),
        ("${HOME}", ["${HOME}"]),
        ("a{,b", ["a{,b"]),
        ("{1..c}", ["{1..c}"]),
    ],
)
def test_expand_braces(text: str, words: list[str]) -> None:
    assert expand_braces(text) == words


def test_an_expansion_past_the_limit_is_refused_not_cut_short() -> None:
    assert expand_braces(f"{{1..{MAX_BRACE_WORDS + 1}}}") is None
    assert expand_braces("{a,b}" * 9) is None  # 512 words
    assert expand_braces(f"{{1..{MAX_BRACE_WORDS}}}") is not None


def test_the_parser_expands_each_word_and_marks_an_oversized_one_dynamic() -> None:
    (command,) = parse("{rm,-rf,/}").commands
    assert [w.text for w in command.words] == ["rm", "-rf", "/"]
    (echo,) = parse("echo {1..100000}").commands
    assert echo.words[1] == Word("{1..100000}", dynamic=True)
