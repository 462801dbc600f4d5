"""toolledger: an execution ledger that makes AI agents' side-effecting tool calls safe to
retry, resume and run in parallel.

This module is the public API, one import path for writing, serving and calling tools::

    from toolledger import Ledger, Registry, ToolContext, TrustedContext, ToolError

The packages under it (``toolledger.schemas``, ``.processors``, ``.projections``,
``.producers``: the card's folders, docs/architecture.md#one-import-name) are where the work is
done; their names may change between versions, these do not. The names are loaded when first
used, so importing one package of the ledger (the Kafka executor's, say) does not load the
front doors.
"""

from __future__ import annotations

import importlib
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from toolledger.ledger import (
        Ledger,
    )
    from toolledger.processors.groups import (
        Compensation,
    )
    from toolledger.processors.ledger.commands import (
        Found,
        FoundFailed,
        Inconclusive,
        NotHappened,
    )
    from toolledger.processors.tools.decorators import (
        REPLAY_SENTENCES,
    )
    from toolledger.processors.tools.manifest import (
        EffectClass,
        HandlerResult,
        Impact,
        JobFailed,
        JobRef,
        JobRunning,
        JobSucceeded,
        RetryPolicy,
        RiskTier,
        Tool,
        ToolContext,
        ToolDescription,
        ToolError,
        ToolRegistrationError,
        always,
        never,
    )
    from toolledger.processors.tools.registry import (
        DecoratedTool,
        ToolRegistry,
    )
    from toolledger.producers.approvals import (
        Decision,
        PendingApproval,
        pending_approval,
    )
    from toolledger.producers.client import (
        CallResult,
        LedgerClient,
        TransportError,
        TrustedContext,
    )
    from toolledger.producers.http_client import (
        HttpLedgerClient,
        RemoteTool,
    )
    from toolledger.schemas.errors import (
        ErrorCode,
        ErrorInfo,
        FieldError,
    )
    from toolledger.schemas.groups import (
        GroupAnswer,
        GroupView,
    )
    from toolledger.schemas.keys import (
        derive_idempotency_key,
    )
    from toolledger.schemas.status import (
        CallStatus,
    )

    Registry = ToolRegistry

# public name -> the module that defines it
_WHERE: dict[str, str] = {
    "Compensation": "toolledger.processors.groups",
    "Found": "toolledger.processors.ledger.commands",
    "FoundFailed": "toolledger.processors.ledger.commands",
    "Inconclusive": "toolledger.processors.ledger.commands",
    "NotHappened": "toolledger.processors.ledger.commands",
    "REPLAY_SENTENCES": "toolledger.processors.tools.decorators",
    "EffectClass": "toolledger.processors.tools.manifest",
    "HandlerResult": "toolledger.processors.tools.manifest",
    "Impact": "toolledger.processors.tools.manifest",
    "JobFailed": "toolledger.processors.tools.manifest",
    "JobRef": "toolledger.processors.tools.manifest",
    "JobRunning": "toolledger.processors.tools.manifest",
    "JobSucceeded": "toolledger.processors.tools.manifest",
    "RetryPolicy": "toolledger.processors.tools.manifest",
    "RiskTier": "toolledger.processors.tools.manifest",
    "Tool": "toolledger.processors.tools.manifest",
    "ToolContext": "toolledger.processors.tools.manifest",
    "ToolDescription": "toolledger.processors.tools.manifest",
    "ToolError": "toolledger.processors.tools.manifest",
    "ToolRegistrationError": "toolledger.processors.tools.manifest",
    "always": "toolledger.processors.tools.manifest",
    "never": "toolledger.processors.tools.manifest",
    "DecoratedTool": "toolledger.processors.tools.registry",
    "ToolRegistry": "toolledger.processors.tools.registry",
    "Decision": "toolledger.producers.approvals",
    "PendingApproval": "toolledger.producers.approvals",
    "pending_approval": "toolledger.producers.approvals",
    "CallResult": "toolledger.producers.client",
    "LedgerClient": "toolledger.producers.client",
    "TransportError": "toolledger.producers.client",
    "TrustedContext": "toolledger.producers.client",
    "HttpLedgerClient": "toolledger.producers.http_client",
    "RemoteTool": "toolledger.producers.http_client",
    "ErrorCode": "toolledger.schemas.errors",
    "ErrorInfo": "toolledger.schemas.errors",
    "FieldError": "toolledger.schemas.errors",
    "GroupAnswer": "toolledger.schemas.groups",
    "GroupView": "toolledger.schemas.groups",
    "derive_idempotency_key": "toolledger.schemas.keys",
    "CallStatus": "toolledger.schemas.status",
    "Ledger": "toolledger.ledger",
}
_ALIASES = {"Registry": "ToolRegistry"}

try:
    __version__ = version("toolledger")
except PackageNotFoundError:  # run from a checkout that is not installed
    __version__ = "0+unknown"


def __getattr__(name: str) -> Any:
    real = _ALIASES.get(name, name)
    where = _WHERE.get(real)
    if where is None:
        raise AttributeError(f"module 'toolledger' has no attribute {name!r}")
    value = getattr(importlib.import_module(where), real)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


__all__ = [
    "REPLAY_SENTENCES",
    "CallResult",
    "CallStatus",
    "Compensation",
    "Decision",
    "DecoratedTool",
    "EffectClass",
    "ErrorCode",
    "ErrorInfo",
    "FieldError",
    "Found",
    "FoundFailed",
    "GroupAnswer",
    "GroupView",
    "HandlerResult",
    "HttpLedgerClient",
    "Impact",
    "Inconclusive",
    "JobFailed",
    "JobRef",
    "JobRunning",
    "JobSucceeded",
    "Ledger",
    "LedgerClient",
    "NotHappened",
    "PendingApproval",
    "Registry",
    "RemoteTool",
    "RetryPolicy",
    "RiskTier",
    "Tool",
    "ToolContext",
    "ToolDescription",
    "ToolError",
    "ToolRegistrationError",
    "ToolRegistry",
    "TransportError",
    "TrustedContext",
    "__version__",
    "always",
    "derive_idempotency_key",
    "never",
    "pending_approval",
]
