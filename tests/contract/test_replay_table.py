"""The replay contract of docs/architecture.md#states-and-the-replay-contract, on every backend."""

from __future__ import annotations

import asyncio
import json

import pytest

from tests.contract.harness import ACME, GLOBEX, Harness, eventually
from toolledger.producers.client import TrustedContext
from toolledger.schemas.status import CallStatus


async def test_first_call_executes_once_and_is_recorded(ledger: Harness) -> None:
    result = await ledger.client.call(
        "create_ticket", {"title": "Printer on fire"}, idempotency_key="k-first", context=ACME
    )
    assert result.ok and not result.replayed and result.attempts == 1
    assert result.result["ticket_id"].startswith("T_")
    assert ledger.effects("create_ticket", "k-first") == 1
    row = await ledger.call_row(result.call_id)
    assert row is not None
    assert row["status"] == "SUCCEEDED" and row["tenant_id"] == "acme"
    assert json.loads(row["result_json"]) == result.result


async def test_replay_returns_the_stored_result_without_running(ledger: Harness) -> None:
    args = {"title": "Same", "priority": "high"}
    first = await ledger.client.call("create_ticket", args, idempotency_key="k-r", context=ACME)
    before = await ledger.call_row(first.call_id)
    # key order, formatting and defaults do not change the digest
    again = await ledger.client.call(
        "create_ticket",
        {"priority": "high", "title": "Same", "body": ""},
        idempotency_key="k-r",
        context=ACME,
    )
    assert again.ok and again.replayed
    assert again.result == first.result
    assert ledger.effects("create_ticket", "k-r") == 1
    after = await ledger.call_row(first.call_id)
    assert before is not None and after is not None
    assert after["updated_at"] == before["updated_at"]  # a replay is not a state change


async def test_same_key_other_arguments_is_refused(ledger: Harness) -> None:
    await ledger.client.call("create_ticket", {"title": "A"}, idempotency_key="k-x", context=ACME)
    other = await ledger.client.call(
        "create_ticket", {"title": "B"}, idempotency_key="k-x", context=ACME
    )
    assert other.rejected and other.error is not None
    assert other.error.code == "IDEMPOTENCY_KEY_REUSED" and not other.error.retryable
    assert ledger.effects("create_ticket", "k-x") == 1


async def test_conflicting_arguments_are_refused_while_the_original_runs(ledger: Harness) -> None:
    slow = asyncio.create_task(
        ledger.client.call(
            "flaky_write",
            {"payload": "p", "fault": "slow", "delay_ms": 400},
            idempotency_key="k-slow",
            context=ACME,
        )
    )
    await eventually(lambda: _pending(ledger, slow, "k-slow"))
    other = await ledger.client.call(
        "flaky_write", {"payload": "q"}, idempotency_key="k-slow", context=ACME
    )
    assert other.error is not None and other.error.code == "IDEMPOTENCY_KEY_REUSED"
    assert not slow.done(), "the refusal must not wait for the running call"
    assert (await slow).ok
    assert ledger.effects("flaky_write", "k-slow") == 1


async def _pending(ledger: Harness, task: asyncio.Task[object], key: str) -> bool:
    await asyncio.sleep(0.05)
    return not task.done()


async def test_duplicate_while_running_waits_and_gets_the_outcome(ledger: Harness) -> None:
    args = {"payload": "p", "fault": "slow", "delay_ms": 300}
    first, second = await asyncio.gather(
        ledger.client.call("flaky_write", args, idempotency_key="k-dup", context=ACME),
        ledger.client.call("flaky_write", args, idempotency_key="k-dup", context=ACME),
    )
    assert first.ok and second.ok
    assert sorted([first.replayed, second.replayed]) == [False, True]
    assert first.result == second.result
    assert ledger.effects("flaky_write", "k-dup") == 1


async def test_duplicate_that_outwaits_its_wait_is_told_in_progress(ledger: Harness) -> None:
    args = {"payload": "p", "fault": "slow", "delay_ms": 400}
    first = asyncio.create_task(
        ledger.client.call("flaky_write", args, idempotency_key="k-w", context=ACME)
    )
    short = await ledger.client.call(
        "flaky_write", args, idempotency_key="k-w", context=ACME, wait=0.1
    )
    assert short.status is CallStatus.PENDING
    assert short.error is not None and short.error.retryable
    assert (await first).ok
    assert ledger.effects("flaky_write", "k-w") == 1


