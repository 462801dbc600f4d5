"""The stored form of a call's state and of an event, the same in every store.

A call row (``tool_calls``) is one row per call key: the columns readers query and, in
``state_json``, the rest of the executor's state (:func:`state_json`). The embedded ledger file
keeps the executor's state *in* its call rows; the PostgreSQL projection writes the same rows.
An event is stored as its JSON with its ``type`` first (:func:`event_json`).

Pure: no I/O, no clock.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from toolledger.processors.ledger.decide import settled_at
from toolledger.processors.ledger.state import CallState
from toolledger.schemas.events import EVENTS_BY_TYPE, Event
from toolledger.schemas.keys import call_id_of

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
# The embedded file's call row: the columns and, for the executor's due keys, when the key's
# retention started (epoch seconds; NULL while the call is unresolved or once it expired).
CALL_FIELDS = (*CALL_COLUMNS, "settled_at")


def holds_nul(model: object, fields: Iterable[str]) -> bool:
    """Whether a field its row also stores as a column holds a NUL (then the JSON keeps the
    whole thing: the column of PostgreSQL text cannot)."""
    values = model.__dict__
    return "\x00" in "".join([values[field] or "" for field in fields])


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
    if holds_nul(state.context, _CONTEXT_COLUMNS) or holds_nul(state, _STATE_TEXTS):
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


def call_values(call_key: str, state: CallState) -> tuple[Any, ...]:
    """A call row as the values of :data:`CALL_FIELDS`, in order."""
    ctx = state.context
    settled = settled_at(state)
    return (
        call_id_of(call_key),
        call_key,
        ctx.tenant_id,
        ctx.tool,
        ctx.tool_version,
        ctx.idempotency_key,
        ctx.args_digest,
        state.status.value,
        state.result_json,
        state.error.model_dump_json() if state.error else None,
        state.attempts,
        state.rounds,
        state.reconcile_attempts,
        ctx.run_id,
        ctx.step_id,
        state.first_intent_id,
        ctx.intent_id,
        state.created_at.isoformat(),
        state.updated_at.isoformat(),
        state.last_event_id,
        state_json(state),
        None,
        None if settled is None else settled.timestamp(),
    )


def state_of_values(values: Sequence[Any]) -> CallState:
    """The call state of a row selected with :data:`STATE_SELECT`."""
    return state_of_row(dict(zip(STATE_COLUMNS, values, strict=True)))


def event_json(event: Event) -> str:
    """An event as JSON, its ``type`` first: how the log stores it."""
    return f'{{"type":"{event.TYPE}",' + event.model_dump_json()[1:]


def event_of_json(text: str | bytes) -> Event:
    """The event of :func:`event_json`'s text."""
    raw = json.loads(text)
    return EVENTS_BY_TYPE[raw.pop("type")].model_validate(raw)
