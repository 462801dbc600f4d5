"""One owned input partition: ordering per key, concurrency across keys, group commit.

Shared by every runtime; a runtime supplies the :class:`~processors.ports.PartitionStore`
(how a batch of outcome events, call states and the input position become durable in one
atomic write).

Timeline of one intent (``commit`` = one atomic write of the whole queued batch)::

    feed(offset) --> [wait for the previous intent of the same key]
      --> admit/decide --> commit(Started, ...)      # transaction 1: durable before the handler
      --> handler (other keys run meanwhile, bounded by ``concurrency``)
      --> commit(Succeeded | Failed | Unknown, position)  # transaction 2: outcome + offset
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
from collections import deque
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from processors.ledger import CallState, Recover, decide, evolve, expires_at
from processors.ledger.governance import (
    APPROVAL_EVENTS,
    ApprovalBook,
    Switch,
    disabled_by,
    evolve_approvals,
    newer,
    switch_key,
    switch_of,
)
from processors.pipeline import Stages
from processors.ports import CommitBatch, DeadLetter, KeyEntry, PartitionStore
from processors.runtime.key_cache import DEFAULT_CACHE_ENTRIES, KeyCache
from schemas.codec import CodecError, decode
from schemas.events import (
    ApprovalDenied,
    ApprovalGranted,
    Event,
    JobStatus,
    ToolCallJobCancelRequested,
    ToolCallJobReported,
    ToolCallKeyExpired,
    ToolCallRejected,
    ToolCallRequested,
    ToolDisabled,
    ToolEnabled,
)
from schemas.status import CallStatus

log = logging.getLogger("toolledger.partition")

_EXPIRY_PAGE = 256  # keys per read of the store's due keys
_EXPIRY_PAGES_PER_SWEEP = 16


# What the intents stream carries: calls, and operators' decisions and switches.
# (A ToolCallRejected there is a refusal the front door gave itself, for the audit trail.)
Inbound = (
    ToolCallRequested
    | ApprovalGranted
    | ApprovalDenied
    | ToolDisabled
    | ToolEnabled
    | ToolCallRejected
    | ToolCallJobReported
    | ToolCallJobCancelRequested
)
_INBOUND = (
    ToolCallRequested,
    ApprovalGranted,
    ApprovalDenied,
    ToolDisabled,
    ToolEnabled,
    ToolCallRejected,
    ToolCallJobReported,
    ToolCallJobCancelRequested,
)
_POLL_BACKOFF_BASE_S = 0.1
_POLL_BACKOFF_CAP_S = 5.0
_POLL_JITTER = 0.5  # a poll's wait is drawn from [50%, 100%] of its backoff


class PartitionFailed(RuntimeError):
    """The partition's store refused a write; this worker must stop and do nothing more."""


@dataclass(slots=True)
class _Pending:
    events: Sequence[Event]
    done_offset: int | None
    future: asyncio.Future[None]
    dead_letter: DeadLetter | None = None


class _Watermark:
    """Input position = one past the longest prefix of fed offsets that is fully processed."""

    def __init__(self, position: int) -> None:
        self.position = position
        self._inflight: deque[list[int | bool]] = deque()

    def fed(self, offset: int) -> None:
        last = int(self._inflight[-1][0]) if self._inflight else self.position - 1
        if offset <= last:
            raise ValueError(f"offset {offset} fed after {last}: input must only move forward")
        self._inflight.append([offset, False])

    def done(self, offset: int) -> None:
        for item in self._inflight:
            if item[0] == offset and not item[1]:
                item[1] = True
                break
        while self._inflight and self._inflight[0][1]:
            self.position = max(self.position, int(self._inflight.popleft()[0]) + 1)