async def test_concurrent_identical_calls_execute_exactly_once(ledger: Harness) -> None:
    results = await asyncio.gather(
        *(
            ledger.client.call(
                "create_ticket", {"title": "storm"}, idempotency_key="k-storm", context=ACME
            )
            for _ in range(50)
        )
    )
    assert all(r.ok for r in results)
    assert sum(not r.replayed for r in results) == 1
    assert len({json.dumps(r.result) for r in results}) == 1
    assert ledger.effects("create_ticket", "k-storm") == 1


async def test_storm_of_many_keys_with_duplicates(ledger: Harness) -> None:
    keys = [f"k-many-{i % 40}" for i in range(120)]
    results = await asyncio.gather(
        *(
            ledger.client.call("create_ticket", {"title": key}, idempotency_key=key, context=ACME)
            for key in keys
        )
    )
    assert all(r.ok for r in results)
    assert sum(not r.replayed for r in results) == 40
    for key in set(keys):
        assert ledger.effects("create_ticket", key) == 1


async def test_validation_failure_does_not_consume_the_key(ledger: Harness) -> None:
    bad = await ledger.client.call(
        "create_ticket", {"title": "", "priority": "urgent"}, idempotency_key="k-v", context=ACME
    )
    assert bad.rejected and bad.error is not None and bad.error.code == "VALIDATION_FAILED"
    assert {f.loc for f in bad.field_errors} == {"title", "priority"}
    assert await ledger.call_row(bad.call_id) is None
    good = await ledger.client.call(
        "create_ticket", {"title": "fixed"}, idempotency_key="k-v", context=ACME
    )
    assert good.ok and not good.replayed
    assert ledger.effects("create_ticket", "k-v") == 1


async def test_transient_failure_is_retried_to_success(ledger: Harness) -> None:
    result = await ledger.client.call(
        "flaky_write",
        {"payload": "t", "fault": "transient_once"},
        idempotency_key="k-t",
        context=ACME,
    )
    assert result.ok and result.attempts == 2
    assert ledger.effects("flaky_write", "k-t") == 1
    types = [e["event_type"] for e in await ledger.event_rows() if e["idempotency_key"] == "k-t"]
    assert sorted(types) == sorted(
        ["ToolCallStarted", "ToolCallFailed", "ToolCallStarted", "ToolCallSucceeded"]
    )


async def test_final_failure_is_replayed(ledger: Harness) -> None:
    args = {"payload": "f", "fault": "final"}
    first = await ledger.client.call("flaky_write", args, idempotency_key="k-f", context=ACME)
    assert first.status is CallStatus.FAILED_FINAL and first.error is not None
    assert first.error.code == "DOWNSTREAM_REFUSED" and not first.replayed
    again = await ledger.client.call("flaky_write", args, idempotency_key="k-f", context=ACME)
    assert again.status is CallStatus.FAILED_FINAL and again.replayed
    assert again.error == first.error


async def test_retryable_failures_are_capped(ledger: Harness) -> None:
    args = {"payload": "r", "fault": "retryable_always"}
    statuses = []
    for _ in range(4):
        result = await ledger.client.call(
            "flaky_write", args, idempotency_key="k-cap", context=ACME
        )
        statuses.append((result.status, result.error.code if result.error else None))
    assert statuses == [
        (CallStatus.FAILED_RETRYABLE, "DOWNSTREAM_UNAVAILABLE"),
        (CallStatus.FAILED_RETRYABLE, "DOWNSTREAM_UNAVAILABLE"),
        (CallStatus.FAILED_FINAL, "RETRY_LIMIT_EXCEEDED"),
        (CallStatus.FAILED_FINAL, "RETRY_LIMIT_EXCEEDED"),
    ]
    row = await ledger.call_row(result.call_id)
    assert row is not None and row["attempts"] == 9 and row["rounds"] == 3
    assert ledger.effects("flaky_write", "k-cap") == 0


