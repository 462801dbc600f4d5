"""Tools from decorated handlers: everything a :class:`Tool` needs that the function already
says is taken from the function.

- the argument model: the handler's first parameter, typed with a pydantic model;
- the result model: its return annotation (or ``result=`` when it returns a
  :class:`HandlerResult`);
- the description: its docstring, whose first paragraph is the summary and whose
  ``Use when:``, ``Do not use when:`` and ``Preconditions:`` sections are the rest;
- the replay sentence: from the effect class, so no author writes it by hand (and none gets
  it wrong).

What is missing is a :class:`ToolRegistrationError` that names it, at decoration time.
"""

from __future__ import annotations

import inspect
import re
import typing
from collections.abc import Awaitable, Callable, Iterable, Mapping
from datetime import timedelta
from typing import Any, TypedDict

from pydantic import BaseModel

from toolledger.processors.groups.facts import Compensation
from toolledger.processors.ledger.commands import Found, NotHappened, ReconcileOutcome
from toolledger.processors.tools.manifest import (
    ApprovalRule,
    ApproverKind,
    EffectClass,
    Handler,
    HandlerResult,
    Impact,
    JobRef,
    RetryPolicy,
    RiskTier,
    Tool,
    ToolContext,
    ToolDescription,
    ToolRegistrationError,
)
from toolledger.schemas.keys import KeyScope

REPLAY_SENTENCES = {
    EffectClass.MUTATION: (
        "Calling again with the same idempotency key and arguments returns the stored "
        "outcome without running it again; the same key with other arguments is refused."
    ),
    EffectClass.LONG_RUNNING: (
        "Calling again with the same idempotency key and arguments returns the same job, or "
        "the stored outcome once it has finished, and starts no other; the same key with "
        "other arguments is refused."
    ),
    EffectClass.READ_ONLY: "Read-only: needs no idempotency key and is never replayed.",
}

_SECTIONS = {
    "Use when": "when_to_use",
    "Do not use when": "when_not_to_use",
    "Preconditions": "preconditions",
}
# a section starts wherever its name and a colon stand as words ("Do not use when" is tried
# first, so its "use when" is not taken for the other section)
_SECTION = re.compile(r"\b(Do not use when|Use when|Preconditions)\s*:")

# what a decorated reconcile hook returns: the result (found), None (it did not happen)
FoundResult = BaseModel | HandlerResult | None
ReconcileFunction = Callable[[ToolContext], Awaitable[FoundResult]]


def description_of(name: str, doc: str | None, effect: EffectClass) -> ToolDescription:
    """The description from a docstring: the first paragraph, then its sections."""
    text = inspect.cleandoc(doc or "")
    if not text:
        raise ToolRegistrationError(
            f"tool {name!r} cannot be registered: its handler has no docstring; the docstring "
            "is its description (a summary, then 'Use when:', 'Do not use when:' and "
            "'Preconditions:' sections)"
        )
    marks = list(_SECTION.finditer(text))
    summary = " ".join(text[: marks[0].start() if marks else len(text)].split())
    joined: dict[str, str] = {}
    for index, mark in enumerate(marks):
        section = _SECTIONS[mark.group(1)]
        if section in joined:
            raise ToolRegistrationError(
                f"tool {name!r} cannot be registered: its docstring has two "
                f"{mark.group(1)!r} sections"
            )
        end = marks[index + 1].start() if index + 1 < len(marks) else len(text)
        joined[section] = " ".join(text[mark.end() : end].split())
    if not joined.get("when_to_use"):
        raise ToolRegistrationError(
            f"tool {name!r} cannot be registered: its docstring needs a 'Use when:' section "
            "(a model reads it to decide whether to call the tool)"
        )
    return ToolDescription(
        summary=summary,
        when_to_use=joined["when_to_use"],
        when_not_to_use=joined.get("when_not_to_use", ""),
        preconditions=joined.get("preconditions", ""),
        replay_behaviour=REPLAY_SENTENCES[effect],
    )


