"""Freed memory goes back to the system (glibc's malloc_trim), where the allocator keeps it
in its arenas otherwise: the resident size of a long-running executor follows its live heap."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import pytest

from toolledger import heap


def _resident_mb() -> float:
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/statm")
def test_memory_freed_between_live_blocks_is_handed_back() -> None:
    # 200 MB in blocks small enough for the allocator's heap, every 50th kept: the free
    # space lies between live blocks, so the heap's top cannot shrink by itself
    blocks = [bytes(20_000) for _ in range(10_000)]
    kept = blocks[::50]
    del blocks
    before = _resident_mb()
    assert heap.release_free_memory()  # this machine's libc is glibc
    after = _resident_mb()
    assert len(kept) == 200
    assert before - after > 100, (before, after)


async def test_the_periodic_release_runs_until_cancelled(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    thrice = asyncio.Event()
    loop = asyncio.get_running_loop()

    def trim(pad: int) -> int:  # called in a thread
        calls.append(pad)
        if len(calls) == 3:
            loop.call_soon_threadsafe(thrice.set)
        return 1

    monkeypatch.setattr(heap, "_TRIM", trim)
    task = asyncio.create_task(heap.release_free_memory_every(0.01))
    await asyncio.wait_for(thrice.wait(), 10)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert set(calls) == {0}


def _releasing(tasks: set[asyncio.Task[object]]) -> list[str]:
    names = (getattr(t.get_coro(), "__qualname__", "") for t in tasks)
    return [n for n in names if n == heap.release_free_memory_every.__qualname__]


async def test_the_library_leaves_the_host_process_alone_unless_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pydantic import BaseModel

    from toolledger import Ledger, Registry, TrustedContext

    trims: list[int] = []

    def trim(pad: int) -> int:
        trims.append(pad)
        return 1

    monkeypatch.setattr(heap, "_TRIM", trim)
    registry = Registry()

    class Note(BaseModel):
        text: str

    @registry.mutation()
    async def save_note(args: Note) -> Note:
        """Save a note. Use when: asked to."""
        return args

    async def calls(directory: str) -> list[str]:
        alice = TrustedContext(tenant_id="acme", principal="alice")
        path = tmp_path / directory / "ledger.db"
        async with Ledger.embedded(path, registry, context=alice) as ledger:
            for n in range(20):
                await ledger.call("save_note", {"text": "milk"}, idempotency_key=f"k{n}")
            return _releasing(asyncio.all_tasks())

    assert await calls("alone") == [] and trims == []  # an embedded ledger alone: no release
    assert await heap.releasing_free_memory(calls("asked")) == ["release_free_memory_every"]
