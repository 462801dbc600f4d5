"""The pure core's governance: the approval gate, the kill switch, and their folds.

Each rule is a given (approval book, switches) / when (a command) / then (events) case; the
executor invariant for approvals is that a token is consumed in the same decision as the
Started event it allows, and only for the call, arguments and time it was granted for.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from toolledger.processors.ledger import (
    ApprovalGate,
    CallContext,
    CallState,
    ChangeSwitch,
    DecideApproval,
    Execute,
    Gate,
    NotHappened,
    Policy,
    ReconcileFinished,
    Submit,
    decide,
    fold,
)
from toolledger.processors.ledger.governance import (
    ApprovalBook,
    ApprovalStatus,
    Switch,
    disabled_by,
    evolve_approvals,
    newer,
    switch_key,
    switch_of,
)
from toolledger.schemas.calls import ANY
from toolledger.schemas.errors import ErrorCode, ErrorInfo
from toolledger.schemas.events import (
    ApprovalConsumed,
    ApprovalDenied,
    ApprovalGranted,
    ApprovalRequested,
    Event,
    FailureDisposition,
    ToolCallFailed,
    ToolCallRejected,
    ToolCallStarted,
    ToolDisabled,
    ToolEnabled,
)
from toolledger.schemas.governance import token_digest
from toolledger.schemas.keys import CallKey
from toolledger.schemas.status import CallStatus

T0 = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
KEY = str(CallKey("acme", "charge_card", "pay-1"))
DIGEST, OTHER = "sha256:" + "a" * 64, "sha256:" + "b" * 64
TOKEN = "apt_token-1"
POLICY = Policy(max_attempts=3, max_rounds=3, has_reconcile=True)
OFF = ErrorInfo.of(ErrorCode.TOOL_DISABLED, "switched off: incident")


def ctx(intent: str = "i1", digest: str = DIGEST) -> CallContext:
    return CallContext(
        call_key=KEY,
        tenant_id="acme",
        tool="charge_card",
        tool_version="1",
        idempotency_key="pay-1",
        args_digest=digest,
        intent_id=intent,
    )


def requested(at: datetime = T0, ttl: timedelta = timedelta(hours=1)) -> ApprovalRequested:
    return ApprovalRequested(
        envelope=ctx("i0").envelope("i0/approval-requested/1", at),
        approval_id="apr_1",
        arguments_redacted_json='{"amount_cents":1}',
        impact_json='{"summary":"charge"}',
        expires_at=at + ttl,
    )


def granted(at: datetime = T0, ttl: timedelta = timedelta(minutes=10)) -> ApprovalGranted:
    return ApprovalGranted(
        envelope=ctx("op1").envelope("op1/approval-granted/1", at),
        approval_id="apr_1",
        approver="olga",
        token_digest=token_digest(TOKEN),
        expires_at=at + ttl,
    )


def denied(at: datetime = T0) -> ApprovalDenied:
    return ApprovalDenied(
        envelope=ctx("op2").envelope("op2/approval-denied/1", at),
        approval_id="apr_1",
        approver="olga",
        reason="no",
    )


def consumed() -> ApprovalConsumed:
    return ApprovalConsumed(
        envelope=ctx("i1").envelope("i1/approval-consumed/1", T0), approval_id="apr_1"
    )


def book(*events: Event) -> ApprovalBook | None:
    result: ApprovalBook | None = None
    for event in events:
        result = evolve_approvals(result, event)
    return result


def submit(
    gate: Gate,
    history: ApprovalBook | None = None,
    *,
    digest: str = DIGEST,
    now: datetime = T0 + timedelta(minutes=1),
) -> Submit:
    return Submit(
        context=ctx("i1", digest),
        arguments_redacted_json='{"amount_cents":1}',
        policy=POLICY,
        now=now,
        epoch=1,
        gate=gate,
        approvals=history,
    )


def approval(
    history: ApprovalBook | None, token: str | None = None
) -> tuple[Gate, ApprovalBook | None]:
    """The approval gate of a call, and the key's book it is decided by."""
    gate = ApprovalGate(
        token_digest=token_digest(token) if token else None,
        new_approval_id="apr_new",
        impact_json='{"summary":"charge"}',
        request_ttl=timedelta(hours=1),
    )
    return Gate(approval=gate), history


