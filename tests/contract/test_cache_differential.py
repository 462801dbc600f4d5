"""A differential test of the executor's bounded key cache: one script of calls (first calls,
replays in another order than the calls, conflicting arguments, retried and final failures,
concurrent duplicates, a restart, another tenant) runs on a ledger with the default cache and
on one whose cache holds a single key, and every answer must be the same. With one entry
nearly every replay reads its key from the store (the ledger file, or the Kafka executor's
local store), so an answer that depended on what the cache holds would differ."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from tests.contract.conftest import open_harness
from tests.contract.harness import ACME, GLOBEX, Harness
from toolledger.producers.client import CallResult

Answer = tuple[str, str | None, bool, str | None, int, bool]


class _Transcript:
    """Each answer, with its result as "the same as this key's first result or not" (results
    hold ids that differ from run to run; whether a replay gives back the first is what
    counts)."""

    def __init__(self) -> None:
        self.answers: list[Answer] = []
        self._first: dict[tuple[str, str, str], str] = {}

    def add(self, label: str, scope: tuple[str, str, str], result: CallResult) -> None:
        text = json.dumps(result.result, sort_keys=True)
        first = self._first.setdefault(scope, text) if result.ok else None
        self.answers.append(
            (
                label,
                None if result.status is None else result.status.value,
                result.replayed,
                None if result.error is None else result.error.code,
                result.attempts,
                first == text,
            )
        )


async def _script(ledger: Harness) -> list[Answer]:
    out = _Transcript()

    async def call(
        label: str, tool: str, args: dict[str, Any], key: str, context: Any = ACME
    ) -> None:
        result = await ledger.client.call(tool, args, idempotency_key=key, context=context)
        out.add(label, (context.tenant_id, tool, key), result)

    for i in range(8):
        await call(f"first {i}", "create_ticket", {"title": f"t{i}"}, f"k{i}")
    for i in reversed(range(8)):  # each replay evicts the key before it from a cache of one
        await call(f"replay {i}", "create_ticket", {"title": f"t{i}"}, f"k{i}")
    await call("conflict", "create_ticket", {"title": "other"}, "k3")
    await call("transient", "flaky_write", {"payload": "t", "fault": "transient_once"}, "f1")
    await call("final", "flaky_write", {"payload": "f", "fault": "final"}, "f2")
    for i in (0, 5):
        await call(f"between {i}", "create_ticket", {"title": f"t{i}"}, f"k{i}")
    await call("transient again", "flaky_write", {"payload": "t", "fault": "transient_once"}, "f1")
    await call("final again", "flaky_write", {"payload": "f", "fault": "final"}, "f2")
    storm = await asyncio.gather(
        *(
            ledger.client.call(
                "create_ticket", {"title": "storm"}, idempotency_key="k-storm", context=ACME
            )
            for _ in range(6)
        )
    )
    # which of the six runs is a race; that exactly one did and the others replayed it is not
    for result in sorted(storm, key=lambda r: r.replayed):
        out.add("storm", ("acme", "create_ticket", "k-storm"), result)
    await ledger.restart()
    for i in range(8):
        await call(f"after restart {i}", "create_ticket", {"title": f"t{i}"}, f"k{i}")
    await call("after restart conflict", "create_ticket", {"title": "other"}, "k6")
    await call("other tenant", "create_ticket", {"title": "t0"}, "k0", context=GLOBEX)
    await call("after restart final", "flaky_write", {"payload": "f", "fault": "final"}, "f2")
    return out.answers


@pytest.mark.parametrize("backend", ["embedded", pytest.param("kafka", marks=pytest.mark.services)])
async def test_a_cache_of_one_key_answers_as_the_default_cache(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    transcripts: dict[str, list[Answer]] = {}
    effects: dict[str, list[int]] = {}
    for variant in (backend, f"{backend}-cache1"):
        workdir = tmp_path / variant
        workdir.mkdir()
        async for ledger in open_harness(request, workdir, variant):
            transcripts[variant] = await _script(ledger)
            effects[variant] = [
                ledger.effects("create_ticket", key) for key in [*(f"k{i}" for i in range(8))]
            ] + [ledger.effects("flaky_write", "f1"), ledger.effects("create_ticket", "k-storm")]
    unbounded, one = transcripts[backend], transcripts[f"{backend}-cache1"]
    assert len(unbounded) == len(one) == 40
    for expected, actual in zip(unbounded, one, strict=True):
        assert actual == expected
    assert effects[backend] == effects[f"{backend}-cache1"] == [1] * 10
    # and the script means something: replays replayed the first result, the conflict was
    # refused, the final failure was stored and replayed as such
    by_label = {answer[0]: answer for answer in unbounded}
    assert by_label["replay 3"][2:] == (True, None, 1, True)
    assert by_label["conflict"][3] == "IDEMPOTENCY_KEY_REUSED"
    assert by_label["final again"][1:4] == ("FAILED_FINAL", True, "DOWNSTREAM_REFUSED")
    assert by_label["after restart 7"][2] is True and by_label["other tenant"][2] is False
