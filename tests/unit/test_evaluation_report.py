"""The evaluation report (schemas/evaluation.py) computed from given rows: each check and each
metric, and the three renderings."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

from toolledger.schemas.evaluation import (
    AuditRecord,
    CallRecord,
    EvaluationFacts,
    render,
    report_of,
)
from toolledger.schemas.groups import GroupStepView, GroupView

T0 = datetime(2026, 12, 5, 9, 0, tzinfo=UTC)
RUN = "run-1"


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def rec(
    seq: int, kind: str, call: str, tool: str = "create_ticket", key: str = "k", **kw: Any
) -> AuditRecord:
    fields: dict[str, Any] = {
        "seq": seq,
        "event_type": kind,
        "occurred_at": at(seq),
        "tenant_id": "acme",
        "tool": tool,
        "call_id": call,
        "idempotency_key": key,
        "intent_id": kw.pop("intent", f"i-{call}"),
        "run_id": RUN,
        "args_digest": kw.pop("digest", "d"),
    }
    return AuditRecord(**(fields | kw))


def call(
    call_id: str,
    status: str,
    tool: str = "create_ticket",
    key: str = "k",
    digest: str = "d",
    created: float = 0,
    updated: float = 0,
) -> CallRecord:
    return CallRecord(call_id, "acme", tool, key, digest, status, 1, RUN, at(created), at(updated))


def test_every_check_and_metric_from_given_rows() -> None:
    records = [
        rec(1, "ToolCallStarted", "c1", key="k1"),
        rec(2, "ToolCallSucceeded", "c1", key="k1"),
        rec(3, "ToolCallReplayed", "c1", key="k1", intent="i-c1-again"),
        rec(4, "ToolCallStarted", "c2", key="k2"),
        rec(5, "ToolCallSucceeded", "c2", key="k2"),
        rec(
            6,
            "ToolCallRejected",
            "c3",
            key="k3",
            error_code="VALIDATION_FAILED",
            field_errors=(("title", "string_too_short"), ("due", "date_from_datetime_parsing")),
        ),
        rec(
            7,
            "ToolCallRejected",
            "c3b",
            key="k3b",
            error_code="VALIDATION_FAILED",
            field_errors=(("title", "string_too_short"),),
        ),
        rec(8, "ToolCallStarted", "c4", tool="flaky_write", key="k4"),
        rec(
            9,
            "ToolCallFailed",
            "c4",
            tool="flaky_write",
            key="k4",
            error_code="UNAVAILABLE",
            disposition="RETRY",
        ),
        rec(10, "ToolCallStarted", "c4", tool="flaky_write", key="k4"),
        rec(11, "ToolCallSucceeded", "c4", tool="flaky_write", key="k4"),
        rec(12, "ToolCallStarted", "c5", tool="flaky_write", key="k5"),
        rec(
            13,
            "ToolCallFailed",
            "c5",
            tool="flaky_write",
            key="k5",
            error_code="REFUSED",
            disposition="FINAL",
        ),
        rec(14, "ToolCallStarted", "c6", tool="flaky_write", key="k6"),
        rec(15, "ToolCallSucceeded", "c6", tool="flaky_write", key="k6"),
        rec(16, "ToolCallSucceeded", "r1", tool="list_tickets", key=""),  # a read
        rec(17, "ApprovalRequested", "c7", tool="charge_card", key="k7", approval_id="ap-1"),
        rec(
            18,
            "ApprovalDenied",
            "c7",
            tool="charge_card",
            key="k7",
            approval_id="ap-1",
            approver="op",
            reason="too much",
            intent="i-deny",
        ),
        rec(19, "ToolCallRejected", "c8", key="k8", error_code="FORBIDDEN"),
        rec(20, "ToolCallRejected", "c9", key="k9", error_code="TOOL_DISABLED"),
        rec(
            21,
            "ToolCallRejected",
            "c10",
            tool="flaky_write",
            key="k10",
            error_code="RETRY_LIMIT_EXCEEDED",
        ),
        rec(22, "ToolCallStarted", "c11", tool="close_ticket", key="k11"),
        rec(23, "ToolCallOutcomeUnknown", "c11", tool="close_ticket", key="k11"),
    ]
    calls = [
        call("c1", "SUCCEEDED", key="k1", digest="same", created=1, updated=2),
        call("c2", "SUCCEEDED", key="k2", digest="same", created=4, updated=5),
        call("c4", "SUCCEEDED", tool="flaky_write", key="k4", digest="x4", created=8, updated=11),
        call(
            "c5", "FAILED_FINAL", tool="flaky_write", key="k5", digest="x5", created=12, updated=13
        ),
        call("c6", "SUCCEEDED", tool="flaky_write", key="k6", digest="x6", created=14, updated=15),
        call(
            "c11", "UNKNOWN", tool="close_ticket", key="k11", digest="x11", created=22, updated=23
        ),
    ]
    report = report_of(EvaluationFacts(records, calls), tenant_id="acme", run_id=RUN)

    m = report.metrics
    assert (m.calls, m.finished, m.succeeded, m.unknown) == (7, 7, 5, 1)  # six keyed, one read
    assert m.intents == len({r.intent_id for r in records if r.event_type != "ApprovalDenied"})
    assert (m.validation_failures, m.duplicates) == (2, 1)
    assert (m.approvals_granted, m.approvals_denied, m.human_rejection_rate) == (0, 1, 1.0)
    assert m.success_rate == 5 / 7 and m.average_calls_per_run == 7.0
    assert m.validation_failure_rate == 2 / m.intents and m.duplicate_rate == 1 / m.intents

    assert report.argument_refusals == [
        {
            "tool": "create_ticket",
            "code": "VALIDATION_FAILED",
            "field": "due",
            "error": "date_from_datetime_parsing",
            "refusals": 1,
        },
        {
            "tool": "create_ticket",
            "code": "VALIDATION_FAILED",
            "field": "title",
            "error": "string_too_short",
            "refusals": 2,
        },
    ]
    assert report.repeated_calls == [
        {
            "tenant_id": "acme",
            "tool": "create_ticket",
            "args_digest": "same",
            "keys": ["k1", "k2"],
            "call_ids": ["c1", "c2"],
        }
    ]
    assert [
        (r["call_id"], r["recovered_by"], r["how"], r["failed_with"]) for r in report.recoveries
    ] == [
        ("c4", "c4", "retried in the call", "UNAVAILABLE"),
        ("c5", "c6", "a later call", "REFUSED"),
    ]
    assert [r["code"] for r in report.budget_refusals] == ["RETRY_LIMIT_EXCEEDED"]
    assert [r["code"] for r in report.permission_refusals] == ["FORBIDDEN", "TOOL_DISABLED"]
    assert report.human_rejections == [
        {
            "tool": "charge_card",
            "call_id": "c7",
            "approval_id": "ap-1",
            "approver": "op",
            "reason": "too much",
            "at": at(18).isoformat(),
        }
    ]
    assert report.unknowns == [{"tool": "close_ticket", "call_id": "c11", "idempotency_key": "k11"}]
    assert report.order == [] and report.groups_checked == 0


def _group(steps: list[GroupStepView]) -> GroupView:
    return GroupView(
        group_id="grp_1",
        status="SUCCEEDED",
        run_id=RUN,
        on_failure="stop",
        idempotency_key="g",
        created_at=T0,
        updated_at=T0,
        steps=steps,
    )


def test_order_against_the_groups_dependencies() -> None:
    steps = [
        GroupStepView(
            id="open", tool="create_ticket", status="SUCCEEDED", call_id="c1", depends_on=[]
        ),
        GroupStepView(
            id="close", tool="close_ticket", status="SUCCEEDED", call_id="c2", depends_on=["open"]
        ),
        GroupStepView(
            id="mail", tool="send_email", status="SUCCEEDED", call_id="c3", depends_on=["open"]
        ),
        GroupStepView(
            id="bill", tool="charge_card", status="SUCCEEDED", call_id="c4", depends_on=["mail"]
        ),
        GroupStepView(
            id="later", tool="charge_card", status="WAITING", call_id=None, depends_on=["bill"]
        ),
    ]
    records = [
        rec(1, "ToolCallStarted", "c1"),
        rec(2, "ToolCallStarted", "c3"),  # before open succeeded: out of order
        rec(3, "ToolCallSucceeded", "c1"),
        rec(4, "ToolCallStarted", "c2"),  # after: in order
        rec(5, "ToolCallSucceeded", "c2"),
        rec(6, "ToolCallOutcomeUnknown", "c3"),
        rec(7, "ToolCallReconciled", "c3", resolution="NOT_HAPPENED"),  # not a success
        rec(8, "ToolCallStarted", "c4"),  # its dependency never succeeded
    ]
    report = report_of(EvaluationFacts(records, [], [_group(steps)]), tenant_id=None, run_id=RUN)
    assert report.groups_checked == 1
    assert [(v["step"], v["depends_on"], v["problem"]) for v in report.order] == [
        ("mail", "open", "started before its dependency succeeded"),
        ("bill", "mail", "started although its dependency never succeeded"),
    ]


def test_the_renderings_carry_the_same_report_and_escape_what_they_show() -> None:
    records = [
        rec(1, "ApprovalDenied", "c1", approval_id="ap", approver="<b>op</b>", reason="a|b\nc"),
    ]
    report = report_of(EvaluationFacts(records, []), tenant_id="acme", run_id="run <x>")
    as_json = json.loads(render(report, "json"))
    assert as_json == json.loads(json.dumps(report.to_json()))
    assert as_json["scope"] == {"tenant_id": "acme", "run_id": "run <x>"}
    assert as_json["checks"]["human_rejections"][0]["approver"] == "<b>op</b>"
    markdown = render(report, "md")
    assert markdown.startswith("# Evaluation of run run <x>\n")
    assert "| <b>op</b> | a\\|b c |" in markdown  # a cell stays one cell
    page = render(report, "html")
    assert "<b>op</b>" not in page and "&lt;b&gt;op&lt;/b&gt;" in page
    assert "<title>Evaluation of run run &lt;x&gt;</title>" in page
    assert page.count("<h2>") == 9  # the metrics and the eight checks


def test_a_window_report_names_its_window_and_counts_runs() -> None:
    calls = [
        call("c1", "SUCCEEDED"),
        CallRecord("c2", "acme", "t", "k2", "d2", "PENDING", 1, "run-2", T0, T0),
        CallRecord("c3", "acme", "t", "k3", "d3", "SUCCEEDED", 1, None, T0, T0),
    ]
    report = report_of(
        EvaluationFacts([], calls), tenant_id=None, since=T0, until=T0 + timedelta(days=1)
    )
    assert report.to_json()["scope"] == {
        "tenant_id": None,
        "since": T0.isoformat(),
        "until": (T0 + timedelta(days=1)).isoformat(),
    }
    m = report.metrics
    assert (m.calls, m.finished, m.runs, m.calls_in_runs) == (3, 2, 2, 2)
    assert m.average_calls_per_run == 1.0 and m.success_rate == 1.0
    assert m.validation_failure_rate is None  # no intents in the window
