"""The tool registry: refuses, at registration, a tool that is not ready to run unattended."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

from pydantic import AliasChoices, AliasPath, BaseModel

from processors.ledger.commands import Policy
from processors.tools.manifest import EffectClass, RiskTier, Tool
from processors.tools.retention import (
    DEFAULT_KEY_RETENTION,
    KeyRetention,
    RetentionError,
    check_retention,
    describe,
    seconds_of,
)

TRUSTED_CONTEXT_FIELDS = frozenset(
    {"tenant_id", "tenant", "user_id", "principal", "scopes", "run_id", "step_id"}
)
_NAME = re.compile(r"^[a-z][a-z0-9_]{0,63}$")


class ToolRegistrationError(ValueError):
    pass


class ToolRegistry:
    def __init__(
        self,
        *,
        trusted_fields: frozenset[str] = TRUSTED_CONTEXT_FIELDS,
        default_key_retention: KeyRetention = DEFAULT_KEY_RETENTION,
    ) -> None:
        self._tools: dict[str, Tool] = {}
        self._trusted = trusted_fields
        self.default_key_retention = default_key_retention
        self._policies: dict[str, Policy] = {}

    def set_default_key_retention(self, retention: KeyRetention) -> None:
        """The retention of tools whose manifest sets none (``--key-retention``)."""
        self.default_key_retention = check_retention(retention)
        self._policies.clear()

    def key_retention(self, tool: Tool) -> KeyRetention:
        return self.default_key_retention if tool.key_retention is None else tool.key_retention

    def policy(self, tool: Tool) -> Policy:
        """What the pure core needs of ``tool``, with its key retention resolved (built once
        per tool: it is asked for on every call)."""
        policy = self._policies.get(tool.name)
        if policy is None:
            retention = seconds_of(self.key_retention(tool))
            policy = self._policies[tool.name] = replace(tool.policy, key_retention_s=retention)
        return policy

    def manifest(self, tool: Tool) -> dict[str, Any]:
        """The public manifest, with the key retention in force (ISO 8601, or ``forever``)."""
        retention = self.key_retention(tool)
        return tool.manifest() | {
            "key_retention": describe(retention),
            "key_retention_seconds": seconds_of(retention),
        }

    def register(self, tool: Tool) -> Tool:
        problems = self._problems(tool)
        if problems:
            raise ToolRegistrationError(
                f"tool {tool.name!r} cannot be registered: " + "; ".join(problems)
            )
        self._tools[tool.name] = tool
        return tool

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def __iter__(self) -> Iterator[Tool]:
        return iter(sorted(self._tools.values(), key=lambda t: t.name))

    def __len__(self) -> int:
        return len(self._tools)

    def _problems(self, tool: Tool) -> list[str]:
        problems = []
        if not _NAME.fullmatch(tool.name):
            problems.append("its name must match [a-z][a-z0-9_]{0,63}")
        if tool.name in self._tools:
            problems.append("a tool with this name is already registered")
        if (
            tool.effect is not EffectClass.READ_ONLY
            and tool.risk in (RiskTier.HIGH, RiskTier.IRREVERSIBLE)
            and tool.reconcile is None
        ):
            problems.append(
                f"a {tool.risk.value}-risk {tool.effect.value} needs a reconcile hook (a query "
                "of the downstream by idempotency key) so that an UNKNOWN outcome can be "
                "resolved without running it again; pass reconcile=..."
            )
        smuggled = sorted(self._trusted & _accepted_names(tool.arguments))
        if smuggled:
            problems.append(
                f"its argument model has trusted-context fields {smuggled}: tenant and principal "
                "come from authentication, never from model-supplied arguments"
            )
        if tool.timeout_s <= 0:
            problems.append("timeout_s must be positive")
        if tool.retry.max_attempts < 1 or tool.retry.max_rounds < 1:
            problems.append("retry.max_attempts and retry.max_rounds must be >= 1")
        described = tool.description
        if not (described.when_to_use.strip() and described.replay_behaviour.strip()):
            problems.append("its description must say when to use it and how replays behave")
        if tool.key_retention is not None:
            try:
                check_retention(tool.key_retention)
            except RetentionError as exc:
                problems.append(str(exc))
        unknown = sorted(tool.redact_fields - set(tool.arguments.model_fields))
        if unknown:
            problems.append(f"redact_fields names unknown argument fields {unknown}")
        return problems


def _accepted_names(model: type[BaseModel]) -> set[str]:
    """Every name under which a model accepts a field: attribute names and aliases."""
    names: set[str] = set()
    for name, info in model.model_fields.items():
        names.add(name)
        for alias in (info.alias, info.validation_alias):
            if isinstance(alias, str):
                names.add(alias)
            elif isinstance(alias, AliasChoices):
                names.update(c for c in alias.choices if isinstance(c, str))
            elif isinstance(alias, AliasPath) and alias.path and isinstance(alias.path[0], str):
                names.add(alias.path[0])
    return names