def _signature_models(
    name: str,
    function: Callable[..., Any],
    result: type[BaseModel] | None,
    localns: Mapping[str, Any] | None,
) -> tuple[type[BaseModel], type[BaseModel], bool]:
    """(argument model, result model, whether the handler takes a context)."""
    where = f"tool {name!r} cannot be registered: its handler {function.__qualname__}"
    if not inspect.iscoroutinefunction(function):
        raise ToolRegistrationError(f"{where} must be an async function (async def)")
    try:
        hints = typing.get_type_hints(function, localns=dict(localns or {}))
    except NameError as exc:
        raise ToolRegistrationError(
            f"{where} has an annotation that cannot be resolved: {exc}"
        ) from exc
    parameters = list(inspect.signature(function).parameters.values())
    first = parameters[0] if parameters else None
    arguments = hints.get(first.name) if first is not None else None
    if not (isinstance(arguments, type) and issubclass(arguments, BaseModel)):
        raise ToolRegistrationError(
            f"{where} needs a first parameter typed with a pydantic model, its arguments "
            "(e.g. `async def create(args: CreateArgs, ctx: ToolContext) -> Created`)"
        )
    if len(parameters) > 2:
        raise ToolRegistrationError(
            f"{where} takes {len(parameters)} parameters; it takes its arguments and, "
            "optionally, a ToolContext"
        )
    if result is None:
        returned = hints.get("return")
        if returned is None:
            raise ToolRegistrationError(
                f"{where} needs a return annotation naming its result model (a pydantic "
                "model), e.g. `-> Created`"
            )
        if returned is JobRef:
            raise ToolRegistrationError(
                f"{where} returns a JobRef (it starts a job): pass result=<model> for what the "
                "finished job answers"
            )
        if not (isinstance(returned, type) and issubclass(returned, BaseModel)):
            raise ToolRegistrationError(
                f"{where} returns {returned!r}, not a pydantic model: annotate the result "
                "model, or pass result=<model> when it returns a HandlerResult"
            )
        result = returned
    return arguments, result, len(parameters) == 2


def _handler(function: Callable[..., Any], takes_context: bool) -> Handler:
    if takes_context:
        return typing.cast(Handler, function)

    async def without_context(arguments: Any, _ctx: ToolContext) -> BaseModel | HandlerResult:
        return typing.cast(BaseModel | HandlerResult, await function(arguments))

    return without_context


def reconcile_hook(name: str, result: type[BaseModel], function: ReconcileFunction) -> Any:
    """A reconcile hook from a function that returns the result model (the downstream has the
    effect), a :class:`HandlerResult` (with its downstream id), or None (it did not happen).
    Anything it raises leaves the call UNKNOWN for a later query, as with any hook."""
    if not inspect.iscoroutinefunction(function):
        raise ToolRegistrationError(
            f"the reconcile hook of tool {name!r} must be an async function (async def)"
        )

    async def reconcile(ctx: ToolContext) -> ReconcileOutcome:
        found = await function(ctx)
        if found is None:
            return NotHappened()
        value: BaseModel | Mapping[str, Any]
        if isinstance(found, HandlerResult):
            request_id, value = found.downstream_request_id, found.value
        else:
            request_id, value = None, found
        raw = value.model_dump(mode="json") if isinstance(value, BaseModel) else value
        checked = result.model_validate(raw)  # a tool's answer is checked like a handler's
        return Found(checked.model_dump_json(), downstream_request_id=request_id)

    return reconcile


class ToolOptions(TypedDict, total=False):
    """The keyword arguments of ``@registry.mutation(...)`` and its siblings: the parts of a
    :class:`Tool` the handler cannot tell. Each defaults as :class:`Tool` does."""

    name: str  # default: the function's name
    version: str  # default "1"
    risk: RiskTier | str
    result: type[BaseModel]  # when the handler returns a HandlerResult
    timeout_s: float
    retry: RetryPolicy
    redact_fields: Iterable[str]
    scopes: Iterable[str]
    open_world: bool
    approval: ApprovalRule | ApproverKind  # "user", "operator" or a rule choosing by arguments
    key_retention: timedelta | str  # a duration ("24h", "PT24H") or "forever"
    key_scope: KeyScope | str  # "tenant" or "tenant+principal" (default: the ledger's)
    describe_impact: Callable[[Any], Impact]
    compensate: Compensation  # how a group undoes a completed call (a tool, an args function)
    job_timeout_s: float  # long_running: how long the job may run before it is UNKNOWN


def build_tool(
    function: Callable[..., Any],
    effect: EffectClass,
    options: ToolOptions,
    localns: Mapping[str, Any] | None = None,
) -> Tool:
    """The :class:`Tool` a decorated ``function`` declares (registration checks the rest).
    ``localns``: the names where it was decorated, for annotations of models defined in a
    function (postponed annotations are resolved by name)."""
    name = options.get("name") or function.__name__
    result = options.get("result")
    arguments, result, takes_context = _signature_models(name, function, result, localns)
    return Tool(
        name=name,
        version=options.get("version", "1"),
        arguments=arguments,
        result=result,
        handler=_handler(function, takes_context),
        description=description_of(name, function.__doc__, effect),
        effect=effect,
        risk=RiskTier(options.get("risk", RiskTier.LOW)),
        timeout_s=options.get("timeout_s", 10.0),
        retry=options.get("retry", RetryPolicy()),
        compensate=options.get("compensate"),
        job_timeout_s=options.get("job_timeout_s"),
        redact_fields=frozenset(options.get("redact_fields", ())),
        scopes=frozenset(options.get("scopes", ("tools:call",))),
        open_world=options.get("open_world", True),
        approval=options.get("approval"),
        key_retention=options.get("key_retention"),
        key_scope=options.get("key_scope"),
        describe_impact=options.get("describe_impact"),
    )