async def test_unknown_outcome_is_reconciled_not_rerun(ledger: Harness) -> None:
    args = {"payload": "h", "fault": "hang_after_effect"}
    first = await ledger.client.call("flaky_write", args, idempotency_key="k-h", context=ACME)
    assert first.status is CallStatus.UNKNOWN and first.error is not None
    assert first.error.code == "OUTCOME_UNKNOWN" and first.error.retryable
    again = await ledger.client.call("flaky_write", args, idempotency_key="k-h", context=ACME)
    assert again.ok and again.replayed
    assert ledger.effects("flaky_write", "k-h") == 1
    assert again.result["write_id"] == ledger.store.find(again.call_id)[0]  # type: ignore[index]


async def test_background_reconciler_resolves_unknown(ledger: Harness) -> None:
    first = await ledger.client.call(
        "flaky_write",
        {"payload": "s", "fault": "hang_after_effect"},
        idempotency_key="k-sweep",
        context=ACME,
    )
    assert first.status is CallStatus.UNKNOWN

    async def resolved() -> bool:
        row = await ledger.call_row(first.call_id)
        return row is not None and row["status"] == "SUCCEEDED"

    await eventually(resolved)
    assert ledger.effects("flaky_write", "k-sweep") == 1


async def test_keys_are_scoped_by_tenant_and_tool(ledger: Harness) -> None:
    a = await ledger.client.call(
        "create_ticket", {"title": "x"}, idempotency_key="shared", context=ACME
    )
    b = await ledger.client.call(
        "create_ticket", {"title": "x"}, idempotency_key="shared", context=GLOBEX
    )
    c = await ledger.client.call(
        "flaky_write", {"payload": "x"}, idempotency_key="shared", context=ACME
    )
    assert a.ok and b.ok and c.ok and not (a.replayed or b.replayed or c.replayed)
    assert a.result != b.result
    assert len({a.call_id, b.call_id, c.call_id}) == 3
    assert ledger.effects("create_ticket", "shared", "globex") == 1


async def test_read_only_tools_need_no_key_and_are_not_ledgered(ledger: Harness) -> None:
    await ledger.client.call(
        "create_ticket", {"title": "mine"}, idempotency_key="k-ro", context=ACME
    )
    await ledger.client.call(
        "create_ticket", {"title": "theirs"}, idempotency_key="k-ro", context=GLOBEX
    )
    listed = await ledger.client.call("list_tickets", {}, idempotency_key=None, context=ACME)
    assert listed.ok
    assert [t["title"] for t in listed.result["tickets"]] == ["mine"]
    # no key is held for a read: a row of it (PostgreSQL keeps one per read, for analysts) is
    # the read's own, named by its intent, never a keyed call
    reads = [r for r in await ledger.call_rows() if r["tool_name"] == "list_tickets"]
    assert all((r["idempotency_key"], r["call_id"]) == ("", listed.call_id) for r in reads)


async def test_pre_execution_refusals_are_specific_and_never_stored(ledger: Harness) -> None:
    client = ledger.client
    cases = {
        "IDEMPOTENCY_KEY_MISSING": client.call(
            "create_ticket", {"title": "x"}, idempotency_key=None, context=ACME
        ),
        "IDEMPOTENCY_KEY_INVALID": client.call(
            "create_ticket", {"title": "x"}, idempotency_key="bad\nkey", context=ACME
        ),
        "TOOL_NOT_FOUND": client.call("drop_database", {}, idempotency_key="k", context=ACME),
        "PAYLOAD_TOO_LARGE": client.call(
            "create_ticket",
            {"title": "x", "body": "y" * (2 << 20)},
            idempotency_key="k-big",
            context=ACME,
        ),
        "FORBIDDEN": client.call(
            "create_ticket",
            {"title": "x"},
            idempotency_key="k-scope",
            context=TrustedContext("acme", "eve", scopes=frozenset()),
        ),
    }
    for code, call in cases.items():
        result = await call
        assert result.rejected and result.error is not None, code
        assert result.error.code == code, (code, result.error)
    wrong_type = await client.call(
        "charge_card",
        {"customer_id": "c1", "amount_cents": "100", "currency": "USD"},
        idempotency_key="k-type",
        context=ACME,
    )
    assert wrong_type.error is not None and wrong_type.error.code == "VALIDATION_FAILED"
    assert [f.loc for f in wrong_type.field_errors] == ["amount_cents"]
    smuggled = await client.call(
        "create_ticket",
        {"title": "x", "tenant_id": "globex"},
        idempotency_key="k-smuggle",
        context=ACME,
    )
    assert smuggled.error is not None and smuggled.error.code == "VALIDATION_FAILED"
    assert await ledger.call_rows() == []
    assert ledger.store.effect_counts() == {}


