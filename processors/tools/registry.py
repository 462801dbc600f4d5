"""The tool registry: refuses, at registration, a tool that is not ready to run unattended."""

from __future__ import annotations

import re
from collections.abc import Iterator

from pydantic import AliasChoices, AliasPath, BaseModel

from processors.tools.manifest import EffectClass, RiskTier, Tool

TRUSTED_CONTEXT_FIELDS = frozenset(
    {"tenant_id", "tenant", "user_id", "principal", "scopes", "run_id", "step_id"}
)
_NAME = re.compile(r"^[a-z][a-z0-9_]{0,63}$")


class ToolRegistrationError(ValueError):
    pass


class ToolRegistry:
    def __init__(self, *, trusted_fields: frozenset[str] = TRUSTED_CONTEXT_FIELDS) -> None:
        self._tools: dict[str, Tool] = {}
        self._trusted = trusted_fields

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
