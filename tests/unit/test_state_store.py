"""The executor's state tables (:mod:`processors.runtime.state_table`) and their pairs
(:mod:`processors.runtime.snapshot`): a batch written as rows and the same batch as the state
topic's pairs give the same tables, switches and refused offsets are kept per partition, and a
Kafka local store of anything else, or a damaged one, is rebuilt instead of used."""

from __future__ import annotations

import itertools
import json
import logging
import os
import sqlite3
import tempfile
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from toolledger.processors.ledger import CallContext, CallState
from toolledger.processors.ledger.governance import Approval, ApprovalBook, ApprovalStatus, Switch
from toolledger.processors.ports import CommitBatch, Snapshot
from toolledger.processors.runtime import state_table
from toolledger.processors.runtime.kafka import (
    default_state_dir,
    meta_headers,
    meta_of_headers,
    private_state_dir,
)
from toolledger.processors.runtime.local_store import LocalStore, StoreBusy
from toolledger.processors.runtime.snapshot import (
    APPROVALS_PREFIX,
    REFUSED_KEY,
    SWITCH_PREFIX,
    restore,
    switch_pairs,
    topic_pairs,
)
from toolledger.processors.runtime.state_table import StateMeta, state_meta
from toolledger.schemas.keys import CallKey
from toolledger.schemas.status import CallStatus

T0 = datetime(2026, 12, 1, tzinfo=UTC)
KEYS = [str(CallKey("acme", "op", k)) for k in ("a", "b", "c")]
KEY_C = KEYS[2]
IDENTITY = {"cluster": "c1", "group": "g", "topic": "t.state", "partition": "0", "partitions": "4"}


def _state(key: str, status: CallStatus, at: datetime = T0) -> CallState:
    parsed = CallKey.parse(key)
    return CallState(
        status=status,
        context=CallContext(
            call_key=key,
            tenant_id=parsed.tenant_id,
            tool=parsed.tool,
            tool_version="1",
            idempotency_key=parsed.idempotency_key,
            args_digest="d",
            intent_id="i",
        ),
        first_intent_id="i",
        created_at=at,
        updated_at=at,
        last_event_id="e",
    )


def _book(approval_id: str, key: str = KEY_C) -> ApprovalBook:
    """A key's book with one pending request, as its ApprovalRequested at T0 left it."""
    return ApprovalBook(
        items=(
            Approval(
                approval_id=approval_id,
                args_digest="d",
                status=ApprovalStatus.PENDING,
                expires_at=T0 + timedelta(hours=1),
            ),
        ),
        context=_state(key, CallStatus.PENDING).context,
        updated_at=T0,
        last_event_id=f"i/{approval_id}",
    )


def _switch(n: int, at: datetime = T0) -> Switch:
    """The switch of ``op`` for ``acme`` (variant ``n``: on when even), changed at ``at``."""
    return Switch(
        tenant_id="acme",
        tool="op",
        enabled=n % 2 == 0,
        reason=f"r{n}",
        actor="ops",
        changed_at=at,
        intent_id=f"i{n}",
    )


def _rows(conn: sqlite3.Connection) -> list[tuple[object, ...]]:
    return (
        conn.execute("SELECT * FROM call_state ORDER BY call_key").fetchall()
        + conn.execute("SELECT * FROM executor_state ORDER BY key").fetchall()
    )


def _batches() -> list[CommitBatch]:
    a, b, c = KEYS
    return [
        CommitBatch(
            states={a: _state(a, CallStatus.PENDING), b: _state(b, CallStatus.SUCCEEDED)},
            approvals={c: _book("apr_1")},
            refused={0: [7]},
        ),
        CommitBatch(states={a: _state(a, CallStatus.UNKNOWN, T0 + timedelta(seconds=5))}),
        CommitBatch(expired={b}, approvals={b: _book("apr_2", b)}),  # expired, asked again
        CommitBatch(expired={c}),
    ]


def _pairs(
    batch: CommitBatch, *, headers: bool = True
) -> list[tuple[str, bytes | None, StateMeta | None]]:
    """The batch as state-topic records: the row fields in headers, or (older records) not."""
    return [
        (
            k,
            None if v is None else v.encode(),
            meta_of_headers(meta_headers(state_meta(batch.states[k])))
            if headers and k in batch.states
            else None,
        )
        for k, v in topic_pairs(batch, 0)
    ]


