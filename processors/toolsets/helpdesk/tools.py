"""The example ``helpdesk`` toolset: shipped, and used by the demo, the server and the tests."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Mapping
from functools import partial
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from toolledger.processors.groups import Compensation
from toolledger.processors.ledger import Found, Inconclusive, NotHappened, ReconcileOutcome
from toolledger.processors.tools.decorators import REPLAY_SENTENCES
from toolledger.processors.tools.manifest import (
    ApproverKind,
    EffectClass,
    HandlerResult,
    Impact,
    JobFailed,
    JobRef,
    JobRunning,
    JobSucceeded,
    PollAnswer,
    ReconcileHook,
    RetryPolicy,
    RiskTier,
    Tool,
    ToolContext,
    ToolDescription,
    ToolError,
)
from toolledger.processors.tools.registry import ToolRegistry
from toolledger.processors.toolsets.helpdesk.store import HelpdeskStore
from toolledger.schemas.errors import DOWNSTREAM_PREFIX, ErrorInfo

_STRICT = ConfigDict(strict=True, extra="forbid", frozen=True)


class CreateTicketArgs(BaseModel):
    model_config = _STRICT
    title: Annotated[str, Field(min_length=1, max_length=200)]
    body: Annotated[str, Field(max_length=10_000)] = ""
    priority: Literal["low", "normal", "high"] = "normal"


class TicketRef(BaseModel):
    model_config = _STRICT
    ticket_id: Annotated[str, Field(min_length=1, max_length=64)]


class ClosedTicket(BaseModel):
    ticket_id: str
    status: Literal["closed"]


class NoArgs(BaseModel):
    model_config = _STRICT


class TicketList(BaseModel):
    tickets: list[dict[str, str]]


class SendEmailArgs(BaseModel):
    model_config = _STRICT
    to: Annotated[str, Field(pattern=r"^[^@\s]{1,64}@[^@\s]+\.[^@\s]+$", max_length=254)]
    subject: Annotated[str, Field(min_length=1, max_length=200)]
    body: Annotated[str, Field(max_length=50_000)]


class EmailSent(BaseModel):
    message_id: str


class ChargeCardArgs(BaseModel):
    model_config = _STRICT
    customer_id: Annotated[str, Field(min_length=1, max_length=64)]
    amount_cents: Annotated[int, Field(ge=1, le=1_000_000)]
    currency: Literal["CNY", "USD", "EUR"]


class Charge(BaseModel):
    charge_id: str
    amount_cents: int
    currency: str


Fault = Literal["none", "transient_once", "final", "hang_after_effect", "slow", "retryable_always"]


class FlakyWriteArgs(BaseModel):
    model_config = _STRICT
    payload: Annotated[str, Field(max_length=10_000)]
    fault: Fault = "none"
    delay_ms: Annotated[int, Field(ge=0, le=30_000)] = 0


class Written(BaseModel):
    write_id: str


class ExportArgs(BaseModel):
    model_config = _STRICT
    # how long the export takes (a real job would take as long as it takes)
    delay_ms: Annotated[int, Field(ge=0, le=600_000)] = 0


class Exported(BaseModel):
    path: str
    tickets: int


def _new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:12]}"


class Helpdesk:
    """Handlers and reconcile hooks over one :class:`HelpdeskStore`."""

    def __init__(self, store: HelpdeskStore) -> None:
        self.store = store
        self.exports = store.path.parent / "exports"
        self._jobs: dict[str, asyncio.Task[None]] = {}

    def _export_file(self, job_id: str) -> Path:
        return self.exports / f"{job_id}.json"

    async def export_tickets(self, args: ExportArgs, ctx: ToolContext) -> JobRef:
        """Starts a background job that writes the tenant's tickets to a file; the call's key
        is recorded beside the job (the effect), so reconcile can find it."""
        job_id = self._effect(ctx, "job", args)
        self._jobs[job_id] = asyncio.get_running_loop().create_task(
            self._export(job_id, ctx.tenant_id, args.delay_ms)
        )
        return JobRef(job_id=job_id)

    async def _export(self, job_id: str, tenant_id: str, delay_ms: int) -> None:
        await asyncio.sleep(delay_ms / 1000)
        tickets = self.store.tickets(tenant_id)
        target = self._export_file(job_id)
        target.parent.mkdir(parents=True, exist_ok=True)
        partial_file = target.with_suffix(".part")
        partial_file.write_text(json.dumps(tickets))
        partial_file.replace(target)  # a finished export is whole, never half-written

    async def poll_export(self, job: JobRef, ctx: ToolContext) -> PollAnswer:
        target = self._export_file(job.job_id)
        if target.exists():
            count = len(json.loads(target.read_text()))
            return JobSucceeded(Exported(path=str(target), tickets=count))
        task = self._jobs.get(job.job_id)
        if task is not None and not task.done():
            return JobRunning()
        reason = "was cancelled" if task is not None and task.cancelled() else "is gone"
        return JobFailed(
            ErrorInfo(
                code=f"{DOWNSTREAM_PREFIX}EXPORT_LOST",
                message=f"The export job {reason} before it wrote its file.",
                retryable=False,
                suggested_action="Start a new export with a new idempotency key.",
            )
        )

    async def reconcile_export(self, ctx: ToolContext) -> ReconcileOutcome:
        """By call: no job started (it may start now), a finished export, or a job whose file
        is not there yet (ask again later)."""
        found = self.store.find(ctx.call_id)
        if found is None:
            return NotHappened()
        answer = await self.poll_export(JobRef(job_id=found[0]), ctx)
        if isinstance(answer, JobSucceeded):
            return Found(Exported.model_validate(answer.result).model_dump_json())
        return Inconclusive(f"the export job {found[0]} has not finished")

    async def cancel_export(self, job: JobRef, ctx: ToolContext) -> None:
        task = self._jobs.get(job.job_id)
        if task is not None:
            task.cancel()

    def _effect(
        self,
        ctx: ToolContext,
        prefix: str,
        data: BaseModel,
        ticket: tuple[str, str, str] | None = None,
    ) -> str:
        resource_id = _new_id(prefix)
        self.store.record(
            ctx.tenant_id,
            ctx.tool,
            ctx.idempotency_key,
            ctx.call_id,
            resource_id,
            data.model_dump_json(),
            ticket,
            deadline=ctx.deadline,
        )
        return resource_id

    def reconciler(self, result: type[BaseModel], field: str) -> ReconcileHook:
        async def reconcile(ctx: ToolContext) -> ReconcileOutcome:
            found = self.store.find(ctx.call_id)
            if found is None:
                return NotHappened()
            resource_id, data = found
            value = result.model_validate({**json.loads(data), field: resource_id})
            return Found(value.model_dump_json(), downstream_request_id=resource_id)

        return reconcile

    async def create_ticket(self, args: CreateTicketArgs, ctx: ToolContext) -> HandlerResult:
        ticket_id = self._effect(ctx, "T", NoArgs(), (args.title, args.body, args.priority))
        return HandlerResult(TicketRef(ticket_id=ticket_id), downstream_request_id=ticket_id)

    async def list_tickets(self, args: NoArgs, ctx: ToolContext) -> TicketList:
        return TicketList(tickets=self.store.tickets(ctx.tenant_id))

    async def close_ticket(self, args: TicketRef, ctx: ToolContext) -> ClosedTicket:
        if self.store.ticket(ctx.tenant_id, args.ticket_id) is None:
            raise ToolError(
                "TICKET_NOT_FOUND",
                f"No ticket {args.ticket_id} in this tenant.",
                retryable=False,
                suggested_action="List the tickets and pick one.",
            )
        self.store.close_ticket(
            ctx.tenant_id, args.ticket_id, ctx.idempotency_key, ctx.call_id, deadline=ctx.deadline
        )
        return ClosedTicket(ticket_id=args.ticket_id, status="closed")

    async def reconcile_close(self, ctx: ToolContext) -> ReconcileOutcome:
        found = self.store.find(ctx.call_id)
        if found is None:
            return NotHappened()
        return Found(ClosedTicket(ticket_id=found[0], status="closed").model_dump_json())

    async def send_email(self, args: SendEmailArgs, ctx: ToolContext) -> HandlerResult:
        message_id = self._effect(ctx, "M", NoArgs())
        return HandlerResult(EmailSent(message_id=message_id), downstream_request_id=message_id)

    async def charge_card(self, args: ChargeCardArgs, ctx: ToolContext) -> HandlerResult:
        data = Charge(charge_id="", amount_cents=args.amount_cents, currency=args.currency)
        charge_id = self._effect(ctx, "ch", data)
        return HandlerResult(
            data.model_copy(update={"charge_id": charge_id}), downstream_request_id=charge_id
        )

    async def flaky_write(self, args: FlakyWriteArgs, ctx: ToolContext) -> HandlerResult:
        if args.fault == "final":
            raise ToolError("REFUSED", "The downstream refused this write.", retryable=False)
        if args.fault == "retryable_always" or (
            args.fault == "transient_once" and ctx.attempt == 1
        ):
            raise ToolError("UNAVAILABLE", "The downstream is briefly unavailable.", retryable=True)
        if args.fault == "slow":
            await asyncio.sleep(args.delay_ms / 1000)
        write_id = self._effect(ctx, "W", NoArgs())
        if args.fault == "hang_after_effect":
            await asyncio.sleep(3600)  # the tool timeout cancels this: the outcome is UNKNOWN
        return HandlerResult(Written(write_id=write_id), downstream_request_id=write_id)


def _email_impact(args: SendEmailArgs) -> Impact:
    return Impact(
        summary=f"Send the email {args.subject!r} ({len(args.body)} characters) to a customer.",
        target="one recipient (address redacted)",
        scope="one email, outside the company",
        irreversible=True,
    )


USER_CONFIRMS_UP_TO_CENTS = 1_000


def charge_approver(args: ChargeCardArgs) -> ApproverKind:
    """Who approves a charge: the user confirms a small one themself (up to 10.00), an
    operator (four eyes) approves anything above."""
    return "user" if args.amount_cents <= USER_CONFIRMS_UP_TO_CENTS else "operator"


def _charge_impact(args: ChargeCardArgs) -> Impact:
    amount = f"{args.amount_cents / 100:.2f} {args.currency}"
    return Impact(
        summary=f"Charge {amount} to a customer's card on file.",
        target="one customer (id redacted)",
        scope="one card payment",
        cost=amount,
        irreversible=True,
    )


def _close_opened_ticket(_arguments: Mapping[str, Any], result: Any) -> dict[str, Any]:
    return {"ticket_id": result["ticket_id"]}


_REPLAY = (
    "Calling again with the same idempotency key and arguments returns the stored "
    "outcome without running it again; the same key with other arguments is refused."
)


def helpdesk_registry(
    store: HelpdeskStore,
    *,
    flaky_timeout_s: float = 5.0,
    timeout_s: float = 10.0,
    retry: RetryPolicy | None = None,
) -> ToolRegistry:
    desk = Helpdesk(store)
    mutation = partial(Tool, version="1", timeout_s=timeout_s, retry=retry or RetryPolicy())
    registry = ToolRegistry()
    for tool in (
        mutation(
            name="create_ticket",
            arguments=CreateTicketArgs,
            result=TicketRef,
            handler=desk.create_ticket,
            reconcile=desk.reconciler(TicketRef, "ticket_id"),
            # in a call group that fails, an opened ticket is closed again
            compensate=Compensation("close_ticket", _close_opened_ticket),
            description=ToolDescription(
                "Open a support ticket.",
                "A customer problem needs tracking.",
                "A ticket for the same problem is already open (list_tickets first).",
                "None.",
                _REPLAY,
            ),
        ),
        Tool(
            name="list_tickets",
            version="1",
            arguments=NoArgs,
            result=TicketList,
            handler=desk.list_tickets,
            effect=EffectClass.READ_ONLY,
            timeout_s=timeout_s,
            description=ToolDescription(
                "List every ticket of the caller's tenant.",
                "Before opening or closing a ticket.",
                "Never needed to confirm a call made with an idempotency key.",
                "None.",
                "Read-only: needs no idempotency key and is never replayed.",
            ),
        ),
        mutation(
            name="close_ticket",
            arguments=TicketRef,
            result=ClosedTicket,
            handler=desk.close_ticket,
            reconcile=desk.reconcile_close,
            description=ToolDescription(
                "Close a ticket.",
                "The customer's problem is solved.",
                "The ticket belongs to another customer or is still being worked on.",
                "The ticket exists in this tenant.",
                _REPLAY,
            ),
        ),
        mutation(
            name="send_email",
            arguments=SendEmailArgs,
            result=EmailSent,
            handler=desk.send_email,
            risk=RiskTier.HIGH,
            # the user the agent writes for confirms the exact email (or an operator does)
            approval="user",
            describe_impact=_email_impact,
            reconcile=desk.reconciler(EmailSent, "message_id"),
            redact_fields=frozenset({"to", "body"}),
            description=ToolDescription(
                "Send an email to a customer.",
                "The customer must be told something in writing.",
                "Internal notes; anything that can go in the ticket instead.",
                "A human approved this exact email (high risk).",
                _REPLAY,
            ),
        ),
        mutation(
            name="charge_card",
            arguments=ChargeCardArgs,
            result=Charge,
            handler=desk.charge_card,
            risk=RiskTier.IRREVERSIBLE,
            approval=charge_approver,
            describe_impact=_charge_impact,
            reconcile=desk.reconciler(Charge, "charge_id"),
            redact_fields=frozenset({"customer_id"}),
            description=ToolDescription(
                "Charge a customer's card on file.",
                "An agreed, approved payment is due.",
                "Refunds, disputed amounts, or anything not approved by a human.",
                "A human approved this exact amount and currency (irreversible).",
                _REPLAY,
            ),
        ),
        mutation(
            name="flaky_write",
            arguments=FlakyWriteArgs,
            result=Written,
            handler=desk.flaky_write,
            timeout_s=flaky_timeout_s,
            reconcile=desk.reconciler(Written, "write_id"),
            description=ToolDescription(
                "A test tool that writes a payload and can inject faults.",
                "Exercising retries, final failures, timeouts and reconciliation.",
                "Real work.",
                "None.",
                _REPLAY,
            ),
        ),
        Tool(
            name="export_tickets",
            version="1",
            arguments=ExportArgs,
            result=Exported,
            handler=desk.export_tickets,
            effect=EffectClass.LONG_RUNNING,
            timeout_s=timeout_s,
            poll=desk.poll_export,
            cancel=desk.cancel_export,
            job_timeout_s=600.0,
            reconcile=desk.reconcile_export,
            description=ToolDescription(
                "Export every ticket of the caller's tenant to a file, as a background job.",
                "A report or a backup of the tickets is needed.",
                "Looking at a few tickets (list_tickets answers at once).",
                "None.",
                REPLAY_SENTENCES[EffectClass.LONG_RUNNING],
            ),
        ),
    ):
        registry.register(tool)
    return registry
