"""The key/value pairs of a partition's executor state (the :class:`~processors.ports.Snapshot`
it starts from and the :class:`~processors.ports.CommitBatch` es it writes).

Call states are keyed by call key (a JSON array, so it never starts with a prefix below);
approval books and switches are keyed by a prefix and their own key. The Kafka store writes
these pairs to the compacted state topic; both stores keep them in the tables of
:mod:`processors.runtime.state_table`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

from toolledger.processors.ledger.governance import Switch, newer
from toolledger.processors.ports import CommitBatch, Snapshot

APPROVALS_PREFIX = "approvals:"
SWITCH_PREFIX = "switch:"
REFUSED_KEY = "refused:"  # input offsets past the position already answered with a refusal


def restore(snapshot: Snapshot, partition: int, key: str, value: str | bytes) -> None:
    """Take one stored governance pair of ``partition`` back into ``snapshot``: a switch (the
    newer one, when partitions recorded it apart), or the partition's refused offsets."""
    if key == REFUSED_KEY:
        snapshot.refused[partition] = frozenset(int(o) for o in json.loads(value))
    elif key.startswith(SWITCH_PREFIX):
        switch = Switch.model_validate_json(value)
        name = key.removeprefix(SWITCH_PREFIX)
        if newer(snapshot.switches.get(name), switch):
            snapshot.switches[name] = switch
    else:
        raise ValueError(f"not a governance pair: {key!r}")


def switch_pairs(batch: CommitBatch, partition: int) -> Iterator[tuple[str, str]]:
    """The batch's switches and refused offsets of ``partition`` as stored pairs."""
    for (p, key), switch in batch.switches.items():
        if p == partition:
            yield SWITCH_PREFIX + key, switch.model_dump_json()
    refused = batch.refused.get(partition)
    if refused is not None:
        yield REFUSED_KEY, json.dumps(refused)


def topic_pairs(batch: CommitBatch, partition: int) -> Iterator[tuple[str, str | None]]:
    """Every pair a partition's batch writes to the compacted state topic, tombstones
    (``None``) for the expired keys first: compaction then drops their earlier records."""
    for key in batch.expired:
        yield key, None
        if key not in batch.approvals:  # not a book the new call with the key just opened
            yield APPROVALS_PREFIX + key, None
    for key, state in batch.states.items():
        yield key, state.model_dump_json()
    for key, book in batch.approvals.items():
        yield APPROVALS_PREFIX + key, book.model_dump_json()
    yield from switch_pairs(batch, partition)