def _code(event: Event) -> str:
    return _rejection(event).code


def _rejection(event: Event) -> ErrorInfo:
    assert isinstance(event, ToolCallRejected), event
    return event.error


def test_no_token_opens_a_request_and_starts_nothing() -> None:
    decision = decide(None, submit(*approval(None)))
    assert decision.action is None
    (event,) = decision.events
    assert isinstance(event, ApprovalRequested)
    assert event.approval_id == "apr_new" and event.envelope.event_id == "i1/approval-requested/1"
    assert event.expires_at == T0 + timedelta(minutes=61)
    assert event.arguments_redacted_json == '{"amount_cents":1}'


def test_asking_again_while_pending_answers_with_the_open_request() -> None:
    (event,) = decide(None, submit(*approval(book(requested())))).events
    assert isinstance(event, ApprovalRequested) and event.approval_id == "apr_1"


def test_a_grant_in_the_book_lets_the_same_arguments_go_ahead_without_a_token() -> None:
    # given a granted request, when the same key and arguments come again without a token,
    # then the grant is consumed with the Started event, in one decision
    decision = decide(None, submit(*approval(book(requested(), granted()))))
    consumed_event, started = decision.events
    assert isinstance(consumed_event, ApprovalConsumed) and consumed_event.approval_id == "apr_1"
    assert isinstance(started, ToolCallStarted)
    assert decision.action == Execute(attempt=1, round_attempt=1)


@pytest.mark.parametrize(
    ("name", "history", "digest", "minutes"),
    [
        ("expired grant", ("req", "grant"), DIGEST, 11),
        ("used once", ("req", "grant", "consumed"), DIGEST, 1),
    ],
)
def test_a_grant_covers_its_arguments_once_and_until_it_expires(
    name: str, history: tuple[str, ...], digest: str, minutes: int
) -> None:
    # then a new request is opened: the grant does not outlive its expiry, and once consumed
    # it is spent (other arguments never get one: the key is theirs, see below)
    events = {"req": requested(), "grant": granted(), "consumed": consumed()}
    gate = approval(book(*(events[h] for h in history)))
    decision = decide(None, submit(*gate, digest=digest, now=T0 + timedelta(minutes=minutes)))
    (event,) = decision.events
    assert decision.action is None, name
    assert isinstance(event, ApprovalRequested) and event.approval_id == "apr_new", name


def test_an_expired_request_opens_a_new_one() -> None:
    late = T0 + timedelta(hours=2)
    (event,) = decide(None, submit(*approval(book(requested())), now=late)).events
    assert isinstance(event, ApprovalRequested) and event.approval_id == "apr_new"


@pytest.mark.parametrize(
    ("history", "token", "minutes"),
    [
        (("req",), None, 1),
        (("req",), None, 120),  # the request lapsed: the key is still its arguments'
        (("req", "grant"), None, 1),
        (("req", "grant"), TOKEN, 1),  # a token for the first arguments changes nothing
        (("req", "deny"), None, 1),
    ],
)
def test_other_arguments_on_a_key_with_only_approval_requests_are_a_reused_key(
    history: tuple[str, ...], token: str | None, minutes: int
) -> None:
    # no call ran under the key, but its approval requests took it for their arguments: other
    # arguments are refused as against a call state, and no second request is opened
    events = {"req": requested(), "grant": granted(), "deny": denied()}
    gate = approval(book(*(events[h] for h in history)), token)
    decision = decide(None, submit(*gate, digest=OTHER, now=T0 + timedelta(minutes=minutes)))
    (event,) = decision.events
    assert decision.action is None
    assert _code(event) == ErrorCode.IDEMPOTENCY_KEY_REUSED
    assert DIGEST in _rejection(event).message and not _rejection(event).retryable


