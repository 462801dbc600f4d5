"""The HTTP front door (FastAPI): the Idempotency-Key contract.

See docs/architecture.md#the-http-contract.
"""
