"""What an outcome event does to the projection tables, independent of the database.

``tool_calls`` holds one row per call key: the fold of its events (the same ``evolve`` the
executor uses). ``tool_call_events`` is the append-only audit trail, deduplicated by
``event_id`` so a redelivered event is applied once.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from toolledger.processors.ledger import CallContext, CallState, evolve
from toolledger.processors.ledger.rows import call_row, holds_nul
from toolledger.schemas.events import (
    Envelope,
    Event,
    ToolCallFailed,
    ToolCallJobStarted,
    ToolCallKeyExpired,
    ToolCallStarted,
    ToolCallSucceeded,
)
from toolledger.schemas.keys import call_id_for
from toolledger.schemas.status import CallStatus
from toolledger.schemas.topics import Position as Position  # where an event was read (re-exported)

EVENT_COLUMNS = (
    "event_id",
    "log_partition",
    "log_offset",
    "call_id",
    "call_key",
    "tenant_id",
    "tool_name",
    "idempotency_key",
    "intent_id",
    "run_id",
    "event_type",
    "occurred_at",
    "payload_json",
)


# The envelope fields an audit row holds as columns (envelope field: column). Its payload
# leaves them out, so each is stored once (a third of the row at 200-byte arguments), and
# :func:`audit_payload` puts them back. A value holding a NUL keeps the whole envelope: a
# PostgreSQL column stores it as U+FFFD, the JSON keeps the exact value.
ENVELOPE_COLUMNS = {
    "event_id": "event_id",
    "call_key": "call_key",
    "tenant_id": "tenant_id",
    "tool": "tool_name",
    "idempotency_key": "idempotency_key",
    "intent_id": "intent_id",
}
_SLIM = {"envelope": set(ENVELOPE_COLUMNS)}
AUDIT_SELECT = ", ".join(("payload_json", *ENVELOPE_COLUMNS.values()))
"""What an audit row's whole event is read from (:func:`audit_payload`): its payload and its
columns of the envelope."""


def payload_json(event: Event) -> str:
    """The audit payload: the event as JSON with its ``type`` (outcome events are redacted),
    without the envelope fields its row holds as columns."""
    whole = holds_nul(event.envelope, ENVELOPE_COLUMNS)
    body = event.model_dump_json(exclude=None if whole else _SLIM)
    return f'{{"type":"{event.TYPE}",' + body[1:]


def whole_payload(event: Event) -> dict[str, Any]:
    """What :func:`audit_payload` gives for an audit row of ``event``: the event as JSON with
    its ``type`` first (for a row whose payload is read from the log's record)."""
    return {"type": event.TYPE, **json.loads(event.model_dump_json())}


def audit_payload(row: Mapping[str, Any]) -> dict[str, Any]:
    """The whole event of an audit row (its ``payload_json`` and the columns of
    :data:`ENVELOPE_COLUMNS`), with the envelope's fields in their declared order. A payload
    written with its whole envelope (before the columns were left out, or holding a NUL) is
    returned as it is."""
    payload: dict[str, Any] = json.loads(row["payload_json"])
    envelope = payload["envelope"]
    if "event_id" not in envelope:
        given = {field: row[column] for field, column in ENVELOPE_COLUMNS.items()}
        payload["envelope"] = {
            name: envelope[name] if name in envelope else given[name]
            for name in Envelope.model_fields
            if name in envelope or name in given
        }
    return payload


def event_row(event: Event, position: Position, *, payload: bool = True) -> dict[str, Any]:
    """The audit row of ``event``; ``payload`` False: without its JSON (``None``), for a
    read model that reads the event from the log's record at ``position``."""
    env = event.envelope
    return {
        "event_id": env.event_id,
        "log_partition": position.partition,
        "log_offset": position.offset,
        "call_id": call_id_for(env.call_key, env.idempotency_key, env.intent_id),
        "call_key": env.call_key,
        "tenant_id": env.tenant_id,
        "tool_name": env.tool,
        "idempotency_key": env.idempotency_key,
        "intent_id": env.intent_id,
        "run_id": env.run_id,
        "event_type": event.TYPE,
        "occurred_at": env.occurred_at,
        "payload_json": payload_json(event) if payload else None,
    }


def expiries(events: Iterable[Event]) -> list[tuple[str, datetime]]:
    """``(call_key, when)`` of the keys whose last word in ``events`` is an expiry (not a new
    call started after it): their row keeps the finished call and shows when its key expired.
    Applied after the rows themselves are written."""
    last: dict[str, datetime | None] = {}
    for event in events:
        if isinstance(event, ToolCallKeyExpired):
            last[event.call_key] = event.envelope.occurred_at
        elif isinstance(event, ToolCallStarted):
            last[event.call_key] = None
    return [(key, when) for key, when in last.items() if when is not None]


def fold_new_events(
    stored: Mapping[str, CallState], new_events: Iterable[Event]
) -> dict[str, CallState]:
    """The call states that ``new_events`` (in log order, not applied before) change.

    ``stored``: the current state of (at least) every call key the events touch. Every
    projection adapter folds with this, so the tables are the same fold on every database.
    """
    by_key: dict[str, list[Event]] = {}
    for event in new_events:
        by_key.setdefault(event.call_key, []).append(event)
    changed: dict[str, CallState] = {}
    for key, events in by_key.items():
        before = state = last = stored.get(key)
        for event in events:
            state = evolve(state, event)
            last = state if state is not None else last
        # a key that expired keeps the record of its last call (marked by ``expiries``)
        if last is not None and last is not before:
            changed[key] = last
    return changed


# ---------------------------------------------------------------- the analysts' columns

ANALYTICS_COLUMNS = ("duration_ms",)
"""Columns a read model may add to both tables (PostgreSQL has them, see
``projections/migrations/0008_analytics.sql``): ``duration_ms``, of the handler run an event
reports (:func:`duration_of`) or of a call's latest finished run (:func:`latest_durations`)."""


def duration_of(event: Event) -> float | None:
    """The duration of the handler run ``event`` reports, in milliseconds (None: it reports
    none)."""
    if isinstance(event, ToolCallSucceeded | ToolCallFailed | ToolCallJobStarted):
        return float(event.duration_ms)
    return None


def latest_durations(
    stored: Mapping[str, float | None], new_events: Iterable[Event]
) -> dict[str, float | None]:
    """The ``duration_ms`` of every call key ``new_events`` (in log order) tell something
    about: of its latest finished handler run, None once a new run started (``stored``: the
    keys' values before the events; a key the events say nothing about keeps it)."""
    latest: dict[str, float | None] = {}
    for event in new_events:
        if not event.envelope.idempotency_key:
            continue
        if isinstance(event, ToolCallStarted):
            latest[event.call_key] = None
        else:
            duration = duration_of(event)
            if duration is not None:
                latest[event.call_key] = duration
    return {key: latest.get(key, stored.get(key)) for key in (*stored, *latest)}


def read_only_call(event: Event) -> dict[str, Any] | None:
    """The ``tool_calls`` row of a read-only call (its one outcome event, unkeyed: no Started
    before it), or None for any other event. Its ``call_id`` names its intent
    (:func:`schemas.keys.call_id_for`); its ``call_key`` is the tool's shared unkeyed key."""
    env = event.envelope
    if env.idempotency_key or not isinstance(event, ToolCallSucceeded | ToolCallFailed):
        return None
    running = CallState(
        status=CallStatus.PENDING,
        context=CallContext.of(env),
        first_intent_id=env.intent_id,
        attempts=event.attempt,
        rounds=1,
        round_attempts=1,
        created_at=env.occurred_at,
        updated_at=env.occurred_at,
        last_event_id=env.event_id,
    )
    state = evolve(running, event)
    assert state is not None  # an outcome on a running call
    row = call_row(env.call_key, state)
    row["call_id"] = call_id_for(env.call_key, env.idempotency_key, env.intent_id)
    return row
