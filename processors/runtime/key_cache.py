"""A partition worker's working set: a bounded cache of call keys over its durable store.

Why answers cannot change with the cache's size (what the differential tests check):

* every task that reads or writes a key *pins* it before it is queued and unpins it when it
  is done; a pinned key is never evicted, and its first task loads it before it runs;
* only a key's pinned tasks change its entry, and a task is done only after its commits
  returned, so an entry that becomes evictable is already what the store holds;
* unresolved calls (PENDING, UNKNOWN) are never evicted: the sweeper and the takeover
  recovery look at them without a task of their own.

A miss is read in the store's own time (a thread), in batches: every key missed while a
read runs is read by the next one, so a burst of new keys costs a few reads, not one each.
"""

from __future__ import annotations

import asyncio
from collections import Counter, OrderedDict
from collections.abc import Awaitable, Callable, Mapping, Sequence

from processors.ledger import CallState
from processors.ledger.governance import ApprovalBook
from processors.ports import KeyEntry
from schemas.status import CallStatus

DEFAULT_CACHE_ENTRIES = 16_384  # per executor, shared by its partitions: tens of MB

ReadKeys = Callable[[Sequence[str]], Awaitable[Mapping[str, KeyEntry]]]

_EMPTY = KeyEntry()
_UNRESOLVED = (CallStatus.PENDING, CallStatus.UNKNOWN)


class NotLoaded(RuntimeError):
    """A key was read without being pinned and loaded first: an executor bug."""


class KeyCache:
    def __init__(self, capacity: int, read: ReadKeys) -> None:
        if capacity < 1:
            raise ValueError(f"a key cache holds at least one entry, not {capacity}")
        self.capacity = capacity
        self._read = read
        self._lru: OrderedDict[str, KeyEntry] = OrderedDict()  # evictable, oldest first
        self._held: dict[str, KeyEntry] = {}  # pinned or unresolved: never evicted
        self._pins: Counter[str] = Counter()
        self._loading: dict[str, asyncio.Future[None]] = {}
        self._wanted: list[str] = []
        self._loader: asyncio.Task[None] | None = None

    # -- pins and loads -----------------------------------------------------------------

    def pin(self, key: str) -> None:
        self._pins[key] += 1
        entry = self._lru.pop(key, None)
        if entry is not None:
            self._held[key] = entry

    def unpin(self, key: str) -> None:
        self._pins[key] -= 1
        if self._pins[key] > 0:
            return
        del self._pins[key]
        entry = self._held.get(key)
        if entry is not None and not _unresolved(entry):
            del self._held[key]
            self._lru[key] = entry
            self._trim()

    async def load(self, key: str) -> None:
        """Make a pinned key resident (read from the store on a miss)."""
        if key in self._held or key in self._lru:
            return
        future = self._loading.get(key)
        if future is None:
            future = self._loading[key] = asyncio.get_running_loop().create_future()
            self._wanted.append(key)
            if self._loader is None:
                self._loader = asyncio.create_task(self._read_wanted())
        await asyncio.shield(future)

    async def _read_wanted(self) -> None:
        try:
            while self._wanted:
                keys, self._wanted = self._wanted, []
                try:
                    found = await self._read(keys)
                except BaseException as exc:
                    for key in keys:
                        future = self._loading.pop(key)
                        if not future.done():  # close() may have cancelled it
                            future.set_exception(exc)
                    if isinstance(exc, asyncio.CancelledError):
                        raise
                    continue
                for key in keys:
                    self._place(key, found.get(key, _EMPTY))
                    future = self._loading.pop(key)
                    if not future.done():
                        future.set_result(None)
        finally:
            self._loader = None

    def close(self) -> None:
        if self._loader is not None:
            self._loader.cancel()
        for future in self._loading.values():
            if not future.done():
                future.cancel()

    # -- entries ----------------------------------------------------------------------------

    def state(self, key: str) -> CallState | None:
        return self._entry(key).state

    def book(self, key: str) -> ApprovalBook | None:
        return self._entry(key).book

    def peek(self, key: str) -> KeyEntry | None:
        """The entry if resident, without touching the order (None: not resident)."""
        return self._held.get(key) or self._lru.get(key)

    def _entry(self, key: str) -> KeyEntry:
        entry = self._held.get(key)
        if entry is None:
            entry = self._lru.get(key)
            if entry is None:
                raise NotLoaded(f"call key {key} read before it was loaded")
            self._lru.move_to_end(key)
        return entry

    def put(self, key: str, entry: KeyEntry) -> None:
        """An entry as the store holds it (the worker's start: its unresolved calls)."""
        self._place(key, entry)

    def set_state(self, key: str, state: CallState | None) -> None:
        self._place(key, KeyEntry(state, self._entry(key).book))

    def set_book(self, key: str, book: ApprovalBook) -> None:
        self._place(key, KeyEntry(self._entry(key).state, book))

    def forget(self, key: str) -> None:
        """The key expired: known to be unused (the store deletes it in the same commit)."""
        self._place(key, _EMPTY)

    def unresolved(self) -> dict[str, CallState]:
        return {k: e.state for k, e in self._held.items() if e.state and _unresolved(e)}

    def _place(self, key: str, entry: KeyEntry) -> None:
        if key in self._pins or _unresolved(entry):
            self._lru.pop(key, None)
            self._held[key] = entry
        else:
            self._held.pop(key, None)
            self._lru[key] = entry
            self._lru.move_to_end(key)
            self._trim()

    def _trim(self) -> None:
        while len(self._lru) > self.capacity:
            self._lru.popitem(last=False)


def _unresolved(entry: KeyEntry) -> bool:
    return entry.state is not None and entry.state.status in _UNRESOLVED
