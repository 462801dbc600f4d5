"""The HTTP front door (FastAPI): the Idempotency-Key contract of DESIGN section 11."""
