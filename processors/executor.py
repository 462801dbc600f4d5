"""The executor core: decides a batch at a time; shared by the embedded and the Kafka runtime.

::

    submit / feed ─> pending ─┐                               ┌─> publish the events (answers)
    action outcomes ──────────┴─> one decision pass ─> batch ─┤  write(batch): ONE atomic write
    sweeps, expiries ─────────┘   (the pure core, in order)   └─> start the actions it decided

A pass takes everything pending (inputs, finished actions, sweeps, expiries), decides each in
arrival order with the pure core (``decide``/``evolve``), folds the events into the working
set, and hands the runtime one :class:`~processors.ports.CommitBatch` to write. Only after
the write returned are the batch's events published (callers are answered from them) and the
actions it decided started. Inputs arriving while a batch is written wait for the next pass,
so the batch grows with the load (group commit) and a pass costs the same whatever its size.

Per call key, work is strictly ordered: while an action of a key runs (a handler with its
backoff, a reconcile query, a poll, a cancel), further work for the key waits in the key's
queue and is decided in the pass that decides the action's outcome. Two answers do not need
the running call and are given at once: an input refused by admission, and the same key
with other arguments (its first digest cannot change while the call runs).

Executor invariant (docs/architecture.md#the-executor-invariant), as kept here:

    A tool handler runs for a call key only after a ``ToolCallStarted`` for that key has been
    committed by the current owner of its partition. On taking over a partition, a key found
    PENDING with no terminal event becomes UNKNOWN and goes to reconcile; it is never re-run
    blind.

* an action is started from :meth:`Executor._committed`, after ``write`` returned for the
  batch holding its Started event; a write that raises stops the executor (no action of that
  batch or any later one starts);
* :meth:`Executor.start` decides ``Recover`` for every PENDING key of the store's snapshot and
  writes those UNKNOWN events before it decides anything else.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import random
from collections import deque
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from opentelemetry.trace import Span

from toolledger.processors import tracing
from toolledger.processors.key_cache import DEFAULT_CACHE_ENTRIES, KeyCache
from toolledger.processors.ledger import (
    Action,
    AttemptFinished,
    AttemptOutcome,
    CallContext,
    CallState,
    Cancel,
    ChangeSwitch,
    Command,
    DecideApproval,
    Execute,
    Expire,
    Gate,
    JobCancelled,
    JobOutcome,
    JobUpdate,
    Poll,
    ReconcileFinished,
    ReconcileOutcome,
    Recover,
    RequestCancel,
    Submit,
    Sweep,
    Verdict,
    decide,
    evolve,
    expires_at,
)
from toolledger.processors.ledger.governance import (
    APPROVAL_EVENTS,
    Switch,
    evolve_approvals,
    newer,
    switch_key,
    switch_of,
    switched_off,
)
from toolledger.processors.ports import (
    Admitted,
    Clock,
    CommitBatch,
    DeadLetter,
    KeyEntry,
    StateStore,
    SystemClock,
    ToolStages,
    Write,
)
from toolledger.schemas.codec import CodecError, decode
from toolledger.schemas.errors import ErrorCode, ErrorInfo
from toolledger.schemas.events import (
    ApprovalDenied,
    ApprovalGranted,
    ApprovalRequested,
    Envelope,
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
from toolledger.schemas.keys import call_key_of
from toolledger.schemas.status import CallStatus

log = logging.getLogger("toolledger.executor")

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
INBOUND = (
    ToolCallRequested,
    ApprovalGranted,
    ApprovalDenied,
    ToolDisabled,
    ToolEnabled,
    ToolCallRejected,
    ToolCallJobReported,
    ToolCallJobCancelRequested,
)
_KEYED = (ApprovalGranted, ApprovalDenied, ToolCallJobReported, ToolCallJobCancelRequested)

DEFAULT_CONCURRENCY = 256  # actions running at once (handlers, reconciles, polls, cancels)
_EXPIRY_PAGE = 256  # keys per read of the store's due keys
_EXPIRY_PAGES_PER_SWEEP = 16
_POLL_BACKOFF_BASE_S = 0.1
_POLL_BACKOFF_CAP_S = 5.0
_POLL_JITTER = 0.5  # a poll's wait is drawn from [50%, 100%] of its backoff


class ExecutorStopped(RuntimeError):
    """The executor's write failed or it was stopped: it decides and starts nothing more."""


# -- work: what a pass decides --------------------------------------------------------------


@dataclass(slots=True)
class _Input:
    """A record from the intents stream (or a caller in this process)."""

    record: Inbound
    partition: int
    offset: int | None  # its input position; None: not from a stream (nothing to commit)
    admitted: Admitted | ToolCallRejected | None = None
    run: tracing.Run | None = None


@dataclass(slots=True, eq=False)
class _Flight:
    """The action a key (or a read-only call) has in flight, and what it runs with."""

    key: str | None  # None: a read-only call
    partition: int
    admitted: Admitted
    by_intent: bool  # a caller's intent started it (else the sweeper)
    action: Action | None  # None: a read-only call's handler
    # the input it answers, while nothing durable records that input yet (a read-only call;
    # an intent whose first decision was only an action, e.g. a reconcile): the input is done
    # (its offset may be committed) with the first events the flight writes
    input: _Input | None = None
    task: asyncio.Task[None] | None = None
    timer: asyncio.TimerHandle | None = None
    run: tracing.Run | None = None


