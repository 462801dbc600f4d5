"""The executor's working set: a bounded cache of call keys over its durable store.

Why answers cannot change with the cache's size (what the differential tests check):

* entries are evicted only by :meth:`KeyCache.trim`, which the executor calls after the write
  of a batch returned, and it decides the next batch only then: an evicted entry is what the
  store holds, so reading it back gives the same entry;
* unresolved calls (PENDING, UNKNOWN) are never evicted: the sweeper and the takeover
  recovery look at them without reading the store, and every key with an action in flight
  (or work queued behind one) is one of them;
* a miss is read from the store, every miss of a decision pass in one read.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable

from toolledger.processors.ledger import CallState
from toolledger.processors.ledger.governance import ApprovalBook
from toolledger.processors.ports import KeyEntry, StateStore
from toolledger.schemas.status import CallStatus

DEFAULT_CACHE_ENTRIES = 16_384  # per executor, shared by its partitions: tens of MB

EMPTY = KeyEntry()
_UNRESOLVED = (CallStatus.PENDING, CallStatus.UNKNOWN)


class NotLoaded(RuntimeError):
    """A key was read without being loaded first: an executor bug."""


class KeyCache:
    def __init__(self, capacity: int, store: StateStore) -> None:
        if capacity < 1:
            raise ValueError(f"a key cache holds at least one entry, not {capacity}")
        self.capacity = capacity
        self._store = store
        self._lru: OrderedDict[str, KeyEntry] = OrderedDict()  # evictable, oldest first
        self._held: dict[str, KeyEntry] = {}  # unresolved: never evicted

    def load(self, keys: Iterable[str]) -> None:
        """Make ``keys`` resident: the ones missing are read from the store in one read."""
        missing = [k for k in keys if k not in self._held and k not in self._lru]
        if not missing:
            return
        found = self._store.read(missing)
        for key in missing:
            self._place(key, found.get(key, EMPTY))

    def trim(self) -> None:
        while len(self._lru) > self.capacity:
            self._lru.popitem(last=False)

    # -- entries ----------------------------------------------------------------------------

    def entry(self, key: str) -> KeyEntry:
        entry = self._held.get(key)
        if entry is None:
            entry = self._lru.get(key)
            if entry is None:
                raise NotLoaded(f"call key {key} read before it was loaded")
            self._lru.move_to_end(key)
        return entry

    def state(self, key: str) -> CallState | None:
        return self.entry(key).state

    def book(self, key: str) -> ApprovalBook | None:
        return self.entry(key).book

    def peek(self, key: str) -> KeyEntry | None:
        """The entry if resident, without touching the order (None: not resident)."""
        return self._held.get(key) or self._lru.get(key)

    def put(self, key: str, entry: KeyEntry) -> None:
        self._place(key, entry)

    def set_state(self, key: str, state: CallState | None) -> None:
        self._place(key, KeyEntry(state, self.entry(key).book))

    def set_book(self, key: str, book: ApprovalBook) -> None:
        self._place(key, KeyEntry(self.entry(key).state, book))

    def forget(self, key: str) -> None:
        """The key expired: known to be unused (the store deletes it in the same write)."""
        self._place(key, EMPTY)

    def unresolved(self) -> dict[str, CallState]:
        return {k: e.state for k, e in self._held.items() if e.state and _unresolved(e)}

    def _place(self, key: str, entry: KeyEntry) -> None:
        if _unresolved(entry):
            self._lru.pop(key, None)
            self._held[key] = entry
        else:
            self._held.pop(key, None)
            self._lru[key] = entry
            self._lru.move_to_end(key)


def _unresolved(entry: KeyEntry) -> bool:
    return entry.state is not None and entry.state.status in _UNRESOLVED
