"""What the group core needs to know about a tool, injected so that the core imports no registry.

A front door builds one :class:`StepTool` per registered tool (``ToolFacts`` is the ready-made
one) and hands the mapping ``name -> StepTool`` to :func:`processors.groups.parse_group`.
For a registry tool ``t`` that is, for example::

    ToolFacts.of_model(
        t.arguments,
        keyed=t.keyed,
        irreversible=t.risk is RiskTier.IRREVERSIBLE,
        compensation=Compensation("close_ticket", lambda args, result: {
            "ticket_id": result["ticket_id"]}),
    )

The compensation's argument function must be pure and deterministic: ``decide`` calls it
again whenever it decides again (after a crash, too) and relies on getting the same arguments.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from pydantic import BaseModel, ValidationError

from toolledger.schemas.errors import FieldError
from toolledger.schemas.keys import DEFAULT_KEY_SCOPE, KeyScope

__all__ = [
    "Compensation",
    "CompensationArguments",
    "StepTool",
    "ToolFacts",
    "Validator",
    "accept_any",
    "field_errors",
    "model_validator",
]

# the step's arguments (as validated and sent) -> its field errors, locs relative to them
Validator = Callable[[Mapping[str, Any]], Sequence[FieldError]]
# (the step's arguments as sent, the step's result) -> the compensating call's arguments
CompensationArguments = Callable[[Mapping[str, Any], Any], Mapping[str, Any]]


@dataclass(frozen=True, slots=True)
class Compensation:
    """How a completed step is undone: a call of ``tool`` with arguments built from the step's
    arguments and result (``create_ticket`` -> ``close_ticket(ticket_id=result.ticket_id)``)."""

    tool: str
    arguments: CompensationArguments


class StepTool(Protocol):
    """The facts of one tool that parsing and deciding need."""

    @property
    def keyed(self) -> bool:
        """A mutation: its calls carry an idempotency key (read-only tools' calls do not)."""

    @property
    def irreversible(self) -> bool:
        """Its effect cannot be undone (risk tier ``irreversible``)."""

    @property
    def compensation(self) -> Compensation | None: ...

    @property
    def scopes(self) -> frozenset[str]:
        """The scopes a caller needs to call it (a group's submitter needs its steps')."""

    @property
    def key_scope(self) -> KeyScope:
        """Whose keys its call keys are scoped by (the step's call id is in that scope)."""

    def validate(self, arguments: Mapping[str, Any]) -> Sequence[FieldError]:
        """Field errors of ``arguments`` (locs relative to them, ``"$"`` for the whole)."""


def accept_any(_arguments: Mapping[str, Any]) -> Sequence[FieldError]:
    return ()


@dataclass(frozen=True, slots=True)
class ToolFacts:
    """A plain :class:`StepTool`."""

    validator: Validator = accept_any
    keyed: bool = True
    irreversible: bool = False
    compensation: Compensation | None = None
    scopes: frozenset[str] = frozenset()
    key_scope: KeyScope = DEFAULT_KEY_SCOPE

    def validate(self, arguments: Mapping[str, Any]) -> Sequence[FieldError]:
        return self.validator(arguments)

    @classmethod
    def of_model(
        cls,
        model: type[BaseModel],
        *,
        keyed: bool = True,
        irreversible: bool = False,
        compensation: Compensation | None = None,
        scopes: frozenset[str] = frozenset(),
        key_scope: KeyScope = DEFAULT_KEY_SCOPE,
    ) -> ToolFacts:
        return cls(model_validator(model), keyed, irreversible, compensation, scopes, key_scope)


def field_errors(exc: ValidationError) -> list[FieldError]:
    """Pydantic's errors as field errors, in the executor's format (``a.0.b``; ``$``: root)."""
    return [
        FieldError(loc=".".join(str(p) for p in e["loc"]) or "$", msg=e["msg"], type=e["type"])
        for e in exc.errors()
    ]


def model_validator(model: type[BaseModel]) -> Validator:
    """A validator that checks arguments against a tool's pydantic arguments model."""

    def validate(arguments: Mapping[str, Any]) -> Sequence[FieldError]:
        try:
            model.model_validate(dict(arguments))
        except ValidationError as exc:
            return field_errors(exc)
        return ()

    return validate
