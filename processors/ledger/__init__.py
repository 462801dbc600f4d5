"""The pure core of the ledger: no clock, no uuid4, no I/O, no asyncio (a test enforces it)."""

from processors.ledger.commands import (
    Action,
    AttemptFinished,
    AttemptOutcome,
    Command,
    Execute,
    Failure,
    Found,
    FoundFailed,
    Inconclusive,
    NotHappened,
    Policy,
    Reconcile,
    ReconcileFinished,
    ReconcileOutcome,
    Recover,
    Submit,
    Success,
    Sweep,
    TimedOut,
)
from processors.ledger.decide import (
    Decision,
    InvariantViolation,
    decide,
    failure_fingerprint,
)
from processors.ledger.evolve import evolve, fold, fold_all
from processors.ledger.state import CallContext, CallState

__all__ = [
    "Action", "AttemptFinished", "AttemptOutcome", "CallContext", "CallState", "Command", "Decision", "Execute",
    "Failure", "Found", "FoundFailed", "Inconclusive", "InvariantViolation", "NotHappened",
    "Policy", "Reconcile", "ReconcileFinished", "ReconcileOutcome", "Recover", "Submit", "Success", "Sweep",
    "TimedOut", "decide", "evolve", "failure_fingerprint", "fold", "fold_all",
]
