"""A partition's executor state and its key/value form, shared by every store.

Call states are keyed by call key (a JSON array, so it never starts with a prefix below);
approval books and switches are keyed by a prefix and their own key. The Kafka store writes
these pairs to the compacted state topic, the embedded store to SQLite tables.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from processors.ledger import CallState
from processors.ledger.governance import ApprovalBook, Switch

if TYPE_CHECKING:
    from processors.runtime.partition import CommitBatch

APPROVALS_PREFIX = "approvals:"
SWITCH_PREFIX = "switch:"
REFUSED_KEY = "refused:"  # input offsets past the position already answered with a refusal


@dataclass(slots=True)
class Snapshot:
    """What a partition's executor knows: call states, approval books, switches."""

    states: dict[str, CallState] = field(default_factory=dict)
    approvals: dict[str, ApprovalBook] = field(default_factory=dict)  # by call key
    switches: dict[str, Switch] = field(default_factory=dict)  # by switch_key
    refused: frozenset[int] = frozenset()

    def restore(self, key: str, value: str | bytes | None) -> None:
        """Take one stored pair back (a later pair for the same key replaces the earlier; a
        tombstone, ``None``, deletes it: an expired key)."""
        if value is None:
            if key.startswith(APPROVALS_PREFIX):
                self.approvals.pop(key.removeprefix(APPROVALS_PREFIX), None)
            else:
                self.states.pop(key, None)
        elif key == REFUSED_KEY:
            self.refused = frozenset(int(o) for o in json.loads(value))
        elif key.startswith(APPROVALS_PREFIX):
            self.approvals[key.removeprefix(APPROVALS_PREFIX)] = ApprovalBook.model_validate_json(
                value
            )
        elif key.startswith(SWITCH_PREFIX):
            self.switches[key.removeprefix(SWITCH_PREFIX)] = Switch.model_validate_json(value)
        else:
            self.states[key] = CallState.model_validate_json(value)


def governance_pairs(batch: CommitBatch) -> Iterator[tuple[str, str]]:
    """The batch's approval books, switches and refused offsets as stored pairs."""
    for key, book in batch.approvals.items():
        yield APPROVALS_PREFIX + key, book.model_dump_json()
    for key, switch in batch.switches.items():
        yield SWITCH_PREFIX + key, switch.model_dump_json()
    if batch.refused is not None:
        yield REFUSED_KEY, json.dumps(batch.refused)


def expired_pairs(batch: CommitBatch) -> Iterator[str]:
    """The governance keys of the batch's expired call keys (their approval books), to delete
    (embedded) or tombstone (the state topic) with the call states themselves."""
    for key in batch.expired:
        if key not in batch.approvals:  # not a book the new call with the key just opened
            yield APPROVALS_PREFIX + key