@pytest.mark.parametrize("headers", [True, False], ids=["with-headers", "json-only"])
def test_a_stores_own_commits_and_the_topics_pairs_give_the_same_tables(
    tmp_path: Path, headers: bool
) -> None:
    """A partition's batch written as rows (``put_batch`` with its states) and as the state
    topic's pairs (with the row fields in headers; older records have none) must give the
    same tables: a store restored from the topic holds exactly what the owner's did."""
    direct, restored = (sqlite3.connect(tmp_path / n, isolation_level=None) for n in "ab")
    for conn in (direct, restored):
        state_table.create(conn)
    for batch in _batches():
        state_table.put_batch(direct, batch, states_partition=0)
        state_table.put_pairs(restored, 0, _pairs(batch, headers=headers))
        assert _rows(direct) == _rows(restored)
    a, b, _c = KEYS
    assert [row[0] for row in direct.execute("SELECT call_key FROM call_state")] == [a, b]
    entries = state_table.read(direct, KEYS, state_table.IN_CALL_STATE)
    assert entries[b].state is None and entries[b].book == _book("apr_2", b)
    live = state_table.live(direct, 0, state_table.IN_CALL_STATE)
    assert list(live.states) == [a] and live.refused == {0: frozenset({7})}


@pytest.mark.parametrize("order", ["ASC", "DESC"])
def test_switches_and_refused_offsets_are_kept_per_partition(tmp_path: Path, order: str) -> None:
    """A batch of several partitions (an embedded executor decides them all) writes each
    partition's switch and refused offsets under that partition. Read back, each partition
    has its own refused offsets, and a switch that two partitions recorded apart is the
    newer one, whichever partition is read first."""
    older, newer = _switch(1), _switch(2, T0 + timedelta(seconds=1))
    name = "acme-op"  # the switch's key (any text: the pairs carry it as it is)
    batch = CommitBatch(switches={(0, name): newer, (1, name): older}, refused={0: [3], 1: [5, 6]})
    assert list(switch_pairs(batch, 1)) == [
        (SWITCH_PREFIX + name, older.model_dump_json()),
        (REFUSED_KEY, "[5, 6]"),
    ]
    assert list(switch_pairs(batch, 2)) == []
    conn = sqlite3.connect(tmp_path / "s.db", isolation_level=None)
    state_table.create(conn)
    state_table.put_batch(conn, batch)  # states elsewhere (an embedded file's call rows)
    assert state_table.live(conn, 0, state_table.IN_CALL_STATE).refused == {0: frozenset({3})}
    one = state_table.live(conn, 1, state_table.IN_CALL_STATE)
    assert one.refused == {1: frozenset({5, 6})} and one.switches == {name: older}
    every = Snapshot()  # every partition's pairs in one snapshot, as an embedded file loads
    for partition, key, value in conn.execute(
        f"SELECT partition, key, value_json FROM executor_state ORDER BY partition {order}"
    ):
        restore(every, partition, key, value)
    assert every.switches == {name: newer}
    assert every.refused == {0: frozenset({3}), 1: frozenset({5, 6})}
    with pytest.raises(ValueError, match="not a governance pair"):
        restore(every, 0, APPROVALS_PREFIX + KEYS[0], "{}")


def test_due_pages_through_settled_keys_of_one_tool(tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / "s.db", isolation_level=None)
    state_table.create(conn)
    keys = [str(CallKey("acme", "op", f"k{i}")) for i in range(5)]
    states = {
        k: _state(k, CallStatus.SUCCEEDED, T0 + timedelta(seconds=i)) for i, k in enumerate(keys)
    }
    states[keys[4]] = _state(keys[4], CallStatus.UNKNOWN)  # unresolved: never due
    other = str(CallKey("acme", "other", "k0"))
    states[other] = _state(other, CallStatus.SUCCEEDED)
    state_table.put_batch(conn, CommitBatch(states=states), states_partition=0)
    cutoff = (T0 + timedelta(seconds=2)).timestamp()
    first = state_table.IN_CALL_STATE.due(conn, 0, "op", cutoff, None, 2)
    assert [k for _, k in first] == keys[:2]
    rest = state_table.IN_CALL_STATE.due(conn, 0, "op", cutoff, first[-1], 2)
    assert [k for _, k in rest] == keys[2:3]


@pytest.mark.parametrize("by_pairs", [False, True], ids=["own-commits", "topic-pairs"])
def test_a_key_with_only_a_book_is_due_by_when_its_book_settled(
    tmp_path: Path, by_pairs: bool
) -> None:
    """A key that only had approval requests is due once its book settled (here: its one
    request lapses at T0 + 1 h); a key with a state is due by its state alone, once."""
    store = LocalStore(tmp_path / "p0.db", IDENTITY)
    a, b, c = KEYS
    batches = [
        CommitBatch(
            states={a: _state(a, CallStatus.SUCCEEDED), b: _state(b, CallStatus.SUCCEEDED)},
            approvals={b: _book("apr_b", b), c: _book("apr_c", c)},
        ),
        CommitBatch(expired={a}, approvals={a: _book("apr_a", a)}),  # expired, asked again
    ]
    for batch in batches:
        if by_pairs:
            store.apply(_pairs(batch), None)
        else:
            with state_table.transaction(store.conn) as conn:
                state_table.put_batch(conn, batch, states_partition=0)
    try:
        lapsed = (T0 + timedelta(hours=1)).timestamp()
        due = store.due("op", lapsed, None, 10)
        assert due == [(T0.timestamp(), b), (lapsed, a), (lapsed, c)]
        assert store.due("op", lapsed - 1, None, 10) == [(T0.timestamp(), b)]
        assert store.due("op", lapsed, (lapsed, a), 10) == [(lapsed, c)]
    finally:
        store.close()


