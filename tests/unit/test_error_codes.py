"""The error codes are declared once (:data:`sandbox.vocabulary.ErrorCode`); everything else agrees.

The exception tree names each code once, and the pi client spells the same union in TypeScript
(``ToolErrorCode`` in integrations/pi/src/protocol.ts), which this test reads as text.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import get_args

from sandbox import errors
from sandbox.vocabulary import ERROR_CODES, ErrorCode

PI_PROTOCOL = Path(__file__).resolve().parents[2] / "integrations" / "pi" / "src" / "protocol.ts"


def _subclasses(cls: type[errors.SandboxError]) -> list[type[errors.SandboxError]]:
    found = []
    for sub in cls.__subclasses__():
        found += [sub, *_subclasses(sub)]
    return found


def _pi_codes() -> list[str]:
    text = PI_PROTOCOL.read_text(encoding="utf-8")
    match = re.search(r"export type ToolErrorCode\s*=([^;]*);", text)
    assert match is not None, f"no `export type ToolErrorCode = ...;` in {PI_PROTOCOL}"
    return re.findall(r'"([A-Z_]+)"', match.group(1))


def test_the_tuple_is_the_literal() -> None:
    assert get_args(ErrorCode) == ERROR_CODES and len(set(ERROR_CODES)) == len(ERROR_CODES)


def test_each_code_has_one_class_of_the_tree() -> None:
    direct = {cls.code: cls for cls in errors.SandboxError.__subclasses__()}
    assert sorted(direct) == sorted(ERROR_CODES)
    assert all(cls.code in ERROR_CODES for cls in _subclasses(errors.SandboxError))


def test_the_pi_client_knows_the_same_codes() -> None:
    assert _pi_codes() == list(get_args(ErrorCode))