def test_a_valid_token_is_consumed_with_the_started_event_in_one_decision() -> None:
    decision = decide(None, submit(*approval(book(requested(), granted()), TOKEN)))
    consumed_event, started = decision.events
    assert isinstance(consumed_event, ApprovalConsumed) and consumed_event.approval_id == "apr_1"
    assert isinstance(started, ToolCallStarted)
    assert decision.action == Execute(attempt=1, round_attempt=1)
    after = book(requested(), granted(), consumed_event)
    assert after is not None and after.get("apr_1") is not None
    assert after.items[0].status is ApprovalStatus.CONSUMED


@pytest.mark.parametrize(
    ("name", "history", "token", "digest", "now", "message"),
    [
        ("forged", ("req", "grant"), "apt_forged", DIGEST, 1, "not issued"),
        ("not granted yet", ("req",), TOKEN, DIGEST, 1, "not issued"),
        ("used", ("req", "grant", "consumed"), TOKEN, DIGEST, 1, "consumed"),
        ("expired", ("req", "grant"), TOKEN, DIGEST, 11, "expired"),
        ("denied", ("req", "deny"), TOKEN, DIGEST, 1, "not issued"),
    ],
)
def test_a_bad_token_is_refused_and_starts_nothing(
    name: str, history: tuple[str, ...], token: str, digest: str, now: int, message: str
) -> None:
    events = {"req": requested(), "grant": granted(), "consumed": consumed(), "deny": denied()}
    gate = approval(book(*(events[h] for h in history)), token)
    decision = decide(None, submit(*gate, digest=digest, now=T0 + timedelta(minutes=now)))
    (event,) = decision.events
    assert decision.action is None
    assert _code(event) == ErrorCode.APPROVAL_INVALID and message in _rejection(event).message, name


def test_a_denied_call_without_a_token_is_refused_with_the_reason() -> None:
    (event,) = decide(None, submit(*approval(book(requested(), denied())))).events
    assert _code(event) == ErrorCode.APPROVAL_INVALID and "no" in _rejection(event).message
    assert not _rejection(event).retryable


def test_the_switch_is_checked_before_the_approval() -> None:
    gated, history = approval(book(requested(), granted()), TOKEN)
    gate = Gate(disabled=OFF, approval=gated.approval)
    (event,) = decide(None, submit(gate, history)).events
    assert _code(event) == ErrorCode.TOOL_DISABLED  # the token is not consumed


def _failed_once(disposition: FailureDisposition) -> CallState | None:
    """A call key whose first attempt ended with ``disposition``."""
    return fold(
        [
            ToolCallStarted(
                envelope=ctx().envelope("i0/started/1", T0),
                attempt=1,
                round=1,
                executor_epoch=1,
                arguments_redacted_json="{}",
            ),
            ToolCallFailed(
                envelope=ctx().envelope("i0/failed/1", T0),
                attempt=1,
                error=ErrorInfo.of(
                    ErrorCode.INTERNAL,
                    "x",
                    retryable=disposition is not FailureDisposition.FINAL,
                ),
                disposition=disposition,
                fingerprint="fp",
                duration_ms=1,
            ),
        ]
    )


def test_a_replay_needs_neither_approval_nor_an_enabled_switch() -> None:
    state = _failed_once(FailureDisposition.FINAL)
    gate = Gate(disabled=OFF, approval=approval(None)[0].approval)
    (event,) = decide(state, submit(gate)).events
    assert event.TYPE == "ToolCallReplayed"


def test_no_new_round_starts_while_switched_off() -> None:
    state = _failed_once(FailureDisposition.RETRYABLE)
    assert state is not None
    (event,) = decide(state, submit(Gate(disabled=OFF))).events
    assert _code(event) == ErrorCode.TOOL_DISABLED
    # a later round of an approved call needs no second approval
    decision = decide(state, submit(*approval(None)))
    assert isinstance(decision.events[0], ToolCallStarted)
    # reconcile said "not happened" while off: recorded, then refused, nothing runs
    unknown_state = state.model_copy(update={"status": CallStatus.UNKNOWN})
    reconciled = decide(
        unknown_state,
        ReconcileFinished(
            context=ctx("i2"),
            outcome=NotHappened(),
            by_intent=True,
            arguments_redacted_json="{}",
            policy=POLICY,
            now=T0,
            epoch=1,
            gate=Gate(disabled=OFF),
        ),
    )
    assert [e.TYPE for e in reconciled.events] == ["ToolCallReconciled", "ToolCallRejected"]
    assert reconciled.action is None


