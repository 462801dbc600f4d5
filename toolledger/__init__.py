"""toolledger: an execution ledger that makes AI agents' side-effecting tool calls safe to
retry, resume and run in parallel.

This module is the public API, one import path for writing, serving and calling tools::

    from toolledger import Ledger, Registry, ToolContext, TrustedContext, ToolError

The internal packages (``schemas``, ``processors``, ``projections``, ``producers``) are where
the work is done; their names may change between versions, these do not.
"""

from importlib.metadata import PackageNotFoundError, version

from processors.groups import Compensation
from processors.ledger.commands import Found, FoundFailed, Inconclusive, NotHappened
from processors.tools.decorators import REPLAY_SENTENCES
from processors.tools.manifest import (
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
from processors.tools.registry import DecoratedTool, ToolRegistry
from producers.approvals import Decision, PendingApproval, pending_approval
from producers.client import CallResult, LedgerClient, TransportError, TrustedContext
from producers.http_client import HttpLedgerClient, RemoteTool
from schemas.errors import ErrorCode, ErrorInfo, FieldError
from schemas.groups import GroupAnswer, GroupView
from schemas.keys import derive_idempotency_key
from schemas.status import CallStatus
from toolledger.ledger import Ledger

Registry = ToolRegistry

try:
    __version__ = version("toolledger")
except PackageNotFoundError:  # run from a checkout that is not installed
    __version__ = "0+unknown"

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
