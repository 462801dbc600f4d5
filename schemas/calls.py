"""The Call resource and support-staff search: the read contract every projection serves."""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict

from schemas.errors import ErrorInfo
from schemas.status import CallStatus


class CallView(BaseModel):
    """The Call resource. Built from the projection row, so a replay renders byte for byte the
    same as the first completed response (a replay does not change the row)."""

    model_config = ConfigDict(frozen=True)

    call_id: str
    tenant_id: str
    tool: str
    tool_version: str
    idempotency_key: str
    args_digest: str
    status: CallStatus
    ok: bool
    result: Any = None
    error: ErrorInfo | None = None
    attempts: int
    run_id: str | None = None
    step_id: str | None = None
    created_at: datetime
    updated_at: datetime
    last_event_id: str  # internal: not rendered
    last_intent_id: str  # internal: not rendered

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> CallView:
        status = CallStatus(row["status"])
        return cls(
            call_id=row["call_id"],
            tenant_id=row["tenant_id"],
            tool=row["tool_name"],
            tool_version=row["tool_version"],
            idempotency_key=row["idempotency_key"],
            args_digest=row["args_digest"],
            status=status,
            ok=status is CallStatus.SUCCEEDED,
            result=json.loads(row["result_json"]) if row["result_json"] else None,
            error=ErrorInfo.model_validate_json(row["error_json"]) if row["error_json"] else None,
            attempts=row["attempts"],
            run_id=row["run_id"],
            step_id=row["step_id"],
            created_at=row["created_at"],
            updated_at=row["updated_at"],
            last_event_id=row["last_event_id"],
            last_intent_id=row["last_intent_id"],
        )


@dataclass(frozen=True, slots=True)
class CallFilter:
    tool: str | None = None
    idempotency_key: str | None = None
    run_id: str | None = None
    status: CallStatus | None = None


@dataclass(frozen=True, slots=True)
class Page:
    items: list[CallView]
    next_cursor: str | None


def encode_cursor(call_id: str) -> str:
    return base64.urlsafe_b64encode(call_id.encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> str:
    """Raises ``ValueError`` for a cursor this API did not hand out."""
    raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode("ascii")
    if not raw.startswith("call_") or len(raw) > 64:
        raise ValueError("not a cursor of this API")
    return raw


class CallQueries(Protocol):
    """Reads scoped to one tenant: another tenant's call is simply not found."""

    async def get(self, tenant_id: str, call_id: str) -> CallView | None: ...

    async def search(
        self, tenant_id: str, where: CallFilter, *, limit: int, after: str | None
    ) -> Page: ...

    async def events(self, tenant_id: str, call_id: str) -> list[dict[str, Any]] | None: ...

    async def applied(self, event_id: str) -> bool:
        """Whether the projection has applied this event yet."""
