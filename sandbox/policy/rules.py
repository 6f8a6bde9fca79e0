"""Built-in command rules (removable by id) and the user's allow / block / ask rules.

A user rule is plain text or a structured pattern. Plain text blocks or asks when it is a
substring of the command; it is also read as a command itself, so ``rm -rf`` matches
``rm --force --recursive x``. An allow rule only ever matches one simple command at a time,
never the raw text: allowing ``git push`` must not allow ``git push; rm -rf x``.
"""

from __future__ import annotations

import hashlib
import json
import os
import tomllib
from dataclasses import dataclass, field
from importlib import resources
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from sandbox import datadir
from sandbox.errors import InvalidArgument
from sandbox.patterns import PatternSet
from sandbox.policy.flags import Shape, shape
from sandbox.vocabulary import CLASSIFIER_MODES, PERMISSION_MODES, RuleAction

if TYPE_CHECKING:
    from collections.abc import Iterable
    from pathlib import Path

    from sandbox.vocabulary import ClassifierMode, Layer, PermissionMode


POLICY_VERSION = "1"


@dataclass(frozen=True, slots=True)
class BuiltinRule:
    id: str
    layer: Layer
    description: str
    examples: tuple[str, ...] = ()  # commands it decides (tests/unit/policy/test_builtin_rules.py)


BUILTIN_RULES_FILE = "builtin-rules.toml"
"""The built-in rules as data a user can read (shipped beside this module): id, layer, what each
decides and commands it decides. The judges (commands, destructive) implement them."""


def _builtin_rules() -> tuple[BuiltinRule, ...]:
    text = resources.files(__package__).joinpath(BUILTIN_RULES_FILE).read_text(encoding="utf-8")
    return tuple(
        BuiltinRule(item["id"], item["layer"], item["description"], tuple(item.get("examples", ())))
        for item in tomllib.loads(text)["rule"]
    )


BUILTIN_RULES: tuple[BuiltinRule, ...] = _builtin_rules()
BUILTIN_IDS = frozenset(rule.id for rule in BUILTIN_RULES)


class UserRule(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    action: RuleAction
    id: str = ""
    text: str | None = None
    tool: str = "Bash"
    command: str | None = None
    args: tuple[str, ...] = ()
    flags: tuple[str, ...] = ()
    path: str | None = None

    @model_validator(mode="after")
    def _check(self) -> UserRule:
        if not (self.text or self.command or self.path):
            raise ValueError("a rule needs text, command or path")
        if not self.id:
            digest = hashlib.sha256(self.model_dump_json(exclude={"id"}).encode()).hexdigest()[:8]
            object.__setattr__(self, "id", f"user.{self.action}.{digest}")
        return self


@dataclass(frozen=True, slots=True)
class CompiledRule:
    rule: UserRule
    pattern: Shape | None
    paths: PatternSet | None

    def matches_text(self, command: str) -> bool:
        return bool(self.rule.text) and _squash(self.rule.text or "") in _squash(command)

    def matches_shape(self, cmd: Shape) -> bool:
        pattern = self.pattern
        if pattern is None or pattern.name != cmd.name or not pattern.flags <= cmd.flags:
            return False
        return _subsequence(pattern.positionals, cmd.positionals)

    def matches_simple(self, cmd: Shape) -> bool:
        rendered = " ".join((cmd.name, *sorted(cmd.flags), *cmd.positionals))
        return self.matches_shape(cmd) or (self.matches_text(rendered) if self.rule.text else False)


def _squash(text: str) -> str:
    return " ".join(text.split())


def _subsequence(needle: tuple[str, ...], hay: tuple[str, ...]) -> bool:
    remaining = iter(hay)
    return all(any(item == candidate for candidate in remaining) for item in needle)


def _compile(rule: UserRule, homes: tuple[str, ...]) -> CompiledRule:
    pattern: Shape | None = None
    if rule.command:
        pattern = shape(os.path.basename(rule.command), [*rule.flags, *rule.args])
    elif rule.text and rule.tool == "Bash":
        pattern = _text_shape(rule.text)
    paths = PatternSet((rule.path,), homes) if rule.path else None
    return CompiledRule(rule, pattern, paths)


def _text_shape(text: str) -> Shape | None:
    # Imported here: shell.py is heavier and rules.py is also used by the CLI store commands.
    from sandbox.policy.shell import Unparseable, parse

    try:
        script = parse(text)
    except Unparseable:
        return None
    if len(script.commands) != 1 or not script.commands[0].words:
        return None
    words = script.commands[0].words
    if any(word.dynamic for word in words):
        return None
    return shape(os.path.basename(words[0].text), [w.text for w in words[1:]])


@dataclass(frozen=True)
class RuleSet:
    """Everything configurable the command and path judges consult; immutable per session."""

    user: tuple[UserRule, ...] = ()
    removed: frozenset[str] = frozenset()
    deny_read: tuple[str, ...] = ()
    deny_write: tuple[str, ...] = ()
    confirm_write: tuple[str, ...] = ()
    notices: tuple[str, ...] = ()
    classifier: ClassifierMode | None = None  # the user's global classifier mode (``sandbox policy classifier``)
    _compiled: dict[str, tuple[CompiledRule, ...]] = field(default_factory=dict, compare=False, repr=False)

    def enabled(self, rule_id: str) -> bool:
        return rule_id not in self.removed

    def compiled(self, homes: tuple[str, ...] = ()) -> tuple[CompiledRule, ...]:
        key = "|".join(homes)
        if key not in self._compiled:
            self._compiled[key] = tuple(_compile(rule, homes) for rule in self.user)
        return self._compiled[key]

    @property
    def version(self) -> str:
        """Changes whenever anything that can change a decision changes (recorded in the audit)."""
        blob = json.dumps(
            [
                [r.model_dump() for r in self.user],
                sorted(self.removed),
                self.deny_read,
                self.deny_write,
                self.confirm_write,
            ],
            sort_keys=True,
        )
        return f"{POLICY_VERSION}+{hashlib.sha256(blob.encode()).hexdigest()[:10]}"

    def merged(self, other: RuleSet) -> RuleSet:
        return RuleSet(
            user=(*self.user, *other.user),
            removed=self.removed | other.removed,
            deny_read=(*self.deny_read, *other.deny_read),
            deny_write=(*self.deny_write, *other.deny_write),
            confirm_write=(*self.confirm_write, *other.confirm_write),
            notices=(*self.notices, *other.notices),
            classifier=other.classifier or self.classifier,
        )

    @classmethod
    def from_settings(cls, settings: Any) -> RuleSet:
        """From a profile's ``policy`` section (``sandbox.profile_policy.Policy``)."""
        check_removable(settings.remove_rules)
        return cls(
            user=tuple(parse_rules(settings.rules, "profile")),
            removed=frozenset(settings.remove_rules),
            deny_read=tuple(settings.deny_read),
            deny_write=tuple(settings.deny_write),
            confirm_write=tuple(settings.confirm_write),
        )


def check_removable(ids: Iterable[str]) -> None:
    unknown = sorted(set(ids) - BUILTIN_IDS)
    if unknown:
        raise InvalidArgument(
            f"unknown built-in rule id(s): {', '.join(unknown)}; known: {', '.join(sorted(BUILTIN_IDS))}",
            rule_ids=unknown,
        )


def parse_rules(items: Iterable[dict[str, Any]], source: str) -> list[UserRule]:
    rules: list[UserRule] = []
    for index, item in enumerate(items):
        try:
            rules.append(UserRule.model_validate(item))
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'rule'}: {e['msg']}" for e in exc.errors())
            raise InvalidArgument(f"invalid rule #{index + 1} in {source}: {problems}", source=source) from exc
    return rules


