"""Long-running tools on every backend: the key is kept beside the job. A retry returns the
same job and starts no other; the sweeper's poll and the job's own report race and exactly one
finishes the call; a cancel ends it CANCELLED; a job past its timeout is UNKNOWN and the poll
then resolves it (never a blind restart)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from tests.contract.harness import ACME, Harness, eventually
from toolledger.processors.tools.manifest import (
    EffectClass,
    JobRef,
    JobRunning,
    JobSucceeded,
    PollAnswer,
    Tool,
    ToolContext,
    ToolDescription,
)
from toolledger.producers.client import CallResult, job_record
from toolledger.schemas.events import ToolCallRejected, ToolCallSucceeded
from toolledger.schemas.keys import DEFAULT_KEY_SCOPE, CallKey
from toolledger.schemas.status import CallStatus


class Export(BaseModel):
    rows: int


class Exported(BaseModel):
    rows: int
    by: str


@dataclass
class Jobs:
    """The downstream's job service: started jobs, and what their poll answers."""

    started: list[str] = field(default_factory=list)
    done: dict[str, Exported] = field(default_factory=dict)
    polls: int = 0
    cancelled: list[str] = field(default_factory=list)


def _job_tool(ledger: Harness, jobs: Jobs, name: str, *, timeout_s: float | None = None) -> None:
    async def start(args: Export, ctx: ToolContext) -> JobRef:
        job_id = f"job-{len(jobs.started) + 1}"
        jobs.started.append(job_id)
        return JobRef(job_id=job_id)

    async def poll(job: JobRef, ctx: ToolContext) -> PollAnswer:
        jobs.polls += 1
        found = jobs.done.get(job.job_id)
        return JobRunning(progress=0.5) if found is None else JobSucceeded(found)

    async def cancel(job: JobRef, ctx: ToolContext) -> None:
        jobs.cancelled.append(job.job_id)

    ledger.registry.register(
        Tool(
            name=name,
            version="1",
            arguments=Export,
            result=Exported,
            handler=start,
            effect=EffectClass.LONG_RUNNING,
            poll=poll,
            cancel=cancel,
            job_timeout_s=timeout_s,
            description=ToolDescription("export", "tests", "never", "none", "same job"),
        )
    )


async def _call(ledger: Harness, tool: str, key: str, wait: float = 2.0) -> CallResult:
    return await ledger.client.call(tool, {"rows": 3}, idempotency_key=key, context=ACME, wait=wait)


async def _settled(
    ledger: Harness, tool: str, key: str, *, unresolved: frozenset[CallStatus] = frozenset()
) -> CallResult:
    """The call's outcome once it is no longer PENDING (nor in ``unresolved``)."""
    answer: list[CallResult] = []

    async def done() -> bool:
        answer[:] = [await _call(ledger, tool, key, wait=0.5)]
        return answer[0].status not in {CallStatus.PENDING, *unresolved}

    await eventually(done, timeout_s=30)
    return answer[0]


async def test_a_retry_returns_the_same_job_and_starts_no_other(ledger: Harness) -> None:
    jobs = Jobs()
    _job_tool(ledger, jobs, "export_same")
    first = await _call(ledger, "export_same", "job-k1")
    assert first.status is CallStatus.PENDING and first.job is not None, first
    assert first.to_json()["job"]["id"] == first.job["id"]  # what a model or MCP client reads
    again = await _call(ledger, "export_same", "job-k1", wait=0.2)
    assert again.status is CallStatus.PENDING and again.replayed
    assert again.job is not None and again.job["id"] == first.job["id"]
    assert jobs.started == ["job-1"]
    jobs.done["job-1"] = Exported(rows=3, by="poll")
    final = await _settled(ledger, "export_same", "job-k1")
    assert final.ok and final.result == {"rows": 3, "by": "poll"}
    assert jobs.started == ["job-1"]


def _call_key(tool: str, key: str) -> str:
    """ACME's call key of ``tool`` under ``key``, in a new ledger's scope (its principal's)."""
    return str(CallKey.scoped(DEFAULT_KEY_SCOPE, ACME.tenant_id, ACME.principal, tool, key))


async def test_poll_and_report_race_and_exactly_one_wins(ledger: Harness) -> None:
    jobs = Jobs()
    _job_tool(ledger, jobs, "export_race")
    first = await _call(ledger, "export_race", "job-k2")
    assert first.job is not None
    # the job finishes: its poll would say "by poll", its own report says "by report"
    jobs.done["job-1"] = Exported(rows=3, by="poll")
    report = job_record(
        "report",
        context=ACME,
        call_key=_call_key("export_race", "job-k2"),
        tool="export_race",
        idempotency_key="job-k2",
        status="succeeded",
        result={"rows": 3, "by": "report"},
    )
    answer = await ledger.client.command(report)
    final = await _settled(ledger, "export_race", "job-k2")
    assert final.ok and final.result is not None and final.result["by"] in ("poll", "report")
    if final.result["by"] == "report":
        assert isinstance(answer, ToolCallSucceeded)
    else:  # the poll came first: the report was refused as late
        assert isinstance(answer, ToolCallRejected) and answer.error.code == "JOB_FINISHED"
    events = await ledger.event_rows()
    mine = [e for e in events if e["idempotency_key"] == "job-k2"]
    assert [e["event_type"] for e in mine].count("ToolCallSucceeded") == 1
    late = await ledger.client.command(
        job_record(
            "cancel",
            context=ACME,
            call_key=_call_key("export_race", "job-k2"),
            tool="export_race",
            idempotency_key="job-k2",
        )
    )
    assert isinstance(late, ToolCallRejected) and late.error.code == "JOB_FINISHED"


async def test_a_cancel_ends_the_call_cancelled(ledger: Harness) -> None:
    jobs = Jobs()
    _job_tool(ledger, jobs, "export_cancel")
    first = await _call(ledger, "export_cancel", "job-k3")
    assert first.job is not None
    await ledger.client.command(
        job_record(
            "cancel",
            context=ACME,
            call_key=_call_key("export_cancel", "job-k3"),
            tool="export_cancel",
            idempotency_key="job-k3",
        )
    )
    final = await _settled(ledger, "export_cancel", "job-k3")
    assert final.status is CallStatus.FAILED_FINAL and final.error is not None
    assert final.error.code == "CANCELLED" and jobs.cancelled == ["job-1"]
    assert jobs.started == ["job-1"]


async def test_a_job_past_its_timeout_is_unknown_then_resolved_by_poll(ledger: Harness) -> None:
    jobs = Jobs()
    _job_tool(ledger, jobs, "export_slow", timeout_s=0.5)
    first = await _call(ledger, "export_slow", "job-k4", wait=0.2)
    assert first.job is not None
    seen: list[Any] = []

    async def unknown() -> bool:
        row = await ledger.call_row(first.call_id)
        seen[:] = [row]
        return row is not None and row["status"] == "UNKNOWN"

    await eventually(unknown, timeout_s=20)
    jobs.done["job-1"] = Exported(rows=3, by="poll")
    polls = jobs.polls
    final = await _settled(
        ledger, "export_slow", "job-k4", unresolved=frozenset({CallStatus.UNKNOWN})
    )
    assert final.ok and final.result == {"rows": 3, "by": "poll"}, final
    assert jobs.polls > polls and jobs.started == ["job-1"]  # resolved by asking, not re-run
