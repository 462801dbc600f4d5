"""The tool registry: refuses, at registration, a tool that is not ready to run unattended."""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any, TypeVar, Unpack

from pydantic import AliasChoices, AliasPath, BaseModel

from toolledger.processors.ledger.commands import Policy
from toolledger.processors.tools.decorators import (
    ReconcileFunction,
    ToolOptions,
    build_tool,
    reconcile_hook,
)
from toolledger.processors.tools.manifest import (
    APPROVER_KINDS,
    CancelHook,
    EffectClass,
    PollHook,
    RiskTier,
    Tool,
)
from toolledger.processors.tools.manifest import ToolRegistrationError as ToolRegistrationError
from toolledger.processors.tools.retention import (
    DEFAULT_KEY_RETENTION,
    KeyRetention,
    RetentionError,
    check_retention,
    describe,
    seconds_of,
)
from toolledger.schemas.keys import DEFAULT_KEY_SCOPE, KeyScope

TRUSTED_CONTEXT_FIELDS = frozenset(
    {"tenant_id", "tenant", "user_id", "principal", "scopes", "run_id", "step_id"}
)
_NAME = re.compile(r"^[a-z][a-z0-9_]{0,63}$")


F = TypeVar("F", bound=Callable[..., Any])


class DecoratedTool:
    """What ``@registry.mutation(...)`` and its siblings return: a handle on the registered
    tool. ``@handle.reconcile`` adds its reconcile hook; calling the handle calls the handler
    as written (for the author's own tests)."""

    def __init__(self, registry: ToolRegistry, name: str, function: Callable[..., Any]) -> None:
        self._registry = registry
        self.name = name
        self.function = function

    @property
    def tool(self) -> Tool:
        return self._registry._tools[self.name]

    def reconcile(self, function: ReconcileFunction) -> ReconcileFunction:
        """The downstream's answer to "did the call with this idempotency key happen?": the
        result model if it did, None if it did not (return it, do not raise)."""
        tool = self.tool
        hook = reconcile_hook(self.name, tool.result, function)
        self._registry._tools[self.name] = replace(tool, reconcile=hook)
        self._registry._awaiting_reconcile.discard(self.name)
        self._registry._policies.pop(self.name, None)
        return function

    def poll(self, function: PollHook) -> PollHook:
        """A long_running tool's poll: running, succeeded (with its result) or failed."""
        self._registry._tools[self.name] = replace(self.tool, poll=function)
        self._registry._awaiting_poll.discard(self.name)
        return function

    def cancel(self, function: CancelHook) -> CancelHook:
        """A long_running tool's cancel: stops the job (the call ends CANCELLED)."""
        self._registry._tools[self.name] = replace(self.tool, cancel=function)
        return function

    async def __call__(self, *args: Any) -> Any:
        return await self.function(*args)