class PartitionWorker:
    def __init__(
        self,
        partition: int,
        position: int,
        store: PartitionStore,
        stages: Stages,
        *,
        epoch: int,
        concurrency: int = 64,
        max_record_bytes: int = 2 << 20,
        on_committed: Callable[[Sequence[Event]], None] | None = None,
        sweep_interval_s: float = 1.0,
        cache_entries: int = DEFAULT_CACHE_ENTRIES,
    ) -> None:
        self.partition = partition
        self.epoch = epoch
        self.cache = KeyCache(cache_entries, store.read)
        self.switches: dict[str, Switch] = {}
        self._store = store
        self._stages = stages
        self._sem = asyncio.Semaphore(concurrency)
        self._max_record_bytes = max_record_bytes
        self._on_committed = on_committed
        self._sweep_interval_s = sweep_interval_s
        self._watermark = _Watermark(position)
        self._tails: dict[str, asyncio.Task[None]] = {}  # the last task of each key's chain
        self._tasks: set[asyncio.Task[None]] = set()  # every task still running
        self._queue: list[_Pending] = []
        self._wakeup = asyncio.Event()
        self._failed: BaseException | None = None
        self._background: list[asyncio.Task[None]] = []
        self._sweeping: set[str] = set()
        self._unknown: set[str] = set()  # keys in UNKNOWN: what the sweeper looks at
        self._jobs: set[str] = set()  # PENDING keys whose job runs: the sweeper polls them
        self._polls: dict[str, tuple[int, float]] = {}  # key -> (polls so far, next, monotonic)
        self._skip: set[int] = set()  # refused before a restart: not decided again
        self._refused: set[int] = set()  # offsets past the position answered with a refusal
        self._stored_refused: list[int] = []
        self._expiry_cursors: dict[str, tuple[float, str] | None] = {}  # by tool

    @property
    def position(self) -> int:
        return self._watermark.position

    @property
    def failed(self) -> BaseException | None:
        return self._failed

    async def start(self) -> None:
        snapshot = await self._store.load(self.partition)
        for key, state in snapshot.states.items():  # unresolved: held, never evicted
            self.cache.put(key, KeyEntry(state, snapshot.approvals.get(key)))
        self.switches = snapshot.switches
        # Refused before a crash or a takeover while an earlier offset still ran: not decided
        # again on the re-read (a switch turned back on could otherwise let it run after
        # all). Other answers are safe to decide again: a finished call is replayed.
        self._skip = {o for o in snapshot.refused if o >= self.position}
        self._refused = set(self._skip)
        self._stored_refused = sorted(self._skip)
        recovered: list[Event] = []
        now = self._stages.clock.now()
        for key, state in snapshot.states.items():
            if state.status is CallStatus.PENDING:
                events = decide(state, Recover(now=now)).events
                for event in events:
                    state = evolve(state, event) or state
                self.cache.set_state(key, state)
                recovered.extend(events)
        unresolved = self.cache.unresolved()
        self._unknown = {k for k, st in unresolved.items() if st.status is CallStatus.UNKNOWN}
        self._jobs = {k for k, st in unresolved.items() if _job_runs(st)}
        if recovered:
            log.info(
                "recovered in-flight calls as UNKNOWN",
                extra={"partition": self.partition, "count": len(recovered)},
            )
            await self._store.commit(
                CommitBatch(
                    self.partition,
                    recovered,
                    {e.call_key: self._known(e.call_key) for e in recovered},
                )
            )
            self._notify(recovered)
        self._background = [
            asyncio.create_task(self._flusher()),
            asyncio.create_task(self._sweeper()),
        ]
        for task in self._background:
            task.add_done_callback(self._watch)

    async def feed(self, offset: int, value: bytes) -> None:
        """Hand over the next input record; returns once it is scheduled (back-pressure)."""
        if self._failed is not None:
            raise PartitionFailed(f"partition {self.partition} stopped") from self._failed
        await self._sem.acquire()
        if self._failed is not None:  # failed or stopped while we waited for a permit
            self._sem.release()
            raise PartitionFailed(f"partition {self.partition} stopped") from self._failed
        try:
            self._watermark.fed(offset)
        except ValueError:
            self._sem.release()
            raise
        if offset in self._skip:  # its refusal is on the log already
            self._skip.discard(offset)
            self._spawn(f"refused:{offset}", self.commit((), offset))
            return
        intent = self._decode(offset, value)
        if isinstance(intent, DeadLetter):
            self._spawn(f"dead:{offset}", self._dead_letter(intent))
            return
        port = _IntentPort(self, offset)
        if isinstance(intent, ToolDisabled | ToolEnabled):
            # in force from now on: intents fed before it but not yet decided see it too
            self._apply_switch(switch_of(intent))
            self._spawn(intent.intent_id, self._stages.run_switch(intent, port, self.partition))
            return
        if isinstance(intent, ApprovalGranted | ApprovalDenied):
            self._spawn(
                intent.call_key,
                self._stages.run_approval_decision(intent, port),
                key=intent.call_key,
            )
            return
        if isinstance(intent, ToolCallRejected):
            self._spawn(intent.intent_id, self._stages.run_door_refusal(intent, port))
            return
        if isinstance(intent, ToolCallJobReported | ToolCallJobCancelRequested):
            # on the key's chain: in order with the sweeper's polls of the same job
            work = (
                self._stages.run_job_report(intent, port)
                if isinstance(intent, ToolCallJobReported)
                else self._stages.run_job_cancel(intent, port)
            )
            self._spawn(intent.call_key, work, key=intent.call_key)
            return
        keyed = bool(intent.envelope.idempotency_key)
        chain = intent.call_key if keyed else intent.intent_id
        refused_on = self._refused_now(intent) if chain in self._tails else None
        if refused_on is not None:  # answered now, not after the running call: see below
            chain = intent.intent_id
            port = _IntentPort(self, offset, frozen=refused_on)
        self._spawn(
            chain, self._stages.run_intent(intent, port), key=intent.call_key if keyed else None
        )

    def _refused_now(self, intent: ToolCallRequested) -> _Frozen | None:
        """Invalid input, or the same key with other arguments while the key's first call is
        known and cannot have expired by the intent's time: refuse at once instead of after
        the call that holds the key. Returns the state it is decided on, taken now (None:
        queued on the key's chain).

        Neither answer depends on the running call's outcome: admission looks at the intent
        alone, and until the key expires its first accepted digest never changes. The state
        is taken now because the running call may expire the key and start it again meanwhile:
        decided on that, the intent could run beside it.
        """
        try:
            admitted = self._stages.admit(intent)
        except Exception:  # admit answers bad input as data; anything else takes the chain
            return None
        entry = self.cache.peek(intent.call_key)  # not loaded yet: decided on the chain
        state = None if entry is None else entry.state
        if isinstance(admitted, ToolCallRejected):
            return _Frozen(state)  # refused before any state is looked at
        if state is None or admitted.context.args_digest == state.args_digest:
            return None
        due = expires_at(state, self._stages.registry.policy(admitted.tool))
        if due is not None and intent.envelope.occurred_at >= due:
            return None  # the key may be new again for it: the chain decides
        return _Frozen(state)

    async def drain(self) -> None:
        """Wait until everything fed so far is committed."""
        while self._tails:
            await asyncio.gather(*list(self._tails.values()), return_exceptions=True)
        if self._failed is not None:
            raise PartitionFailed(f"partition {self.partition} stopped") from self._failed

    async def stop(self) -> None:
        """Cancel everything this worker runs: every spawned task, not only the last one of
        each key's chain (an earlier one left running would race the partition's next owner)."""
        self._fail(PartitionFailed("stopped"))
        tasks = [*self._tasks, *self._background]
        for task in tasks:
            task.cancel()
        self.cache.close()
        for task in tasks:
            with contextlib.suppress(BaseException):
                await task

    # -- internals ------------------------------------------------------------------------

    def _decode(self, offset: int, value: bytes) -> Inbound | DeadLetter:
        def dead(reason: str) -> DeadLetter:
            # the record may carry raw arguments, which live only on the intents stream: the
            # dead letter points at it (partition, offset) and names it by digest and size
            digest = hashlib.sha256(value).hexdigest()[:16]
            return DeadLetter(offset, f"{reason} ({len(value)} bytes, sha256 {digest})", b"")

        if len(value) > self._max_record_bytes:
            return dead(f"record of {len(value)} bytes exceeds {self._max_record_bytes}")
        try:
            event = decode(value)
        except CodecError as exc:
            return dead(f"undecodable record: {exc}")
        if not isinstance(event, _INBOUND):
            return dead(f"unexpected {event.TYPE} on the intents stream")
        return event

    async def _dead_letter(self, letter: DeadLetter) -> None:
        log.warning(
            "dead-lettered an input record",
            extra={"partition": self.partition, "offset": letter.offset, "reason": letter.reason},
        )
        await self.commit((), letter.offset, dead_letter=letter)

    def _spawn(
        self, chain: str, work: Coroutine[Any, Any, None], *, key: str | None = None
    ) -> None:
        """Run ``work`` after the chain's previous task. ``key``: the call key it reads or
        writes, pinned in the cache from now until the work is done, and loaded before it."""
        previous = self._tails.get(chain)
        if key is not None:
            self.cache.pin(key)

        async def run() -> None:
            try:
                if previous is not None:
                    await asyncio.wait([previous])
                if key is not None:
                    await self.cache.load(key)
                await work
            except PartitionFailed:
                pass
            except asyncio.CancelledError:
                raise
            except BaseException as exc:
                log.exception(
                    "executor bug: stopping the partition", extra={"partition": self.partition}
                )
                self._fail(exc)
            finally:
                work.close()  # no-op if it ran; stops a never-started one from leaking
                if key is not None:
                    self.cache.unpin(key)
                self._sem.release()
                self._tasks.discard(task)
                if self._tails.get(chain) is task:
                    del self._tails[chain]

        task = asyncio.create_task(run())
        self._tails[chain] = task
        self._tasks.add(task)

    async def commit(
        self,
        events: Sequence[Event],
        done_offset: int | None,
        *,
        dead_letter: DeadLetter | None = None,
    ) -> None:
        if self._failed is not None:
            raise PartitionFailed(f"partition {self.partition} stopped") from self._failed
        if not events and done_offset is None:
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queue.append(_Pending(events, done_offset, future, dead_letter))
        self._wakeup.set()
        await future

    async def _flusher(self) -> None:
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            pending, self._queue = self._queue, []
            if not pending:
                continue
            batch = CommitBatch(self.partition)
            for item in pending:
                for event in item.events:
                    self._evolve(event, batch)
                    batch.events.append(event)
                if item.dead_letter is not None:
                    batch.dead_letters.append(item.dead_letter)
                if item.done_offset is not None:
                    self._watermark.done(item.done_offset)
                    if any(isinstance(e, ToolCallRejected) for e in item.events):
                        self._refused.add(item.done_offset)
            batch.next_offset = position = self._watermark.position
            self._refused = {o for o in self._refused if o >= position}
            refused = sorted(self._refused)
            if refused != self._stored_refused:
                batch.refused = refused
            try:
                await self._store.commit(batch)
            except BaseException as exc:
                self._fail(exc)
                for item in pending:
                    if not item.future.done():
                        item.future.set_exception(
                            PartitionFailed(f"partition {self.partition}: commit failed")
                        )
                if isinstance(exc, asyncio.CancelledError):
                    raise
                log.error(
                    "commit failed: stopping the partition",
                    extra={"partition": self.partition, "error": type(exc).__name__},
                )
                return
            if batch.refused is not None:
                self._stored_refused = batch.refused
            for item in pending:
                if not item.future.done():
                    item.future.set_result(None)
            self._notify(batch.events)

    def _notify(self, events: Sequence[Event]) -> None:
        if self._on_committed is not None and events:
            try:
                self._on_committed(events)
            except Exception:  # a listener's bug must not stop the commits
                log.exception("on_committed callback failed", extra={"partition": self.partition})

    def _watch(self, task: asyncio.Task[None]) -> None:
        """A background task that ends with an error stops the partition (never silently)."""
        if not task.cancelled() and task.exception() is not None:
            log.error(
                "partition background task died",
                extra={"partition": self.partition},
                exc_info=task.exception(),
            )
            self._fail(task.exception() or RuntimeError("background task died"))

    def fail(self, exc: BaseException) -> None:
        """Stop this worker: no more records, no more commits (its owner re-acquires)."""
        self._fail(exc)

    def _fail(self, exc: BaseException) -> None:
        if self._failed is None:
            self._failed = exc
        for item in self._queue:
            if not item.future.done():
                item.future.set_exception(PartitionFailed(f"partition {self.partition} stopped"))
        self._queue = []

    async def _sweeper(self) -> None:
        while True:
            await asyncio.sleep(self._sweep_interval_s)
            now = self._stages.clock.now()
            for key in sorted((self._unknown | self._jobs) - self._sweeping):
                if not self._sweep_due(key, now):
                    continue
                await self._sem.acquire()
                if not self._sweep_due(key, now):  # resolved (and evictable) while we waited
                    self._sem.release()
                    continue
                self._sweeping.add(key)
                if _job_runs(self._known(key)):
                    polls, _ = self._polls.get(key, (0, 0.0))
                    wait = min(_POLL_BACKOFF_CAP_S, _POLL_BACKOFF_BASE_S * 2.0 ** min(polls, 8))
                    # jitter: jobs started together would otherwise be polled in one burst
                    # per cap period for ever (bench/jobs_polling.py saw 1,000 in one sweep)
                    wait *= 1.0 - _POLL_JITTER * self._stages.rng.random()
                    self._polls[key] = (polls + 1, self._stages.clock.monotonic() + wait)
                self._spawn(key, self._sweep(key), key=key)
            await self._expire_due(now)

    def _sweep_due(self, key: str, now: datetime) -> bool:
        """An UNKNOWN key whose tool can reconcile it, past its backoff, with no task on it."""
        if (key not in self._unknown and key not in self._jobs) or key in self._tails:
            return False
        state = self._known(key)  # unresolved: held in the cache
        tool = self._stages.registry.get(state.context.tool)
        if tool is not None and _job_runs(state):
            # a job: polled with backoff, and timed out when its time is up
            if tool.poll is None:
                return False
            timeout = tool.job_timeout_s
            assert state.job is not None
            if (
                state.status is CallStatus.PENDING
                and timeout is not None
                and now >= state.job.started_at + timedelta(seconds=timeout)
            ):
                return True
            return self._polls.get(key, (0, 0.0))[1] <= self._stages.clock.monotonic()
        if tool is None or tool.reconcile is None:
            return False
        wait = min(60.0, 2.0 ** min(state.reconcile_attempts, 6))
        return state.updated_at + timedelta(seconds=wait) <= now

    def _evolve(self, event: Event, batch: CommitBatch) -> None:
        key = event.call_key
        if isinstance(event, APPROVAL_EVENTS):
            book = evolve_approvals(self.cache.book(key), event)
            if book is not None:
                self.cache.set_book(key, book)
                batch.approvals[key] = book
        elif isinstance(event, ToolDisabled | ToolEnabled):
            switch = switch_of(event)
            self._apply_switch(switch)
            batch.switches[switch_key(switch.tenant_id, switch.tool)] = self.switches[
                switch_key(switch.tenant_id, switch.tool)
            ]
        elif isinstance(event, ToolCallKeyExpired):
            # forgotten: the key is new again (the audit trail keeps its history)
            self.cache.forget(key)
            self._unknown.discard(key)
            self._jobs.discard(key)
            self._polls.pop(key, None)
            batch.states.pop(key, None)
            batch.approvals.pop(key, None)
            batch.expired.add(key)
        elif isinstance(event, ToolCallRejected) or not event.envelope.idempotency_key:
            pass  # a refusal or a read-only call: no key state (their keys are not loaded)
        else:
            old = self.cache.state(key)
            new = evolve(old, event)
            if new is not None and new is not old:  # a replay leaves it as it is: not rewritten
                self._set_state(key, new)
                batch.states[key] = new
                # expired and started again in one batch: the key stays in ``expired``, so
                # the stores delete the old row and book (tombstones) before writing the new

    def _apply_switch(self, switch: Switch) -> None:
        key = switch_key(switch.tenant_id, switch.tool)
        if newer(self.switches.get(key), switch):
            self.switches[key] = switch

    def _set_state(self, key: str, state: CallState) -> None:
        self.cache.set_state(key, state)
        if state.status is CallStatus.UNKNOWN:
            self._unknown.add(key)
        else:
            self._unknown.discard(key)
        if _job_runs(state):
            self._jobs.add(key)
        else:
            self._jobs.discard(key)
            self._polls.pop(key, None)

    def _known(self, key: str) -> CallState:
        state = self.cache.state(key)
        assert state is not None, f"{key} has no state"
        return state

    async def _expire_due(self, now: datetime) -> None:
        """Keys whose retention may have passed get their expiry decided by the core (one
        task each, on the key's chain). The store is asked per tool, with the tool's retention
        as it is now, a page at a time from a cursor: a key kept by an open approval does not
        hold the keys behind it back."""
        for tool in self._stages.registry:
            retention = self._stages.registry.policy(tool).key_retention_s
            if retention is None:
                continue
            settled_before = (now - timedelta(seconds=retention)).timestamp()
            for _ in range(_EXPIRY_PAGES_PER_SWEEP):
                after = self._expiry_cursors.get(tool.name)
                page = await self._store.due(tool.name, settled_before, after, _EXPIRY_PAGE)
                self._expiry_cursors[tool.name] = page[-1] if len(page) == _EXPIRY_PAGE else None
                for _settled, key in page:
                    if key in self._tails:
                        continue  # in use: looked at again on a later pass
                    await self._sem.acquire()
                    if self._failed is not None:
                        self._sem.release()
                        return
                    self._spawn(key, self._stages.run_expiry(key, _IntentPort(self, None)), key=key)
                if len(page) < _EXPIRY_PAGE:
                    break

    async def _sweep(self, key: str) -> None:
        try:
            await self._stages.run_sweep(key, _IntentPort(self, None))
        finally:
            self._sweeping.discard(key)


