"""The API's request bodies and resources, as validated and as the OpenAPI document shows them."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, create_model

from toolledger.schemas.calls import CallView

NO_CONTROL = r"^[^\x00-\x1F\x7F]+$"  # ids are stored as text: no NUL (PostgreSQL) nor controls
HIDDEN = frozenset({"last_event_id", "last_intent_id", "call_key"})  # CallView's internal fields


class CallBody(BaseModel):
    """The request body of ``POST /v1/tools/{tool}/calls``."""

    model_config = ConfigDict(extra="forbid", strict=True)
    arguments: dict[str, Any]
    run_id: Annotated[str, Field(min_length=1, max_length=255, pattern=NO_CONTROL)] | None = None
    step_id: Annotated[str, Field(min_length=1, max_length=255, pattern=NO_CONTROL)] | None = None
    approval_token: Annotated[str, Field(min_length=1, max_length=4096)] | None = None


class EventPage(BaseModel):
    items: list[dict[str, Any]]
    next_cursor: str | None = None


class ToolPage(BaseModel):
    items: list[dict[str, Any]]
    next_cursor: str | None = None
    key_retention: str
    key_retention_seconds: int | None = None
    key_scope: str  # "tenant" or "tenant+principal": the ledger's, for tools that set none


# The Call resource as rendered (CallView without its internal fields).
Call: type[BaseModel] = create_model(  # type: ignore[call-overload]
    "Call",
    __doc__="The Call resource: the ledger's record of one call key.",
    **{n: (f.annotation, f) for n, f in CallView.model_fields.items() if n not in HIDDEN},
)


class CallList(BaseModel):
    items: list[Call]
    next_cursor: str | None