@dataclass(slots=True)
class _Done:
    """A flight's action finished: its outcome, to be decided."""

    flight: _Flight
    outcome: AttemptOutcome | ReconcileOutcome | JobOutcome | ErrorInfo | Event | None
    duration_ms: float = 0.0


@dataclass(slots=True)
class _Sweep:
    key: str
    partition: int


@dataclass(slots=True)
class _Expire:
    key: str
    partition: int


@dataclass(slots=True)
class _Dead:
    """An input record that cannot be decided (``letter``), or one refused before a restart
    (``letter`` None: its refusal is on the log already), at ``offset``."""

    partition: int
    offset: int | None
    letter: DeadLetter | None


_Work = _Input | _Done | _Sweep | _Expire | _Dead


@dataclass(slots=True)
class _Pass:
    """One pass's batch and what follows its write."""

    batch: CommitBatch = field(default_factory=CommitBatch)
    start: list[_Flight] = field(default_factory=list)
    spans: list[Span] = field(default_factory=list)  # commit spans, ended once written
    ending: list[tracing.Run] = field(default_factory=list)  # runs over once it is written
    # inputs fully decided by this batch: (partition, offset, whether it was refused)
    done: list[tuple[int, int, bool]] = field(default_factory=list)
    intents: list[str] = field(default_factory=list)  # of the inputs decided in this pass


class _Watermark:
    """Input position = one past the longest prefix of fed offsets that is fully decided."""

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