class RuleStore:
    """The user's rules, one JSON file under the data directory, replaced atomically."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path or datadir.subdir("policy") / "rules.json"

    def _load(self) -> dict[str, Any]:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {"rules": [], "removed": []}
        except (OSError, ValueError) as exc:
            raise InvalidArgument(f"cannot read the rules store {self.path}: {exc}", file=str(self.path)) from exc
        if not isinstance(data, dict):
            raise InvalidArgument(f"the rules store {self.path} is not a JSON object", file=str(self.path))
        return {
            "rules": list(data.get("rules", [])),
            "removed": list(data.get("removed", [])),
            **({"mode": data["mode"]} if data.get("mode") in PERMISSION_MODES else {}),
            **({"classifier": data["classifier"]} if data.get("classifier") in CLASSIFIER_MODES else {}),
        }

    def _save(self, data: dict[str, Any]) -> None:
        datadir.atomic_write(self.path, json.dumps(data, indent=2, sort_keys=True) + "\n")

    def mode(self) -> PermissionMode | None:
        """The global default permission mode (``sandbox policy mode``), if one was set."""
        found: PermissionMode | None = self._load().get("mode")
        return found

    def set_mode(self, mode: PermissionMode | None) -> None:
        data = self._load()
        data.pop("mode", None)
        if mode is not None:
            data["mode"] = mode
        self._save(data)

    def classifier(self) -> ClassifierMode | None:
        """The global classifier mode (``sandbox policy classifier``), if one was set."""
        found: ClassifierMode | None = self._load().get("classifier")
        return found

    def set_classifier(self, mode: ClassifierMode | None) -> None:
        data = self._load()
        data.pop("classifier", None)
        if mode is not None:
            data["classifier"] = mode
        self._save(data)

    def ruleset(self) -> RuleSet:
        data = self._load()
        check_removable(data["removed"])
        return RuleSet(
            user=tuple(parse_rules(data["rules"], str(self.path))),
            removed=frozenset(data["removed"]),
            classifier=data.get("classifier"),
        )

    def add(self, action: RuleAction, text: str, tool: str = "Bash") -> UserRule:
        if not text.strip():
            raise InvalidArgument("a rule's text cannot be empty")
        rule = UserRule(action=action, text=text.strip(), tool=tool)
        data = self._load()
        if all(item.get("id") != rule.id for item in data["rules"]):
            data["rules"].append(rule.model_dump(exclude_defaults=True) | {"id": rule.id})
            self._save(data)
        return rule

    def remove(self, rule_id: str) -> str:
        """Delete a user rule, or switch a built-in one off; returns what happened."""
        data = self._load()
        kept = [item for item in data["rules"] if item.get("id") != rule_id]
        if len(kept) != len(data["rules"]):
            data["rules"] = kept
            self._save(data)
            return f"removed user rule {rule_id}"
        check_removable([rule_id])
        if rule_id not in data["removed"]:
            data["removed"].append(rule_id)
            self._save(data)
        return f"disabled built-in rule {rule_id}"

    def restore(self, rule_id: str) -> str:
        check_removable([rule_id])
        data = self._load()
        data["removed"] = [item for item in data["removed"] if item != rule_id]
        self._save(data)
        return f"restored built-in rule {rule_id}"