async def test_restart_keeps_every_outcome(ledger: Harness) -> None:
    first = await ledger.client.call(
        "create_ticket", {"title": "durable"}, idempotency_key="k-restart", context=ACME
    )
    await ledger.restart()
    again = await ledger.client.call(
        "create_ticket", {"title": "durable"}, idempotency_key="k-restart", context=ACME
    )
    assert again.ok and again.replayed and again.result == first.result
    assert ledger.effects("create_ticket", "k-restart") == 1


async def test_crash_during_a_call_never_reruns_it_blind(ledger: Harness) -> None:
    args = {"payload": "c", "fault": "slow", "delay_ms": 300}
    running = asyncio.create_task(
        ledger.client.call("flaky_write", args, idempotency_key="k-crash", context=ACME)
    )
    await asyncio.sleep(0.15)  # Started is committed; the handler is sleeping
    await ledger.crash()
    running.cancel()
    await ledger.start()
    result = await ledger.client.call("flaky_write", args, idempotency_key="k-crash", context=ACME)
    assert result.ok, result
    # the effect never happened before the crash, so reconcile said NOT_HAPPENED and it ran once
    assert ledger.effects("flaky_write", "k-crash") == 1
    types = [
        e["event_type"] for e in await ledger.event_rows() if e["idempotency_key"] == "k-crash"
    ]
    assert "ToolCallOutcomeUnknown" in types and "ToolCallReconciled" in types


async def test_rebuilt_projections_equal_the_live_ones(ledger: Harness) -> None:
    await asyncio.gather(
        ledger.client.call("create_ticket", {"title": "a"}, idempotency_key="k1", context=ACME),
        ledger.client.call("create_ticket", {"title": "a"}, idempotency_key="k1", context=ACME),
        ledger.client.call("create_ticket", {"title": "b"}, idempotency_key="k1", context=ACME),
        ledger.client.call(
            "flaky_write",
            {"payload": "x", "fault": "transient_once"},
            idempotency_key="k2",
            context=GLOBEX,
        ),
        ledger.client.call(
            "flaky_write", {"payload": "x", "fault": "final"}, idempotency_key="k3", context=ACME
        ),
        ledger.client.call("create_ticket", {"title": ""}, idempotency_key="k4", context=ACME),
    )
    live_calls, live_events = await ledger.call_rows(), await ledger.event_rows()
    assert len(live_calls) == 3 and len(live_events) >= 9
    await ledger.rebuild()
    assert await ledger.call_rows() == live_calls
    assert await ledger.event_rows() == live_events


async def test_undecodable_intent_is_dead_lettered_and_does_not_block(ledger: Harness) -> None:
    await ledger.send_raw(b"\xc3\x01not an avro record at all")
    await ledger.send_raw(b"plain garbage")
    result = await ledger.client.call(
        "create_ticket", {"title": "after"}, idempotency_key="k-after", context=ACME
    )
    assert result.ok
    reasons = await ledger.dead_letter_reasons()
    assert len(reasons) == 2
    assert any("fingerprint" in r.lower() for r in reasons), reasons
    assert any("marker" in r.lower() for r in reasons), reasons


@pytest.mark.parametrize("depth", [65, 1_000, 100_000])
async def test_arguments_nested_past_the_limit_are_refused_and_leave_the_key_unused(
    ledger: Harness, depth: int
) -> None:
    """The client's own door: Python arguments nested past 64 levels (the object is level 1)
    are a VALIDATION_FAILED naming the limit at any depth, never a RecursionError; nothing is
    stored, the key takes the fixed arguments."""
    deep: list[object] = []
    for _ in range(depth - 2):
        deep = [deep]
    bad = await ledger.client.call(
        "create_ticket", {"title": "deep", "extra": deep}, idempotency_key="k-deep", context=ACME
    )
    assert bad.rejected and bad.error is not None and bad.error.code == "VALIDATION_FAILED"
    assert "the limit is 64 levels" in bad.error.message
    assert await ledger.call_row(bad.call_id) is None
    good = await ledger.client.call(
        "create_ticket", {"title": "fixed"}, idempotency_key="k-deep", context=ACME
    )
    assert good.ok and not good.replayed
    assert ledger.effects("create_ticket", "k-deep") == 1