class Executor:
    """Decides the calls of ``partitions``, a batch at a time (see the module's docstring).

    ``write``: makes a batch durable in one atomic write, or raises (the runtime's).
    ``partition_of``: the log partition of a call key. ``on_committed``: told the events of
    every batch once written (the answers to waiting callers are among them).
    ``on_abandoned``: told, when a write fails, the intent ids of the inputs that will not be
    answered (decided in the failed batch, or not decided yet): nothing of them is durable,
    so their callers may call again with the same key."""

    def __init__(
        self,
        partitions: Collection[int],
        store: StateStore,
        stages: ToolStages,
        write: Write,
        *,
        partition_of: Callable[[str], int],
        epoch: int,
        clock: Clock | None = None,
        on_committed: Callable[[Sequence[Event]], None] | None = None,
        on_abandoned: Callable[[list[str], BaseException], None] | None = None,
        concurrency: int = DEFAULT_CONCURRENCY,
        cache_entries: int = DEFAULT_CACHE_ENTRIES,
        sweep_interval_s: float = 1.0,
        max_record_bytes: int = 2 << 20,
        rng: Callable[[], float] | None = None,
    ) -> None:
        self.partitions = frozenset(partitions)
        self.epoch = epoch
        self.cache = KeyCache(cache_entries, store)
        self.switches: dict[str, Switch] = {}
        self._store = store
        self._stages = stages
        self._write = write
        self._partition_of = partition_of
        self._clock = clock or SystemClock()
        self._random = rng or _default_random()
        self._on_committed = on_committed
        self._on_abandoned = on_abandoned
        self._concurrency = concurrency
        self._sweep_interval_s = sweep_interval_s
        self._max_record_bytes = max_record_bytes
        self._pending: list[_Work] = []
        self._queues: dict[str, deque[_Work]] = {}  # work waiting for a busy key
        self._flights: dict[str, _Flight] = {}  # busy keys' actions
        self._reads: set[_Flight] = set()  # read-only calls running
        self._watermarks: dict[int, _Watermark] = {}
        self._skip: dict[int, set[int]] = {}  # refused before a restart: not decided again
        self._refused: dict[int, set[int]] = {}  # offsets past the position answered refused
        self._stored_refused: dict[int, list[int]] = {}
        self._unknown: set[str] = set()  # keys in UNKNOWN: what the sweeper looks at
        self._jobs: set[str] = set()  # keys whose job runs: the sweeper polls them
        self._sweeping: set[str] = set()
        self._polls: dict[str, tuple[int, float]] = {}  # key -> (polls so far, next monotonic)
        self._expiry_cursors: dict[str, tuple[float, str] | None] = {}  # by tool
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._writing = False
        self._failed: BaseException | None = None
        self._loop_task: asyncio.Task[None] | None = None
        self._sweeper: asyncio.Task[None] | None = None
        self._space = asyncio.Event()  # set while fed work is below the concurrency limit
        self._space.set()
        self._run: tracing.Run | None = None  # the traced run being decided (tracing on)
        self._continued = False  # whether the item being decided goes on after this pass

    # -- the runtime's side -------------------------------------------------------------

    @property
    def failed(self) -> BaseException | None:
        return self._failed

    @property
    def polled_jobs(self) -> int:
        """Calls whose job runs: the sweeper polls them."""
        return len(self._jobs)

    def position(self, partition: int) -> int:
        mark = self._watermarks.get(partition)
        return 0 if mark is None else mark.position

    async def start(self) -> None:
        """Load the store's snapshot, recover its PENDING calls as UNKNOWN (written before
        anything else is decided), and start deciding."""
        snapshot = self._store.load()
        for key, state in snapshot.states.items():  # unresolved: held, never evicted
            self.cache.put(key, KeyEntry(state, snapshot.approvals.get(key)))
        self.switches = dict(snapshot.switches)
        for p in self.partitions:
            position = snapshot.positions.get(p, 0)
            self._watermarks[p] = _Watermark(position)
            # Refused before a crash or a takeover while an earlier offset still ran: not
            # decided again on the re-read (a switch turned back on could otherwise let it
            # run after all). Other answers are safe to decide again: a finished call is
            # replayed, a started one was recovered as UNKNOWN.
            skip = {o for o in snapshot.refused.get(p, frozenset()) if o >= position}
            self._skip[p] = set(skip)
            self._refused[p] = set(skip)
            self._stored_refused[p] = sorted(skip)
        recovered = _Pass()
        now = self._clock.now()
        for key, state in snapshot.states.items():
            if state.status is CallStatus.PENDING:
                events = decide(state, Recover(now=now)).events
                self._apply(events, self._partition_of(key), recovered)
        unresolved = self.cache.unresolved()
        self._unknown = {k for k, st in unresolved.items() if st.status is CallStatus.UNKNOWN}
        self._jobs = {k for k, st in unresolved.items() if _job_runs(st)}
        if recovered.batch:
            log.info(
                "recovered in-flight calls as UNKNOWN",
                extra={"partitions": sorted(self.partitions), "count": len(recovered.batch.events)},
            )
            await self._write(recovered.batch)
            self._committed(recovered)
        self._loop_task = asyncio.create_task(self._decide_loop())
        self._loop_task.add_done_callback(self._watch)
        self._sweeper = asyncio.create_task(self._sweep_loop())
        self._sweeper.add_done_callback(self._watch)

    def submit(self, record: Inbound, partition: int, admitted: Admitted | None = None) -> None:
        """A record from a caller in this process (no input position); ``admitted``: the
        call already admitted by the caller (an intent is admitted once)."""
        self._check()
        if isinstance(record, ToolDisabled | ToolEnabled):
            self._apply_switch(switch_of(record))  # in force for everything decided after it
        self._push(_Input(record, partition, None, admitted, _open_run(record, partition)))

    async def feed(
        self,
        partition: int,
        offset: int,
        value: bytes,
        *,
        key: bytes | None = None,
        headers: tuple[tuple[str, bytes], ...] = (),
    ) -> None:
        """The next record of a partition's input stream; returns once it is queued, waiting
        while the executor has as much work as it runs at once (back-pressure). ``key`` and
        ``headers``: the record's, kept in its dead letter if it cannot be decided."""
        self._check()
        while not self._space.is_set():
            await self._space.wait()
            self._check()
        self._watermarks[partition].fed(offset)
        skip = self._skip.get(partition)
        if skip and offset in skip:  # its refusal is on the log already
            skip.discard(offset)
            self._push(_Dead(partition, offset, None))
            return
        record = self._decode(partition, offset, value, key, headers)
        if isinstance(record, DeadLetter):
            log.warning(
                "dead-lettered an input record",
                extra={"partition": partition, "offset": offset, "reason": record.reason},
            )
            self._push(_Dead(partition, offset, record))
            return
        if isinstance(record, ToolDisabled | ToolEnabled):
            self._apply_switch(switch_of(record))
        self._push(_Input(record, partition, offset, None, _open_run(record, partition)))

    def feed_raw(self, partition: int, value: bytes) -> None:
        """Bytes from outside the stream (no position): decoded, or dead-lettered."""
        self._check()
        record = self._decode(partition, None, value)
        if isinstance(record, DeadLetter):
            log.warning("dead-lettered a record", extra={"reason": record.reason})
            self._push(_Dead(partition, None, record))
            return
        self.submit(record, partition)

    async def drain(self) -> None:
        """Wait until everything submitted so far is decided, written, and no action runs."""
        while not self._is_idle():
            self._check()
            self._idle.clear()
            await self._idle.wait()
        self._check()

    async def stop(self) -> None:
        """Stop at once: nothing more is decided, written or started; running actions are
        cancelled (a call whose Started was written is recovered as UNKNOWN next time)."""
        self._fail(ExecutorStopped("stopped"))
        tasks = [t for t in (self._loop_task, self._sweeper) if t is not None]
        tasks += [f.task for f in (*self._flights.values(), *self._reads) if f.task is not None]
        for flight in (*self._flights.values(), *self._reads):
            if flight.timer is not None:
                flight.timer.cancel()
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(BaseException):
                await task

    def fail(self, exc: BaseException) -> None:
        """Stop deciding (the runtime's input failed); :meth:`stop` cancels what runs."""
        self._fail(exc)

    # -- internals: the loop ------------------------------------------------------------

    def _check(self) -> None:
        if self._failed is not None:
            raise ExecutorStopped("the executor stopped") from self._failed

    def _push(self, work: _Work) -> None:
        self._pending.append(work)
        self._update_space()
        self._idle.clear()
        self._wake.set()

    def _update_space(self) -> None:
        """Back-pressure on :meth:`feed`: work waiting and running, against the limit."""
        if len(self._pending) + len(self._flights) + len(self._reads) < self._concurrency:
            self._space.set()
        else:
            self._space.clear()

    def _is_idle(self) -> bool:
        return not (self._pending or self._flights or self._reads or self._queues or self._writing)

    async def _decide_loop(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            if self._failed is not None:
                return
            work = self._decide_pass()
            if work.batch or work.start or work.done:
                self._writing = True
                try:
                    if work.batch:
                        await self._write(work.batch)
                except BaseException as exc:
                    self._fail(exc)
                    if not isinstance(exc, asyncio.CancelledError):
                        log.error(
                            "write failed: the executor stops",
                            extra={"error": type(exc).__name__},
                        )
                        self._abandon(work, exc)
                    return
                finally:
                    self._writing = False
                self._committed(work)
            if self._pending:
                self._wake.set()
            elif self._is_idle():
                self._idle.set()

    def _abandon(self, work: _Pass, exc: BaseException) -> None:
        """The callers of every input not durably decided learn that it was not."""
        if self._on_abandoned is None:
            return
        waiting = [*work.intents]
        queued = (w for queue in self._queues.values() for w in queue)
        flights = (*self._flights.values(), *self._reads)
        reads = (f.input for f in flights if f.input is not None)
        for item in (*self._pending, *queued, *reads):
            if isinstance(item, _Input):
                waiting.append(item.record.intent_id)
        try:
            self._on_abandoned(waiting, exc)
        except Exception:
            log.exception("on_abandoned callback failed")

    def _watch(self, task: asyncio.Task[None]) -> None:
        """A loop that ends with an error stops the executor (never silently)."""
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            log.error("executor task died", exc_info=exc)
            self._fail(exc)

    def _fail(self, exc: BaseException) -> None:
        if self._failed is None:
            self._failed = exc
        self._idle.set()  # drain() raises instead of waiting for ever
        self._space.set()

    def _committed(self, work: _Pass) -> None:
        """After the write: keys released, events published, actions started."""
        self.cache.trim()  # only now: what it evicts is what the store holds
        for p, refused in work.batch.refused.items():
            self._stored_refused[p] = refused
        if self._on_committed is not None and work.batch.events:
            try:
                self._on_committed(work.batch.events)
            except Exception:  # a listener's bug must not stop the commits
                log.exception("on_committed callback failed")
        for span in work.spans:
            span.end()
        for run in work.ending:
            run.end()
        for flight in work.start:
            self._start_action(flight)
        self._update_space()

    # -- internals: a decision pass -----------------------------------------------------

    def _decide_pass(self) -> _Pass:
        work = _Pass()
        pending, self._pending = self._pending, []
        self.cache.load(key for key in map(_key_of, pending) if key is not None)
        for n, item in enumerate(pending):
            if (
                isinstance(item, _Input)
                and len(self._flights) + len(self._reads) >= self._concurrency
            ):
                # as many actions as may run at once: the inputs left wait for a later pass
                self._pending[:0] = [w for w in pending[n:] if isinstance(w, _Input)]
                rest = [w for w in pending[n:] if not isinstance(w, _Input)]
                for other in rest:
                    self._decide_in_order(other, work)
                break
            self._decide_in_order(item, work)
        self._record_positions(work)
        return work

    def _decide_in_order(self, item: _Work, work: _Pass) -> None:
        """Decide ``item`` now, or queue it behind its key's running action."""
        key = _key_of(item)
        if key is not None:
            flight = self._flights.get(key)
            if flight is not None and not (isinstance(item, _Done) and item.flight is flight):
                if not self._refuse_now(item, key, work):
                    self._queues.setdefault(key, deque()).append(item)
                return
        self._decide(item, work)
        if key is not None:
            self._drain_queue(key, work)

    def _drain_queue(self, key: str, work: _Pass) -> None:
        """Decide the key's queued work while the key is not busy."""
        queue = self._queues.get(key)
        while queue and key not in self._flights:
            self._decide(queue.popleft(), work)
        if queue is not None and not queue:
            del self._queues[key]

    def _refuse_now(self, item: _Work, key: str, work: _Pass) -> bool:
        """Invalid input, or the same key with other arguments while the key's call runs
        and cannot have expired by the intent's time: refused at once instead of after the
        call that holds the key. Neither answer depends on the running call's outcome:
        admission looks at the intent alone, and until the key expires its first accepted
        digest never changes."""
        if not isinstance(item, _Input) or not isinstance(item.record, ToolCallRequested):
            return False
        admitted = self._admit(item)
        if isinstance(admitted, ToolCallRejected):
            work.intents.append(item.record.intent_id)
            self._emit([admitted], item.partition, work)
            self._input_done(item.partition, item.offset, work, refused=True)
            return True
        state = self.cache.state(key)
        if state is None or admitted.context.args_digest == state.args_digest:
            return False
        due = expires_at(state, self._stages.policy(admitted.tool))
        if due is not None and item.record.envelope.occurred_at >= due:
            return False  # the key may be new again for it: decided in its turn
        work.intents.append(item.record.intent_id)
        refused = self._decide_call(item, admitted, key, work)
        self._input_done(item.partition, item.offset, work, refused=refused)
        return True  # (refused with an event: never a flight of its own)

    def _decide(self, item: _Work, work: _Pass) -> None:
        if isinstance(item, _Input):
            work.intents.append(item.record.intent_id)
        self._run, self._continued = _run_of(item), False
        try:
            self._decide_item(item, work)
        finally:
            if self._run is not None and not self._continued:
                work.ending.append(self._run)
            self._run = None

    def _core(
        self, state: CallState | None, command: Command, ctx: CallContext | None = None
    ) -> Verdict:
        """The pure core's decision (in a ``decide`` span of the run, when traced)."""
        run = self._run
        if run is None:
            return decide(state, command)
        with run.stage("decide", ctx, command=type(command).__name__):
            return decide(state, command)

    def _decide_item(self, item: _Work, work: _Pass) -> None:
        if isinstance(item, _Input):
            self._decide_input(item, work)
        elif isinstance(item, _Done):
            self._decide_done(item, work)
        elif isinstance(item, _Sweep):
            self._decide_sweep(item, work)
        elif isinstance(item, _Expire):
            self._decide_expiry(item, work)
        else:
            if item.letter is not None:
                work.batch.dead_letters.append(item.letter)
            self._input_done(item.partition, item.offset, work, refused=item.letter is None)

    def _admit(self, item: _Input) -> Admitted | ToolCallRejected:
        if item.admitted is None:
            assert isinstance(item.record, ToolCallRequested)
            run, env = item.run, item.record.envelope
            if run is None:
                item.admitted = self._stages.admit(item.record)
            else:
                with run.stage("admit", tenant=env.tenant_id, tool=env.tool) as span:
                    item.admitted = self._stages.admit(item.record)
                    if isinstance(item.admitted, ToolCallRejected):
                        tracing.record(span, tracing.event_outcome(item.admitted))
        if item.run is not None and not isinstance(item.admitted, ToolCallRejected):
            item.run.set_call(item.admitted.context)
        return item.admitted

    def _decide_input(self, item: _Input, work: _Pass) -> None:
        record = item.record
        refused = False
        if isinstance(record, ToolCallRequested):
            admitted = self._admit(item)
            if isinstance(admitted, ToolCallRejected):
                self._emit([admitted], item.partition, work)
                refused = True
            elif not admitted.tool.keyed:
                self._start_read(item, admitted, work)
                return  # done when its outcome is
            else:
                refused = self._decide_call(item, admitted, record.call_key, work)
        elif isinstance(record, ApprovalGranted | ApprovalDenied):
            self._decide_approval(item, record, work)
        elif isinstance(record, ToolDisabled | ToolEnabled):
            change = ChangeSwitch(record, item.partition)
            self._apply(self._core(None, change).events, item.partition, work)
        elif isinstance(record, ToolCallRejected):
            self._emit(self._door_refusal(record), item.partition, work)
            refused = True
        else:
            self._decide_job_record(item, record, work)
        key = _key_of(item)
        flight = self._flights.get(key) if key is not None else None
        if flight is not None and flight.input is item:
            return  # done with the flight's first events
        self._input_done(item.partition, item.offset, work, refused=refused)

    def _decide_call(self, item: _Input, admitted: Admitted, key: str, work: _Pass) -> bool:
        """Submit a call to the core; returns whether it was refused."""
        assert isinstance(item.record, ToolCallRequested)
        record = item.record
        ctx = admitted.context
        entry = self.cache.entry(key)
        disabled = switched_off(self.switches, ctx.tenant_id, ctx.tool)
        decision = self._core(
            entry.state,
            Submit(
                context=ctx,
                arguments_redacted_json=admitted.redacted_json,
                policy=self._stages.policy(admitted.tool),
                now=record.envelope.occurred_at,
                epoch=self.epoch,
                gate=self._stages.gate(record, admitted, disabled),
                approvals=entry.book,
            ),
            ctx,
        )
        self._apply(decision.events, item.partition, work)
        if any(isinstance(e, ApprovalRequested) for e in decision.events):
            work.batch.approval_intents.append(record)
        if decision.action is not None:
            flight = _Flight(key, item.partition, admitted, True, decision.action)
            if not decision.events:
                flight.input = item  # nothing recorded of it yet: done with the flight's events
            self._fly(flight, work)
        return any(isinstance(e, ToolCallRejected) for e in decision.events)

    def _decide_approval(
        self, item: _Input, record: ApprovalGranted | ApprovalDenied, work: _Pass
    ) -> None:
        env = record.envelope
        if not _consistent(env):
            self._emit(
                [_refusal(record, "The decision's call key does not match it.")],
                item.partition,
                work,
            )
            return
        outcome = self._core(None, DecideApproval(record, self.cache.book(env.call_key)))
        self._apply(outcome.events, item.partition, work)

    @staticmethod
    def _door_refusal(refusal: ToolCallRejected) -> list[Event]:
        """A refusal the front door gave itself (rate limit, switch, run budget, scope): into
        the audit trail as it is. It changes no call state: the key stays unused."""
        env = refusal.envelope
        key = call_key_of(env.call_key)
        consistent = (
            key is not None
            and key.sent_by(env.tenant_id, env.tool, env.idempotency_key, env.principal)
            and env.event_id == f"{env.intent_id}/rejected/1"
        )
        if not consistent:  # never recorded under another call's key
            log.warning("a front-door refusal with a foreign call key was dropped")
            return []
        return [refusal]

    def _decide_job_record(
        self,
        item: _Input,
        record: ToolCallJobReported | ToolCallJobCancelRequested,
        work: _Pass,
    ) -> None:
        """A job's report or a cancel, decided in the key's order with the sweeper's polls:
        the first word that finishes the job wins and any later one is refused."""
        env = record.envelope
        state = self.cache.state(env.call_key) if _consistent(env) else None
        located = self._stages.job_call(record, state)
        if isinstance(located, ToolCallRejected):
            self._emit([located], item.partition, work)
            return
        tool, ctx = located
        if isinstance(record, ToolCallJobReported):
            outcome = self._stages.job_outcome(tool, record)
            if isinstance(outcome, ToolCallRejected):
                self._emit([outcome], item.partition, work)
                return
            update = JobUpdate(
                context=ctx,
                outcome=outcome,
                source="report",
                by_intent=True,
                policy=self._stages.policy(tool),
                now=env.occurred_at,
            )
            self._apply(self._core(state, update, ctx).events, item.partition, work)
            return
        ask = RequestCancel(context=ctx, can_cancel=tool.cancel is not None, now=env.occurred_at)
        decision = self._core(state, ask, ctx)
        self._apply(decision.events, item.partition, work)
        if decision.action is not None:
            admitted = Admitted(tool, tool.arguments.model_construct(), ctx, "{}")
            flight = _Flight(env.call_key, item.partition, admitted, True, decision.action)
            if not decision.events:
                flight.input = item  # done with the flight's first events
            self._fly(flight, work)

    def _decide_done(self, done: _Done, work: _Pass) -> None:
        flight = done.flight
        if flight.key is None:  # a read-only call's outcome
            self._reads.discard(flight)
            assert isinstance(done.outcome, Event) and flight.input is not None
            self._emit([done.outcome], flight.partition, work)
            self._input_done(flight.partition, flight.input.offset, work)
            return
        key, action, admitted = flight.key, flight.action, flight.admitted
        del self._flights[key]
        tool, ctx = admitted.tool, admitted.context
        state = self.cache.state(key)
        policy = self._stages.policy(tool)
        now = self._clock.now()
        command: Command
        if isinstance(action, Execute):
            assert state is not None
            command = AttemptFinished(
                context=ctx,
                attempt=action.attempt,
                outcome=done.outcome,  # type: ignore[arg-type]
                duration_ms=done.duration_ms,
                arguments_redacted_json=admitted.redacted_json,
                policy=policy,
                now=now,
                epoch=self.epoch,
            )
        elif isinstance(action, Poll):
            command = JobUpdate(
                context=ctx,
                outcome=done.outcome,  # type: ignore[arg-type]
                source="poll",
                by_intent=False,
                policy=policy,
                now=now,
            )
            self._sweeping.discard(key)
        elif isinstance(action, Cancel):
            if isinstance(done.outcome, ErrorInfo):
                self._apply([_rejected(ctx, now, done.outcome)], flight.partition, work)
                return
            command = JobUpdate(
                context=ctx,
                outcome=JobCancelled(),
                source="cancel",
                by_intent=True,
                policy=policy,
                now=now,
            )
        else:
            command = ReconcileFinished(
                context=ctx,
                outcome=done.outcome,  # type: ignore[arg-type]
                by_intent=flight.by_intent,
                arguments_redacted_json=admitted.redacted_json,
                policy=policy,
                now=now,
                epoch=self.epoch,
                gate=Gate(disabled=self._switched_off(ctx) if flight.by_intent else None),
            )
            self._sweeping.discard(key)
        decision = self._core(state, command, ctx)
        self._apply(decision.events, flight.partition, work)
        if flight.input is not None and decision.events:
            refused = any(isinstance(e, ToolCallRejected) for e in decision.events)
            self._input_done(flight.partition, flight.input.offset, work, refused=refused)
            flight.input = None
        if decision.action is not None:
            flight.action = decision.action
            self._fly(flight, work)

    def _decide_sweep(self, item: _Sweep, work: _Pass) -> None:
        """Background reconcile of an UNKNOWN key, or a poll of a running job."""
        state = self.cache.state(item.key)
        tool = self._stages.tool(state.context.tool) if state is not None else None
        if state is None or tool is None:
            self._sweeping.discard(item.key)
            return
        if self._run is not None:
            self._run.set_call(state.context)
        decision = self._core(state, Sweep(policy=self._stages.policy(tool), now=self._clock.now()))
        self._apply(decision.events, item.partition, work)
        if decision.action is None:
            self._sweeping.discard(item.key)
            return
        admitted = Admitted(tool, tool.arguments.model_construct(), state.context, "{}")
        self._fly(_Flight(item.key, item.partition, admitted, False, decision.action), work)

    def _decide_expiry(self, item: _Expire, work: _Pass) -> None:
        """A finished key whose retention may have passed: decided by this executor's clock;
        the expiry is recorded on the log, so every replay agrees."""
        entry = self.cache.entry(item.key)
        state, book = entry.state, entry.book
        # a key with a call, or one that only had approval requests
        context = state.context if state is not None else book.context if book else None
        tool = self._stages.tool(context.tool) if context is not None else None
        if tool is None:
            return
        expire = Expire(policy=self._stages.policy(tool), now=self._clock.now(), approvals=book)
        self._apply(self._core(state, expire).events, item.partition, work)

    # -- internals: applying decisions ----------------------------------------------------

    def _emit(self, events: Sequence[Event], partition: int, work: _Pass) -> None:
        """Events that change no key (refusals, read-only outcomes): recorded as they are."""
        for event in events:
            work.batch.add(event, partition)
        if self._run is not None:
            work.spans.append(self._run.commit(events))

    def _apply(self, events: Sequence[Event], partition: int, work: _Pass) -> None:
        """Fold events into the working set and the batch."""
        batch = work.batch
        if self._run is not None:
            work.spans.append(self._run.commit(events))
        for event in events:
            batch.add(event, partition)
            key = event.call_key
            if isinstance(event, APPROVAL_EVENTS):
                book = evolve_approvals(self.cache.book(key), event)
                if book is not None:
                    self.cache.set_book(key, book)
                    batch.approvals[key] = book
            elif isinstance(event, ToolDisabled | ToolEnabled):
                switch = switch_of(event)
                self._apply_switch(switch)
                skey = switch_key(switch.tenant_id, switch.tool)
                batch.switches[(partition, skey)] = self.switches[skey]
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
                pass  # a refusal or a read-only call: no key state
            else:
                old = self.cache.state(key)
                new = evolve(old, event)
                if new is not None and new is not old:  # a replay leaves it as it is
                    self._set_state(key, new)
                    batch.states[key] = new
                    if old is None:
                        batch.created.add(key)
                    # expired and started again in one batch: the key stays in ``expired``,
                    # so the stores delete the old row and book before writing the new one

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

    def _fly(self, flight: _Flight, work: _Pass) -> None:
        """The key is busy from now; its action starts once the batch is written."""
        assert flight.key is not None
        self._flights[flight.key] = flight
        flight.run, self._continued = self._run, True
        work.start.append(flight)

    def _switched_off(self, ctx: CallContext) -> ErrorInfo | None:
        return switched_off(self.switches, ctx.tenant_id, ctx.tool)

    @staticmethod
    def _input_done(
        partition: int, offset: int | None, work: _Pass, *, refused: bool = False
    ) -> None:
        if offset is not None:
            work.done.append((partition, offset, refused))

    def _record_positions(self, work: _Pass) -> None:
        """The input positions after this batch, and the offsets past them answered with a
        refusal (not decided again after a restart)."""
        if not work.done:
            return
        for partition, offset, refused in work.done:
            self._watermarks[partition].done(offset)
            if refused:
                self._refused[partition].add(offset)
        for p in {partition for partition, _, _ in work.done}:
            position = self._watermarks[p].position
            work.batch.positions[p] = position
            refused_now = sorted(o for o in self._refused[p] if o >= position)
            self._refused[p] = set(refused_now)
            if refused_now != self._stored_refused.get(p, []):
                work.batch.refused[p] = refused_now

    # -- internals: actions -------------------------------------------------------------

    def _start_read(self, item: _Input, admitted: Admitted, work: _Pass) -> None:
        disabled = self._switched_off(admitted.context)
        if disabled is not None:  # nothing to replay for a read: refused outright
            ctx = admitted.context
            refused = _rejected(ctx, item.record.envelope.occurred_at, disabled)
            self._emit([refused], item.partition, work)
            self._input_done(item.partition, item.offset, work, refused=True)
            return
        flight = _Flight(None, item.partition, admitted, True, None, input=item, run=self._run)
        self._continued = True
        self._reads.add(flight)
        self._start_action(flight)  # a read needs nothing written first

    def _start_action(self, flight: _Flight) -> None:
        if self._failed is not None:
            return
        action = flight.action
        if isinstance(action, Execute) and action.round_attempt > 1:
            delay = self._stages.backoff_s(flight.admitted.tool, action.round_attempt)
            loop = asyncio.get_running_loop()
            flight.timer = loop.call_later(delay, self._run_action, flight)
            return
        self._run_action(flight)

    def _run_action(self, flight: _Flight) -> None:
        flight.timer = None
        if self._failed is not None:
            return
        if flight.run is None:
            flight.task = asyncio.create_task(self._act(flight))
        else:
            with flight.run.current():  # the action's stage spans are the run's children
                flight.task = asyncio.create_task(self._act(flight))
        flight.task.add_done_callback(self._watch)

    async def _act(self, flight: _Flight) -> None:
        stages, admitted, action = self._stages, flight.admitted, flight.action
        tool, ctx = admitted.tool, admitted.context
        duration = 0.0
        outcome: AttemptOutcome | ReconcileOutcome | JobOutcome | ErrorInfo | Event | None
        if action is None:
            outcome = await stages.read_only(admitted)
        elif isinstance(action, Execute):
            outcome, duration = await stages.execute(admitted, action.attempt)
        elif isinstance(action, Poll):
            outcome = await stages.poll(tool, self._known(ctx.call_key))
        elif isinstance(action, Cancel):
            outcome = await stages.cancel(tool, self._known(ctx.call_key))
        else:
            outcome = await stages.reconcile(tool, ctx, action.reconcile_attempt)
        flight.task = None
        if self._failed is None:
            self._push(_Done(flight, outcome, duration))

    def _known(self, key: str) -> CallState:
        state = self.cache.state(key)
        assert state is not None, f"{key} has no state"
        return state

    # -- internals: the sweeper ---------------------------------------------------------

    async def _sweep_loop(self) -> None:
        while True:
            await asyncio.sleep(self._sweep_interval_s)
            if self._failed is not None:
                return
            now = self._clock.now()
            for key in sorted((self._unknown | self._jobs) - self._sweeping):
                if not self._sweep_due(key, now):
                    continue
                self._sweeping.add(key)
                if _job_runs(self._known(key)):
                    polls, _ = self._polls.get(key, (0, 0.0))
                    wait = min(_POLL_BACKOFF_CAP_S, _POLL_BACKOFF_BASE_S * 2.0 ** min(polls, 8))
                    # jitter: jobs started together would otherwise be polled in one burst
                    # per cap period for ever
                    wait *= 1.0 - _POLL_JITTER * self._random()
                    self._polls[key] = (polls + 1, self._clock.monotonic() + wait)
                self._push(_Sweep(key, self._partition_of(key)))
            self._expire_due(now)

    def _sweep_due(self, key: str, now: datetime) -> bool:
        """An UNKNOWN key whose tool can reconcile it (or a running job to poll), past its
        backoff, with no work on it."""
        if key in self._flights or key in self._queues:
            return False
        state = self._known(key)  # unresolved: held in the cache
        tool = self._stages.tool(state.context.tool)
        if tool is not None and _job_runs(state):
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
            return self._polls.get(key, (0, 0.0))[1] <= self._clock.monotonic()
        if tool is None or tool.reconcile is None:
            return False
        wait = min(60.0, 2.0 ** min(state.reconcile_attempts, 6))
        return state.updated_at + timedelta(seconds=wait) <= now

    def _expire_due(self, now: datetime) -> None:
        """Keys whose retention may have passed get their expiry decided by the core. The
        store is asked per tool, with the tool's retention as it is now, a page at a time
        from a cursor: a key kept by an open approval does not hold the keys behind it."""
        for tool in self._stages.tools():
            retention = self._stages.policy(tool).key_retention_s
            if retention is None:
                continue
            settled_before = (now - timedelta(seconds=retention)).timestamp()
            for _ in range(_EXPIRY_PAGES_PER_SWEEP):
                after = self._expiry_cursors.get(tool.name)
                page = self._store.due(tool.name, settled_before, after, _EXPIRY_PAGE)
                self._expiry_cursors[tool.name] = page[-1] if len(page) == _EXPIRY_PAGE else None
                for _settled, key in page:
                    if key in self._flights or key in self._queues:
                        continue  # in use: looked at again on a later pass
                    self._push(_Expire(key, self._partition_of(key)))
                if len(page) < _EXPIRY_PAGE:
                    break

    # -- internals: decoding --------------------------------------------------------------

    def _decode(
        self,
        partition: int,
        offset: int | None,
        value: bytes,
        key: bytes | None = None,
        headers: tuple[tuple[str, bytes], ...] = (),
    ) -> Inbound | DeadLetter:
        def dead(reason: str) -> DeadLetter:
            # the reason names the record by its digest and size, so it can be found
            digest = hashlib.sha256(value).hexdigest()[:16]
            reason = f"{reason} ({len(value)} bytes, sha256 {digest})"
            return DeadLetter(partition, offset, reason, value, key, headers)

        if len(value) > self._max_record_bytes:
            return dead(f"record of {len(value)} bytes exceeds {self._max_record_bytes}")
        try:
            event = decode(value)
        except CodecError as exc:
            return dead(f"undecodable record: {exc}")
        if not isinstance(event, INBOUND):
            return dead(f"unexpected {event.TYPE} on the intents stream")
        return event


# -- helpers --------------------------------------------------------------------------------


def _key_of(item: _Work) -> str | None:
    """The call key a piece of work is ordered by (None: it needs no key's order)."""
    if isinstance(item, _Input):
        record = item.record
        if isinstance(record, ToolCallRequested):
            return record.call_key if record.envelope.idempotency_key else None
        if isinstance(record, _KEYED):
            return record.call_key if _consistent(record.envelope) else None
        return None
    if isinstance(item, _Done):
        return item.flight.key
    if isinstance(item, _Sweep | _Expire):
        return item.key
    return None


def _consistent(env: Envelope) -> bool:
    """Whether a record's call key is its own (never trust it: it decides whose state): of
    its tenant, tool and key, of whichever principal (a decision or a job's report is sent by
    another principal than the call's)."""
    key = call_key_of(env.call_key)
    return key is not None and key.names(env.tenant_id, env.tool, env.idempotency_key)


def _refusal(record: Inbound, message: str) -> ToolCallRejected:
    env = record.envelope
    return ToolCallRejected(
        envelope=env.model_copy(update={"event_id": f"{env.intent_id}/rejected/1"}),
        error=ErrorInfo.of(ErrorCode.VALIDATION_FAILED, message),
    )


def _rejected(ctx: CallContext, now: datetime, error: ErrorInfo) -> ToolCallRejected:
    return ToolCallRejected(envelope=ctx.envelope(f"{ctx.intent_id}/rejected/1", now), error=error)


_RUN_NAMES: dict[type[Event], str] = {
    ToolCallRequested: "intent",
    ApprovalGranted: "approval_decision",
    ApprovalDenied: "approval_decision",
    ToolDisabled: "switch",
    ToolEnabled: "switch",
    ToolCallRejected: "door_refusal",
    ToolCallJobReported: "job_report",
    ToolCallJobCancelRequested: "job_cancel",
}


def _open_run(record: Inbound, partition: int) -> tracing.Run | None:
    """A traced run for an input record (None while tracing is off)."""
    if not tracing.tracing_enabled():
        return None
    extra: dict[str, str | int | None] = {}
    if isinstance(record, ApprovalGranted | ApprovalDenied):
        extra["decision"] = record.TYPE
    elif isinstance(record, ToolDisabled | ToolEnabled):
        extra["partition"] = partition
    return tracing.open_run(_RUN_NAMES[type(record)], record.envelope, **extra)


def _run_of(item: _Work) -> tracing.Run | None:
    """The traced run a piece of work belongs to (sweeps and expiries open their own)."""
    if isinstance(item, _Input):
        return item.run
    if isinstance(item, _Done):
        return item.flight.run
    if isinstance(item, _Sweep):
        return tracing.open_run("sweep", None)
    if isinstance(item, _Expire):
        return tracing.open_run("expire", None)
    return None


def _job_runs(state: CallState) -> bool:
    """A call whose job runs: PENDING (polled) or UNKNOWN after its timeout (polled too)."""
    return (
        state.job is not None
        and state.job.status is JobStatus.RUNNING
        and state.status in (CallStatus.PENDING, CallStatus.UNKNOWN)
    )


def _default_random() -> Callable[[], float]:
    return random.Random().random
