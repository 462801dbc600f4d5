"""Idempotency keys for agents: one per intended step, stable across retries of that step."""

from toolledger.schemas.keys import derive_idempotency_key

__all__ = ["derive_idempotency_key"]