def test_a_local_store_keeps_its_checkpoint_and_contents(tmp_path: Path) -> None:
    path = tmp_path / "p0.db"
    store = LocalStore(path, IDENTITY)
    store.apply(_pairs(_batches()[0]), 42)
    store.close()
    again = LocalStore(path, IDENTITY)
    try:
        assert again.checkpoint == 42
        assert set(again.read(KEYS)) == set(KEYS)
    finally:
        again.close()


@pytest.mark.parametrize(
    "changed", [{"cluster": "c2"}, {"group": "other"}, {"partitions": "8"}, {"partition": "1"}]
)
def test_a_local_store_of_another_topic_partition_is_rebuilt(
    tmp_path: Path, changed: dict[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "p0.db"
    store = LocalStore(path, IDENTITY)
    store.apply(_pairs(_batches()[0]), 42)
    store.close()
    with caplog.at_level(logging.WARNING, "toolledger.kafka"):
        other = LocalStore(path, {**IDENTITY, **changed})
    try:
        assert other.checkpoint == 0 and other.read(KEYS) == {}
        assert "rebuilt" in caplog.text
    finally:
        other.close()


def test_a_local_store_is_open_in_one_place_at_a_time(tmp_path: Path) -> None:
    path = tmp_path / "p0.db"
    store = LocalStore(path, IDENTITY)
    store.apply(_pairs(_batches()[0]), 42)
    with pytest.raises(StoreBusy):
        LocalStore(path, {**IDENTITY, "cluster": "c2"})  # would have rebuilt it: refused
    assert store.checkpoint == 42 and set(store.read(KEYS)) == set(KEYS)
    store.close()
    store.close()  # closing twice closes nothing else
    again = LocalStore(path, IDENTITY)  # the lock went with the first
    try:
        assert again.checkpoint == 42
    finally:
        again.close()


def test_a_damaged_local_store_is_rebuilt(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "p0.db"
    path.write_bytes(b"not a database at all" * 300)
    with caplog.at_level(logging.WARNING, "toolledger.kafka"):
        store = LocalStore(path, IDENTITY)
    try:
        assert store.checkpoint == 0
        assert "cannot be read" in caplog.text
    finally:
        store.close()


_PAIR_KEYS = [*KEYS, f"{APPROVALS_PREFIX}{KEYS[0]}", f"{APPROVALS_PREFIX}{KEYS[1]}"]


def _pair_value(key: str, n: int) -> bytes | None:
    """A stored value for ``key`` (variant ``n``; 0 is a tombstone)."""
    if n == 0:
        return None
    if key.startswith(APPROVALS_PREFIX):
        return _book(f"apr_{n}").model_dump_json().encode()
    if key.startswith(SWITCH_PREFIX):
        return _switch(n).model_dump_json().encode()
    if key == REFUSED_KEY:
        return json.dumps(list(range(n))).encode()
    status = (CallStatus.PENDING, CallStatus.SUCCEEDED, CallStatus.UNKNOWN)[n % 3]
    return _state(key, status, T0 + timedelta(seconds=n)).model_dump_json().encode()


_TOPIC_PAIRS = st.lists(
    st.tuples(
        st.sampled_from([*_PAIR_KEYS, f"{SWITCH_PREFIX}acme:op", REFUSED_KEY]),
        st.integers(0, 5),
        st.booleans(),
    ),
    max_size=30,
)


@settings(max_examples=60, deadline=None)
@given(records=_TOPIC_PAIRS, cuts=st.lists(st.integers(0, 30), max_size=5))
def test_a_cold_load_makes_the_store_that_the_pairs_applied_in_order_make(
    records: list[tuple[str, int, bool]], cuts: list[int]
) -> None:
    """A cold restore appends the topic's pairs to unindexed tables and keeps the last row of
    each key when it builds the indexes; cut into any chunks, it must leave exactly the
    tables (and checkpoint) that applying the pairs one at a time leaves: repeated keys,
    tombstones of states and books, books of keys with and without a state, switches."""
    pairs = []
    for key, n, headers in records:
        value = _pair_value(key, n)
        meta = None
        if headers and value is not None and key in KEYS:
            meta = state_meta(CallState.model_validate_json(value))
        pairs.append((key, value, meta))
    with tempfile.TemporaryDirectory() as tmp:
        one_by_one = LocalStore(Path(tmp) / "a.db", IDENTITY)
        cold = LocalStore(Path(tmp) / "b.db", IDENTITY)
        try:
            for offset, pair in enumerate(pairs):
                one_by_one.apply([pair], offset + 1)
            load = cold.cold_load()
            bounds = sorted({0, len(pairs), *(c for c in cuts if c <= len(pairs))})
            for start, stop in itertools.pairwise(bounds):
                load.add(pairs[start:stop])
            cold.adopt(load, len(pairs))
            assert not load.path.exists()
            assert _rows(cold.conn) == _rows(one_by_one.conn)
            assert cold.checkpoint == one_by_one.checkpoint == len(pairs)
            assert cold.live() == one_by_one.live()
            assert cold.read(KEYS) == one_by_one.read(KEYS)
        finally:
            one_by_one.close()
            cold.close()


def test_an_unfinished_cold_load_leaves_the_store_as_it_was(tmp_path: Path) -> None:
    """A cold restore that dies before its file is adopted changes nothing: the store keeps
    its (empty) tables and checkpoint 0, and the next cold load starts a new file."""
    store = LocalStore(tmp_path / "p0.db", IDENTITY)
    try:
        load = store.cold_load()
        load.add(_pairs(_batches()[0]))
        assert load.path.exists()
        again = store.cold_load()  # the next takeover, after a crash
        assert store.checkpoint == 0 and store.read(KEYS) == {}
        again.add(_pairs(_batches()[1]))
        store.adopt(again, 9)
        assert store.checkpoint == 9
        assert set(store.read(KEYS)) == {KEYS[0]}
    finally:
        store.close()


def test_a_key_expired_and_started_again_in_one_batch_loses_its_old_book(
    tmp_path: Path,
) -> None:
    """The new call of an expired key starts without the old call's approvals, in the file
    and on the topic alike (else an eviction or a restart would bring the old book back)."""
    a = KEYS[0]
    conn = sqlite3.connect(tmp_path / "s.db", isolation_level=None)
    state_table.create(conn)
    state_table.put_batch(
        conn,
        CommitBatch(states={a: _state(a, CallStatus.SUCCEEDED)}, approvals={a: _book("x")}),
        states_partition=0,
    )
    again = CommitBatch(states={a: _state(a, CallStatus.PENDING)}, expired={a})
    state_table.put_batch(conn, again, states_partition=0)
    entry = state_table.read(conn, [a], state_table.IN_CALL_STATE)[a]
    assert entry.state is not None and entry.state.status is CallStatus.PENDING
    assert entry.book is None
    assert ("approvals:" + a, None) in list(topic_pairs(again, 0))


async def test_a_restart_with_a_tiny_cache_keeps_every_unresolved_keys_book() -> None:
    from tests.unit.memory_store import PARTITION, MemoryStore
    from toolledger.processors.executor import Executor
    from toolledger.processors.pipeline import Stages
    from toolledger.processors.tools.redaction import Redactor
    from toolledger.processors.tools.registry import ToolRegistry

    store = MemoryStore()
    for i, key in enumerate(KEYS):
        store.states[key] = _state(key, CallStatus.UNKNOWN)
        store.books[key] = _book(f"apr_{i}")
    executor = Executor(
        [PARTITION],
        store,
        Stages(ToolRegistry(), Redactor(b"k" * 32)),
        store.commit,
        partition_of=lambda _key: PARTITION,
        epoch=1,
        cache_entries=1,
    )
    await executor.start()
    try:
        assert {k: executor.cache.book(k) for k in KEYS} == {
            k: _book(f"apr_{i}") for i, k in enumerate(KEYS)
        }
    finally:
        await executor.stop()


def test_an_executors_stores_are_kept_across_restarts_without_a_flag() -> None:
    # one directory per consumer group, outside any one process's life (a temporary
    # directory of its own would make every restart a full restore)
    assert default_state_dir("toolledger-executor") == (
        Path(tempfile.gettempdir()) / f"toolledger-state-{os.getuid()}" / "toolledger-executor"
    )
    assert default_state_dir("a/../b c").name == "a_.._b_c"  # never a path of its own


def test_the_default_state_directory_is_this_users_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the stores hold call states and results: never readable by other users of the host
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    made = private_state_dir(default_state_dir("g"))
    assert made == tmp_path / f"toolledger-state-{os.getuid()}" / "g"
    for directory in (made, made.parent):
        assert directory.stat().st_mode & 0o777 == 0o700
    assert private_state_dir(made) == made  # as it is on the next start
    made.chmod(0o755)  # opened to others (or made so by someone else): refused
    with pytest.raises(PermissionError, match="--state-dir"):
        private_state_dir(made)
