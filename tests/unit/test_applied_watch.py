"""The front door's read-your-writes wait (:class:`producers.http.applied.AppliedWatch`): every
request in flight waits for its event, one lookup per poll asks for all of them."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from toolledger.producers.http.applied import AppliedWatch


class Projection:
    """The read side's ``applied_among``, with the events applied so far and every lookup."""

    def __init__(self) -> None:
        self.applied: set[str] = set()
        self.lookups: list[list[str]] = []
        self.failing: Exception | None = None

    async def moved(self, timeout_s: float) -> None:
        """A projection that cannot tell when it moves: the poll's interval passes."""
        await asyncio.sleep(timeout_s)

    async def applied_among(self, event_ids: Sequence[str]) -> set[str]:
        self.lookups.append(list(event_ids))
        await asyncio.sleep(0)  # a query takes a turn of the loop
        if self.failing is not None:
            raise self.failing
        return self.applied & set(event_ids)


def watch_of(projection: Projection) -> AppliedWatch:
    return AppliedWatch(projection, interval_s=0.005)  # type: ignore[arg-type]


async def test_every_waiter_is_answered_by_lookups_of_all_of_them() -> None:
    projection = Projection()
    watch = watch_of(projection)
    ids = [f"event-{i}" for i in range(50)]
    waiting = [asyncio.create_task(watch.within(event_id, 5.0)) for event_id in ids]
    await asyncio.sleep(0.02)
    assert watch.waiting == 50
    for wave in (ids[:10], ids[10:30], ids[30:]):  # the projector applies them in batches
        projection.applied.update(wave)
        await asyncio.sleep(0.02)
    assert await asyncio.gather(*waiting) == [True] * 50
    assert watch.waiting == 0
    assert set(projection.lookups[0]) == set(ids)  # one lookup for all fifty
    # far fewer lookups than one per waiter per poll: about one per poll interval
    assert len(projection.lookups) < 40
    # an event, once found, is not asked for again
    for before, after in zip(projection.lookups, projection.lookups[1:], strict=False):
        assert set(after) <= set(before)


async def test_an_event_never_applied_times_out_alone_and_polling_stops() -> None:
    projection = Projection()
    watch = watch_of(projection)
    projection.applied.add("applied")
    late, applied = await asyncio.gather(watch.within("never", 0.05), watch.within("applied", 1.0))
    assert (late, applied) == (False, True)
    assert watch.waiting == 0
    await asyncio.sleep(0.02)
    polls = len(projection.lookups)
    await asyncio.sleep(0.05)
    assert len(projection.lookups) == polls  # nobody waits: no more lookups


async def test_a_read_side_error_reaches_the_waiters_and_the_next_wait_polls_again() -> None:
    projection = Projection()
    watch = watch_of(projection)
    projection.failing = ConnectionError("database unreachable")
    with pytest.raises(ConnectionError, match="unreachable"):
        await asyncio.gather(watch.within("a", 1.0), watch.within("b", 1.0))
    await asyncio.sleep(0.01)
    assert watch.waiting == 0
    projection.failing = None
    projection.applied.add("c")
    assert await watch.within("c", 1.0) is True


async def test_a_cancelled_waiter_leaves_the_others_waiting() -> None:
    projection = Projection()
    watch = watch_of(projection)
    first = asyncio.create_task(watch.within("same", 1.0))
    second = asyncio.create_task(watch.within("same", 1.0))
    await asyncio.sleep(0.01)
    first.cancel()
    await asyncio.sleep(0.01)
    assert watch.waiting == 1
    projection.applied.add("same")
    assert await second is True
    assert first.cancelled()
