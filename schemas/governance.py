"""The governance vocabulary the front doors and the executor share: what is kept of an
approval token, and what a caller of a switched-off tool is told. Pure functions, no I/O."""

from __future__ import annotations

import hashlib

from toolledger.schemas.errors import ErrorCode, ErrorInfo

__all__ = ["disabled_error", "token_digest"]


def approval_id_for(intent_id: str) -> str:
    """The id of the approval request an intent opens (derived, so reprocessing the intent
    opens the same request)."""
    return "apr_" + hashlib.sha256(intent_id.encode()).hexdigest()[:24]


def token_digest(token: str) -> str:
    """What the ledger keeps of an approval token: never the token itself."""
    return "sha256:" + hashlib.sha256(token.encode("utf-8")).hexdigest()


def disabled_error(every_tenant: bool, every_tool: bool, tool: str, reason: str) -> ErrorInfo:
    """What a caller of a switched-off tool is told."""
    where = "for every tenant" if every_tenant else "for this tenant"
    what = "every tool" if every_tool else tool
    return ErrorInfo.of(
        ErrorCode.TOOL_DISABLED, f"An operator switched {what} off {where}: {reason}"
    )
