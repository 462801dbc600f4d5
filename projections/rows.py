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

from processors.ledger import CallState, evolve
from schemas.events import Envelope, Event, ToolCallKeyExpired, ToolCallStarted
from schemas.keys import call_id_for, call_id_of
from schemas.topics import Position as Position  # where an event was read (re-exported)

CALL_COLUMNS = (
    "call_id",
    "call_key",
    "tenant_id",
    "tool_name",
    "tool_version",
    "idempotency_key",
    "args_digest",
    "status",
    "result_json",
    "error_json",
    "attempts",
    "rounds",
    "reconcile_attempts",
    "run_id",
    "step_id",
    "first_intent_id",
    "last_intent_id",
    "created_at",
    "updated_at",
    "last_event_id",
    "state_json",
    "expired_at",  # set when the key expired; a new call with the key clears it
)
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


def payload_json(event: Event) -> str:
    """The audit payload: the event as JSON with its ``type`` (outcome events are redacted),
    without the envelope fields its row holds as columns."""
    whole = _holds_nul(event.envelope, ENVELOPE_COLUMNS)
    body = event.model_dump_json(exclude=None if whole else _SLIM)
    return f'{{"type":"{event.TYPE}",' + body[1:]


def _holds_nul(model: object, fields: Iterable[str]) -> bool:
    """Whether a field its row also stores as a column holds a NUL (then the JSON keeps the
    whole thing: the column of PostgreSQL text cannot)."""
    return any("\x00" in (getattr(model, field) or "") for field in fields)


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


def call_row(call_key: str, state: CallState) -> dict[str, Any]:
    ctx = state.context
    return {
        "call_id": call_id_of(call_key),
        "call_key": call_key,
        "tenant_id": ctx.tenant_id,
        "tool_name": ctx.tool,
        "tool_version": ctx.tool_version,
        "idempotency_key": ctx.idempotency_key,
        "args_digest": ctx.args_digest,
        "status": state.status.value,
        "result_json": state.result_json,
        "error_json": state.error.model_dump_json() if state.error else None,
        "attempts": state.attempts,
        "rounds": state.rounds,
        "reconcile_attempts": state.reconcile_attempts,
        "run_id": ctx.run_id,
        "step_id": ctx.step_id,
        "first_intent_id": state.first_intent_id,
        "last_intent_id": ctx.intent_id,
        "created_at": state.created_at,
        "updated_at": state.updated_at,
        "last_event_id": state.last_event_id,
        "state_json": state_json(state),
        "expired_at": None,
    }


# What a call row's ``state_json`` adds to its columns: the rest of the call state is the
# row's columns (:data:`STATE_COLUMNS`), so each field is stored once (half of the row at
# 200-byte arguments) and :func:`state_of_row` folds them back into the state. A context value
# holding a NUL keeps the whole state, as :func:`payload_json` keeps the whole envelope.
_STATE_EXTRA: dict[str, Any] = {
    "context": {"principal", "trace_id"},
    "round_attempts": True,
    "job": True,
    "job_updates": True,
}
_CONTEXT_COLUMNS = {
    "call_key": "call_key",
    "tenant_id": "tenant_id",
    "tool": "tool_name",
    "tool_version": "tool_version",
    "idempotency_key": "idempotency_key",
    "args_digest": "args_digest",
    "intent_id": "last_intent_id",
    "run_id": "run_id",
    "step_id": "step_id",
}
_STATE_FIELDS = (
    "status",
    "first_intent_id",
    "attempts",
    "rounds",
    "reconcile_attempts",
    "result_json",
    "created_at",
    "updated_at",
    "last_event_id",
)
_STATE_TEXTS = ("first_intent_id", "result_json", "last_event_id")
STATE_COLUMNS = ("state_json", "error_json", *_STATE_FIELDS, *_CONTEXT_COLUMNS.values())
STATE_SELECT = ", ".join(STATE_COLUMNS)  # what both projectors read of a stored call row


def state_json(state: CallState) -> str:
    """A call row's ``state_json``: the fields of :data:`_STATE_EXTRA` (the whole state when a
    text its columns hold has a NUL: PostgreSQL's COPY tests this JSON for one)."""
    if _holds_nul(state.context, _CONTEXT_COLUMNS) or _holds_nul(state, _STATE_TEXTS):
        return state.model_dump_json()
    # a field at its default (no job, no trace id) is left out: validation puts it back
    return state.model_dump_json(include=_STATE_EXTRA, exclude_defaults=True)


def state_of_row(row: Mapping[str, Any]) -> CallState:
    """The call state of a ``tool_calls`` row (its :data:`STATE_COLUMNS`); a row that holds
    the whole state (written before the columns were left out, or holding a NUL) as it is."""
    stored: dict[str, Any] = json.loads(row["state_json"])
    if "status" in stored:
        return CallState.model_validate(stored)
    context = {field: row[column] for field, column in _CONTEXT_COLUMNS.items()}
    context.update(stored.pop("context", {}))
    error = row["error_json"]
    return CallState.model_validate(
        {
            **{field: row[field] for field in _STATE_FIELDS},
            **stored,
            "context": context,
            "error": None if error is None else json.loads(error),
        }
    )


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
