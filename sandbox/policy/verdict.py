"""What one policy rule finds, and which finding decides; the words are :mod:`sandbox.vocabulary`'s."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sandbox.vocabulary import Layer

# How a Bash command is judged before the permission mode is applied, weakest first:
# "exempt" runs silently, "mode" follows the permission mode, "ask" is confirmed in every mode,
# "deny" never runs and is never asked.
LAYER_RANK: dict[Layer, int] = {"exempt": 0, "mode": 1, "ask": 2, "deny": 3}


@dataclass(frozen=True, slots=True)
class Finding:
    layer: Layer
    rule_id: str
    reason: str


EXEMPT = Finding("exempt", "exempt.read-only", "read-only command inside the session roots")


def strongest(findings: list[Finding], default: Finding = EXEMPT) -> Finding:
    """The finding that decides: the highest layer, the first one seen among equals."""
    best = default
    for finding in findings:
        if LAYER_RANK[finding.layer] > LAYER_RANK[best.layer]:
            best = finding
    return best
