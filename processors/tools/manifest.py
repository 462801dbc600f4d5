"""What a tool must declare before it may run automatically.

See docs/architecture.md#tools-policy-and-the-executor-stages.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from toolledger.processors.groups.facts import Compensation
from toolledger.processors.ledger.commands import Policy, ReconcileOutcome
from toolledger.schemas.canonical import CanonicalJsonError, args_digest
from toolledger.schemas.errors import DOWNSTREAM_PREFIX, ErrorInfo
from toolledger.schemas.keys import KeyScope


class ToolRegistrationError(ValueError):
    """A tool that is not ready to run unattended; the message says what is missing."""


class EffectClass(StrEnum):
    READ_ONLY = "read_only"
    MUTATION = "mutation"
    LONG_RUNNING = "long_running"


class RiskTier(StrEnum):
    LOW = "low"
    HIGH = "high"
    IRREVERSIBLE = "irreversible"


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    max_attempts: int = 3  # per execution round
    max_rounds: int = 3  # per call key
    backoff_base_s: float = 0.1
    backoff_cap_s: float = 2.0

    def backoff_s(self, round_attempt: int, jitter: float) -> float:
        """Full jitter: ``uniform(0, min(cap, base * 2**n))``; ``jitter`` is in [0, 1)."""
        return float(
            jitter * min(self.backoff_cap_s, self.backoff_base_s * 2 ** (round_attempt - 2))
        )


@dataclass(frozen=True, slots=True)
class Impact:
    """What a human approver is shown: what will happen, to what, how far, at what cost.

    Built from validated arguments by the tool's ``describe_impact``; it must not repeat the
    values of fields the manifest redacts (the approval request is in the audit trail)."""

    summary: str
    target: str | None = None
    scope: str = "one resource"
    cost: str | None = None
    irreversible: bool = False
    # who decides: "operator" (four eyes: an operator other than the caller) or "user" (the
    # principal the call runs for confirms its own agent's action); set by the tool's rule
    approver_kind: ApproverKind = "operator"

    def to_json(self) -> dict[str, Any]:
        return {
            "summary": self.summary,
            "target": self.target,
            "scope": self.scope,
            "cost": self.cost,
            "irreversible": self.irreversible,
            "approver_kind": self.approver_kind,
        }


ApproverKind = Literal["user", "operator"]
APPROVER_KINDS: tuple[ApproverKind, ...] = ("user", "operator")
# validated arguments -> who must approve: "user" or "operator"; True: an operator; False or
# None: nobody (the call goes ahead). A tool's ``approval`` is such a rule or one of the kinds.
ApprovalRule = Callable[[Any], "bool | ApproverKind | None"]


def always(_arguments: Any) -> bool:
    return True


def never(_arguments: Any) -> bool:
    return False


@dataclass(frozen=True, slots=True)
class ToolDescription:
    summary: str
    when_to_use: str
    when_not_to_use: str
    preconditions: str
    replay_behaviour: str

    def text(self) -> str:
        """One line per part; a part left empty (a decorated tool's docstring may omit "Do not
        use when:" or "Preconditions:") is left out."""
        lines = [
            self.summary,
            f"Use when: {self.when_to_use}",
            f"Do not use when: {self.when_not_to_use}" if self.when_not_to_use else "",
            f"Preconditions: {self.preconditions}" if self.preconditions else "",
            f"Replay: {self.replay_behaviour}",
        ]
        return "\n".join(line for line in lines if line)


@dataclass(frozen=True, slots=True)
class ToolContext:
    """What a handler gets besides its validated arguments: trusted, never model-supplied."""

    tenant_id: str
    principal: str | None
    tool: str
    call_key: str
    # names the call whatever the key scope: forward it downstream so the downstream can dedupe
    # and be queried (under "tenant+principal" two principals' calls may share a key)
    call_id: str
    idempotency_key: str  # the caller's key (under "tenant" scope it names the call too)
    attempt: int
    deadline: datetime


class ToolError(Exception):
    """Raised by a handler when the downstream answered with a failure.

    Raising it states that the failure is known (retryable or not); any other exception
    leaves the outcome UNKNOWN, because the effect may have happened before it was raised.
    """

    def __init__(
        self, code: str, message: str, *, retryable: bool, suggested_action: str = ""
    ) -> None:
        super().__init__(message)
        code = code if code.startswith(DOWNSTREAM_PREFIX) else DOWNSTREAM_PREFIX + code
        self.info = ErrorInfo(
            code=code,
            message=message,
            retryable=retryable,
            suggested_action=suggested_action
            or ("Retry with the same key." if retryable else "Do not retry this call."),
        )


@dataclass(frozen=True, slots=True)
class HandlerResult:
    value: BaseModel | Mapping[str, Any]
    downstream_request_id: str | None = None


Handler = Callable[[Any, ToolContext], Awaitable[BaseModel | HandlerResult]]
ReconcileHook = Callable[[ToolContext], Awaitable[ReconcileOutcome]]


class JobRef(BaseModel):
    """What a ``long_running`` tool's handler returns: the reference of the job it started
    (its ``poll`` and ``cancel`` get it back)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    job_id: str = Field(min_length=1, max_length=255)
    status: Literal["running"] = "running"
    progress: float | None = Field(default=None, ge=0.0, le=1.0)


@dataclass(frozen=True, slots=True)
class JobRunning:
    """A poll's answer: the job still runs."""

    progress: float | None = None


@dataclass(frozen=True, slots=True)
class JobSucceeded:
    """A poll's answer: the job has finished with this result (checked against the tool's
    result model)."""

    result: BaseModel | Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class JobFailed:
    """A poll's answer: the job has failed for good (or, ``retryable``, may be started again
    by a call with the same key)."""

    error: ErrorInfo


PollAnswer = JobRunning | JobSucceeded | JobFailed
PollHook = Callable[[JobRef, ToolContext], Awaitable[PollAnswer]]
CancelHook = Callable[[JobRef, ToolContext], Awaitable[None]]


@dataclass(frozen=True)
class Tool:
    name: str
    version: str
    arguments: type[BaseModel]
    result: type[BaseModel]
    handler: Handler
    description: ToolDescription
    effect: EffectClass = EffectClass.MUTATION
    risk: RiskTier = RiskTier.LOW
    timeout_s: float = 10.0
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    reconcile: ReconcileHook | None = None
    compensation: str | None = None  # the compensating tool's name, shown in the manifest
    # how a completed call is undone when its call group fails: a tool and a function from the
    # call's (arguments, result) to the compensating call's arguments
    compensate: Compensation | None = None
    redact_fields: frozenset[str] = frozenset()
    scopes: frozenset[str] = frozenset({"tools:call"})
    open_world: bool = True  # talks to a system outside the ledger (MCP's openWorldHint)
    # who approves a call: "user", "operator", or a rule choosing by the arguments (e.g. the
    # user below an amount, an operator above it). None: an operator approves every high and
    # irreversible mutation, low ones need nobody.
    approval: ApprovalRule | ApproverKind | None = None
    # how long a finished call's key is kept: a timedelta or "forever"; None: the ledger's
    # default (ToolRegistry.default_key_retention, 24 hours unless --key-retention says)
    key_retention: timedelta | str | None = None  # a duration ("24h", "PT24H") or "forever"
    # whose keys a key names a call among: "tenant" or "tenant+principal"; None: the ledger's
    # (ToolRegistry.default_key_scope, recorded with the ledger; --key-scope)
    key_scope: KeyScope | str | None = None
    describe_impact: Callable[[Any], Impact] | None = None
    # long_running only: how the executor asks about the job, stops it, and how long it may
    # run before its outcome counts as UNKNOWN (then resolved by poll, never by a restart)
    poll: PollHook | None = None
    cancel: CancelHook | None = None
    job_timeout_s: float | None = None

    def approver_for(self, arguments: BaseModel) -> ApproverKind | None:
        """Who must approve a call with these arguments; None: nobody. A rule's answer that
        is neither a kind nor a bool raises (the pipeline then asks an operator)."""
        if not self.keyed:
            return None
        rule = self.approval
        if rule is None:
            return None if self.risk is RiskTier.LOW else "operator"
        if isinstance(rule, str):
            return rule
        answer = rule(arguments)
        if answer is True:
            return "operator"
        if answer is False or answer is None:
            return None
        if answer in APPROVER_KINDS:
            return answer
        raise ValueError(f"{self.name}'s approval rule answered {answer!r}")

    def needs_approval(self, arguments: BaseModel) -> bool:
        return self.approver_for(arguments) is not None

    def _approval_rule_name(self) -> str:
        """The manifest's ``approval``: "none", "user", "operator" or "by arguments"."""
        if not self.keyed or self.approval is never:
            return "none"
        if self.approval is None:
            return "none" if self.risk is RiskTier.LOW else "operator"
        if isinstance(self.approval, str):
            return self.approval
        return "operator" if self.approval is always else "by arguments"

    def impact(self, arguments: BaseModel) -> Impact:
        """What the approver is shown, with who approves (the tool's rule decides that, never
        its ``describe_impact``)."""
        if self.describe_impact is not None:
            described = self.describe_impact(arguments)
        else:
            described = Impact(
                summary=f"Run {self.name} (version {self.version}).",
                irreversible=self.risk is RiskTier.IRREVERSIBLE,
            )
        return replace(described, approver_kind=self.approver_for(arguments) or "operator")

    def digest_of(self, raw: Any) -> str | None:
        """The args digest the executor computes for ``raw`` arguments; ``None`` if they are
        invalid (the executor refuses them). Front doors use it to compare with the ledger."""
        try:
            return args_digest(self.arguments.model_validate(raw).model_dump(mode="json"))
        except (ValidationError, CanonicalJsonError):
            return None

    @property
    def keyed(self) -> bool:
        return self.effect is not EffectClass.READ_ONLY

    @property
    def policy(self) -> Policy:
        return Policy(
            max_attempts=self.retry.max_attempts,
            max_rounds=self.retry.max_rounds,
            has_reconcile=self.reconcile is not None,
            long_running=self.effect is EffectClass.LONG_RUNNING,
            job_timeout_s=self.job_timeout_s,
        )

    def manifest(self) -> dict[str, Any]:
        """The public manifest: what ``GET /v1/tools`` and the MCP listing show."""
        return {
            "name": self.name,
            "version": self.version,
            "effect": self.effect.value,
            "risk": self.risk.value,
            "timeout_s": self.timeout_s,
            "retry": {
                "max_attempts": self.retry.max_attempts,
                "max_rounds": self.retry.max_rounds,
                "backoff_base_s": self.retry.backoff_base_s,
                "backoff_cap_s": self.retry.backoff_cap_s,
            },
            "open_world": self.open_world,
            "reconcile": self.reconcile is not None,
            "compensation": self.compensate.tool if self.compensate else self.compensation,
            **(
                {
                    "job": {
                        "poll": self.poll is not None,
                        "cancel": self.cancel is not None,
                        "job_timeout_s": self.job_timeout_s,
                    }
                }
                if self.effect is EffectClass.LONG_RUNNING
                else {}
            ),
            "idempotency_key_required": self.keyed,
            "redact_fields": sorted(self.redact_fields),
            "scopes": sorted(self.scopes),
            "approval": self._approval_rule_name(),
            "description": self.description.text(),
            "arguments_schema": self.arguments.model_json_schema(),
            "result_schema": self.result.model_json_schema(),
        }