class ToolRegistry:
    def __init__(
        self,
        *,
        trusted_fields: frozenset[str] = TRUSTED_CONTEXT_FIELDS,
        default_key_retention: KeyRetention = DEFAULT_KEY_RETENTION,
        default_key_scope: KeyScope = DEFAULT_KEY_SCOPE,
    ) -> None:
        self._tools: dict[str, Tool] = {}
        self._trusted = trusted_fields
        self.default_key_retention = default_key_retention
        self.default_key_scope = default_key_scope
        self._policies: dict[str, Policy] = {}
        # decorated tools whose risk needs a reconcile hook that ``@tool.reconcile`` adds
        # after the decorator ran: checked when the registry is first used
        self._awaiting_reconcile: set[str] = set()
        self._awaiting_poll: set[str] = set()  # decorated long_running tools, until @.poll

    def set_default_key_retention(self, retention: KeyRetention) -> None:
        """The retention of tools whose manifest sets none (``--key-retention``)."""
        self.default_key_retention = check_retention(retention)
        self._policies.clear()

    def set_default_key_scope(self, scope: KeyScope) -> None:
        """The key scope of tools that set none: the ledger's (``--key-scope``; an embedded
        ledger's is recorded in its file)."""
        self.default_key_scope = scope

    def key_retention(self, tool: Tool) -> KeyRetention:
        if tool.key_retention is None:
            return self.default_key_retention
        return check_retention(tool.key_retention)  # checked at registration: it parses

    def key_scope(self, tool: Tool) -> KeyScope:
        """The tool's own key scope, else the ledger's (checked at registration: it parses)."""
        if tool.key_scope is None:
            return self.default_key_scope
        return KeyScope.parse(tool.key_scope)

    def key_scope_of(self, name: str) -> KeyScope:
        """The key scope of the tool named ``name``; the ledger's for a name no tool has (its
        calls are refused as TOOL_NOT_FOUND, under a key of that scope)."""
        tool = self._tools.get(name)
        return self.default_key_scope if tool is None else self.key_scope(tool)

    def policy(self, tool: Tool) -> Policy:
        """What the pure core needs of ``tool``, with its key retention resolved (built once
        per tool: it is asked for on every call)."""
        policy = self._policies.get(tool.name)
        if policy is None:
            retention = seconds_of(self.key_retention(tool))
            policy = self._policies[tool.name] = replace(tool.policy, key_retention_s=retention)
        return policy

    def manifest(self, tool: Tool) -> dict[str, Any]:
        """The public manifest, with the key retention (ISO 8601, or ``forever``) and the key
        scope in force."""
        retention = self.key_retention(tool)
        return tool.manifest() | {
            "key_retention": describe(retention),
            "key_retention_seconds": seconds_of(retention),
            "key_scope": self.key_scope(tool).value,
        }

    def mutation(self, **options: Unpack[ToolOptions]) -> Callable[[F], DecoratedTool]:
        """Register the decorated handler as a mutation: it runs at most once per key."""
        return self._decorator(EffectClass.MUTATION, options)

    def read_only(self, **options: Unpack[ToolOptions]) -> Callable[[F], DecoratedTool]:
        """Register the decorated handler as read-only: no key, runs on every call."""
        return self._decorator(EffectClass.READ_ONLY, options)

    def long_running(self, **options: Unpack[ToolOptions]) -> Callable[[F], DecoratedTool]:
        """Register the decorated handler as a long-running tool (it starts a job)."""
        return self._decorator(EffectClass.LONG_RUNNING, options)

    def _decorator(self, effect: EffectClass, options: ToolOptions) -> Callable[[F], DecoratedTool]:
        def register(function: F) -> DecoratedTool:
            where = sys._getframe(1).f_locals  # the decorating scope, for its local models
            tool = build_tool(function, effect, options, where)
            self._register(tool, reconcile_later=True)
            return DecoratedTool(self, tool.name, function)

        return register

    def check(self) -> None:
        """Raise :class:`ToolRegistrationError` if a decorated tool still lacks the reconcile
        hook its risk needs (``@tool.reconcile``). Runtimes call it before they serve."""
        if self._awaiting_reconcile:
            problems = [
                f"tool {name!r} cannot be registered: {_needs_reconcile(self._tools[name])}"
                " (decorate an async function with @<tool>.reconcile)"
                for name in sorted(self._awaiting_reconcile)
            ]
            raise ToolRegistrationError("; ".join(problems))
        if self._awaiting_poll:
            raise ToolRegistrationError(
                "; ".join(
                    f"tool {name!r} cannot be registered: {_NEEDS_POLL}"
                    for name in sorted(self._awaiting_poll)
                )
            )

    def register(self, tool: Tool) -> Tool:
        return self._register(tool, reconcile_later=False)

    def _register(self, tool: Tool, *, reconcile_later: bool) -> Tool:
        problems = self._problems(tool)
        if reconcile_later and _needs_reconcile(tool) in problems:
            problems.remove(_needs_reconcile(tool))
            self._awaiting_reconcile.add(tool.name)
        if reconcile_later and _NEEDS_POLL in problems:
            problems.remove(_NEEDS_POLL)
            self._awaiting_poll.add(tool.name)
        if problems:
            raise ToolRegistrationError(
                f"tool {tool.name!r} cannot be registered: " + "; ".join(problems)
            )
        self._tools[tool.name] = tool
        return tool

    def get(self, name: str) -> Tool | None:
        self.check()
        return self._tools.get(name)

    def __iter__(self) -> Iterator[Tool]:
        self.check()
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
            problems.append(_needs_reconcile(tool))
        smuggled = sorted(self._trusted & _accepted_names(tool.arguments))
        if smuggled:
            problems.append(
                f"its argument model has trusted-context fields {smuggled}: tenant and principal "
                "come from authentication, never from model-supplied arguments"
            )
        if tool.timeout_s <= 0:
            problems.append("timeout_s must be positive")
        if isinstance(tool.approval, str) and tool.approval not in APPROVER_KINDS:
            problems.append(
                f"approval must be one of {list(APPROVER_KINDS)} or a rule, not {tool.approval!r}"
            )
        if tool.effect is EffectClass.LONG_RUNNING and tool.poll is None:
            problems.append(_NEEDS_POLL)
        if tool.effect is not EffectClass.LONG_RUNNING and (
            tool.poll is not None or tool.cancel is not None or tool.job_timeout_s is not None
        ):
            problems.append("poll, cancel and job_timeout_s are for long_running tools only")
        if tool.job_timeout_s is not None and tool.job_timeout_s <= 0:
            problems.append("job_timeout_s must be positive")
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
        if tool.key_scope is not None:
            try:
                KeyScope.parse(tool.key_scope)
            except ValueError as exc:
                problems.append(str(exc))
        unknown = sorted(tool.redact_fields - set(tool.arguments.model_fields))
        if unknown:
            problems.append(f"redact_fields names unknown argument fields {unknown}")
        return problems


_NEEDS_POLL = (
    "a long_running tool needs a poll hook (poll=..., or @<tool>.poll): its handler returns "
    "a job reference and poll tells whether the job is running, succeeded or failed"
)


def _needs_reconcile(tool: Tool) -> str:
    return (
        f"a {tool.risk.value}-risk {tool.effect.value} needs a reconcile hook (a query "
        "of the downstream by idempotency key) so that an UNKNOWN outcome can be "
        "resolved without running it again; pass reconcile=..."
    )


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
