"""Who may decide an approval request (producers/approval_rules.py), as a table: a ``user``
request is confirmed by the principal it runs for only with their own credential (the scope
``approvals:confirm``), never with the token that made the call; four eyes for an operator's;
the requester of a user request may still withdraw it; an answer given in person (MCP
elicitation) is the user's confirmation."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from toolledger.producers.approval_rules import (
    CONFIRM,
    approve_refusal,
    confirmed_in_person,
    deny_refusal,
)
from toolledger.producers.client import TrustedContext
from toolledger.schemas.calls import ApprovalView

NOW = datetime(2026, 1, 1, tzinfo=UTC)
AGENT = TrustedContext("acme", "alice")  # the token that made the call: tools:call
ALICE = TrustedContext("acme", "alice", frozenset({CONFIRM}))  # alice's own credential
CAROL = TrustedContext("acme", "carol", frozenset({"tools:call", CONFIRM}))
OLGA = TrustedContext("acme", "olga", frozenset({"operator"}))
GUS = TrustedContext("globex", "gus", frozenset({"operator"}))
ROOT = TrustedContext("platform", "root", frozenset({"operator", "operator:global"}))


def request(kind: str, requested_by: str = "alice") -> ApprovalView:
    return ApprovalView(
        approval_id="apr_1",
        call_key="k",
        call_id="call_1",
        tenant_id="acme",
        tool="send_email",
        idempotency_key="key-1",
        args_digest="sha256:a",
        arguments={},
        impact={"approver_kind": kind},
        status="pending",
        requested_by=requested_by,
        requested_at=NOW,
        expires_at=NOW + timedelta(hours=1),
    )


@pytest.mark.parametrize(
    ("kind", "decider", "approves", "denies"),
    [
        ("user", AGENT, False, True),  # it asked: it may withdraw, not confirm
        ("user", ALICE, True, True),
        ("user", CAROL, False, False),  # the scope is no one else's key to alice's requests
        ("user", OLGA, True, True),
        ("user", GUS, False, False),
        ("user", ROOT, True, True),
        ("operator", AGENT, False, False),
        ("operator", ALICE, False, False),
        ("operator", OLGA, True, True),
        ("operator", TrustedContext("acme", "alice", frozenset({"operator"})), False, True),
    ],
    ids=lambda v: v.principal if isinstance(v, TrustedContext) else str(v),
)
def test_who_decides(kind: str, decider: TrustedContext, approves: bool, denies: bool) -> None:
    view = request(kind)
    assert (approve_refusal(decider, view) is None) is approves
    assert (deny_refusal(decider, view) is None) is denies


def test_the_agents_token_is_told_which_credential_confirms() -> None:
    refusal = approve_refusal(AGENT, request("user"))
    assert refusal is not None and refusal.code == "FORBIDDEN"
    assert CONFIRM in refusal.message and CONFIRM in refusal.suggested_action


def test_an_answer_given_in_person_confirms_and_carries_no_further() -> None:
    in_person = confirmed_in_person(AGENT)
    assert in_person.scopes == AGENT.scopes | {CONFIRM}
    assert approve_refusal(in_person, request("user")) is None
    assert approve_refusal(in_person, request("operator")) is not None  # not four eyes
    assert approve_refusal(confirmed_in_person(CAROL), request("user")) is not None
