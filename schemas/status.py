"""The call states (docs/architecture.md#states-and-the-replay-contract)."""

from __future__ import annotations

from enum import StrEnum


class CallStatus(StrEnum):
    PENDING = "PENDING"
    SUCCEEDED = "SUCCEEDED"
    FAILED_RETRYABLE = "FAILED_RETRYABLE"
    FAILED_FINAL = "FAILED_FINAL"
    UNKNOWN = "UNKNOWN"

    @property
    def is_final(self) -> bool:
        """Finished for good: a same-key call is answered from the ledger, never executed."""
        return self in (CallStatus.SUCCEEDED, CallStatus.FAILED_FINAL)