def _job_runs(state: CallState) -> bool:
    """A call whose job runs: PENDING (polled) or UNKNOWN after its timeout (polled too)."""
    return (
        state.job is not None
        and state.job.status is JobStatus.RUNNING
        and state.status in (CallStatus.PENDING, CallStatus.UNKNOWN)
    )


@dataclass(frozen=True, slots=True)
class _Frozen:
    state: CallState | None


class _IntentPort:
    """The :class:`~processors.ports.CallPort` of one input record (or of a sweep);
    ``frozen``: the key's state as it was when the record was refused at once."""

    __slots__ = ("_frozen", "_offset", "_worker", "epoch")

    def __init__(
        self, worker: PartitionWorker, offset: int | None, *, frozen: _Frozen | None = None
    ) -> None:
        self._worker = worker
        self._offset = offset
        self._frozen = frozen
        self.epoch = worker.epoch

    def state(self, call_key: str) -> CallState | None:
        if self._frozen is not None:
            return self._frozen.state
        return self._worker.cache.state(call_key)

    def approvals(self, call_key: str) -> ApprovalBook | None:
        return self._worker.cache.book(call_key)

    def disabled(self, tenant_id: str, tool: str) -> Switch | None:
        return disabled_by(self._worker.switches, tenant_id, tool)

    async def commit(self, events: Sequence[Event], *, final: bool) -> None:
        await self._worker.commit(events, self._offset if final else None)