def test_operator_decisions_apply_only_to_a_pending_unexpired_request() -> None:
    ok = decide(None, DecideApproval(granted(T0 + timedelta(minutes=5)), book(requested())))
    (event,) = ok.events
    assert isinstance(event, ApprovalGranted)
    assert event.envelope.event_id == "op1/approval-granted/1"
    refusals = [
        DecideApproval(granted(), None),  # no such request
        DecideApproval(granted(), book(requested(), denied())),  # decided already
        DecideApproval(denied(T0 + timedelta(hours=2)), book(requested())),  # expired
        DecideApproval(
            granted().model_copy(update={"envelope": ctx("op1", OTHER).envelope("op1/x/1", T0)}),
            book(requested()),
        ),  # for other arguments
    ]
    for command in refusals:
        (event,) = decide(None, command).events
        assert _code(event) == ErrorCode.APPROVAL_INVALID


def _switch(tenant: str, tool: str, enabled: bool, minute: int, intent: str) -> ToolDisabled:
    cls = ToolEnabled if enabled else ToolDisabled
    env = ctx(intent).envelope(f"{intent}/switch/1", T0 + timedelta(minutes=minute))
    env = env.model_copy(update={"tenant_id": tenant, "tool": tool, "call_key": "switch"})
    return cls(envelope=env, scope="tenant", actor="op", reason="r")  # type: ignore[return-value]


def test_switches_stamp_one_event_per_partition_and_fold_latest_wins() -> None:
    change = _switch("acme", "charge_card", False, 1, "s1")
    ids = {decide(None, ChangeSwitch(change, p)).events[0].event_id for p in range(4)}
    assert ids == {f"s1/switch/{p}" for p in range(4)}
    switches: dict[str, Switch] = {}
    for event in (
        _switch("acme", "charge_card", False, 1, "s1"),
        _switch("acme", "charge_card", True, 3, "s3"),
        _switch("acme", "charge_card", False, 2, "s2"),  # older: arrives late, loses
    ):
        switch = switch_of(event)
        key = switch_key(switch.tenant_id, switch.tool)
        if newer(switches.get(key), switch):
            switches[key] = switch
    assert disabled_by(switches, "acme", "charge_card") is None
    switches[switch_key(ANY, ANY)] = switch_of(_switch(ANY, ANY, False, 4, "s4"))
    assert disabled_by(switches, "globex", "create_ticket") is not None
    switches[switch_key(ANY, ANY)] = switch_of(_switch(ANY, ANY, True, 5, "s5"))
    switches[switch_key("acme", ANY)] = switch_of(_switch("acme", ANY, False, 5, "s6"))
    assert disabled_by(switches, "acme", "create_ticket") is not None
    assert disabled_by(switches, "globex", "create_ticket") is None


def test_an_approval_book_stays_small_whatever_the_caller_asks() -> None:
    from toolledger.processors.ledger.governance import MAX_OPEN_REQUESTS

    history: ApprovalBook | None = book(requested(), granted())
    for n in range(40):  # a caller asking with ever new arguments
        ask = ApprovalRequested(
            envelope=ctx(f"x{n}", f"sha256:{n:064x}").envelope(f"x{n}/approval-requested/1", T0),
            approval_id=f"apr_{n}",
            arguments_redacted_json="{}",
            impact_json="{}",
            expires_at=T0 + timedelta(hours=1),
        )
        history = evolve_approvals(history, ask)
    assert history is not None
    pending = [a for a in history.items if a.status is ApprovalStatus.PENDING]
    assert len(pending) == MAX_OPEN_REQUESTS and pending[-1].approval_id == "apr_39"
    assert history.by_token(token_digest(TOKEN)) is not None  # the approved one is kept
    later = requested(at=T0 + timedelta(hours=2)).model_copy(update={"approval_id": "apr_late"})
    after = evolve_approvals(history, later)  # past every expiry: only the new one is open
    assert after is not None and [a.approval_id for a in after.items] == ["apr_late"]
