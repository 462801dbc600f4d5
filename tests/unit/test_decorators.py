"""Tools declared with ``@registry.mutation(...)`` and its siblings, through the public API."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
from pydantic import BaseModel

from toolledger import (
    REPLAY_SENTENCES,
    EffectClass,
    Found,
    Ledger,
    NotHappened,
    Registry,
    ToolContext,
    ToolRegistrationError,
    TrustedContext,
)
from toolledger.processors.tools.manifest import JobRef, JobSucceeded, PollAnswer

ALICE = TrustedContext("acme", "alice")


class Note(BaseModel):
    text: str


class Saved(BaseModel):
    note_id: str


def _context(tool: str, key: str = "k-1") -> ToolContext:
    return ToolContext(
        tenant_id="acme",
        principal="alice",
        tool=tool,
        call_key=f"acme/{tool}/{key}",
        call_id="call_x",
        idempotency_key=key,
        attempt=1,
        deadline=datetime.now(UTC),
    )


def test_a_decorated_handler_declares_its_models_description_and_replay_sentence() -> None:
    registry = Registry()

    @registry.mutation(timeout_s=3.0)
    async def save_note(args: Note, ctx: ToolContext) -> Saved:
        """Save a note for the caller.

        Use when: the user asks to remember something.
        Do not use when: the note is already saved
          (search first).
        Preconditions: none.
        """
        return Saved(note_id=f"n-{ctx.idempotency_key}")

    tool = registry.get("save_note")
    assert tool is not None and tool is save_note.tool
    assert tool.arguments is Note and tool.result is Saved
    assert tool.effect is EffectClass.MUTATION and tool.timeout_s == 3.0
    assert tool.description.summary == "Save a note for the caller."
    assert tool.description.when_to_use == "the user asks to remember something."
    assert tool.description.when_not_to_use == "the note is already saved (search first)."
    assert tool.description.preconditions == "none."
    assert tool.description.replay_behaviour == REPLAY_SENTENCES[EffectClass.MUTATION]
    assert registry.manifest(tool)["description"].count("Replay:") == 1


def test_each_effect_class_has_its_own_replay_sentence() -> None:
    registry = Registry()

    @registry.read_only()
    async def find_notes(args: Note) -> Saved:
        """Find notes.

        Use when: looking a note up.
        """
        return Saved(note_id=args.text)

    @registry.long_running()
    async def export_notes(args: Note) -> Saved:
        """Export the notes.

        Use when: a backup is due.
        """
        return Saved(note_id="job")

    @export_notes.poll
    async def export_done(job: JobRef, ctx: ToolContext) -> PollAnswer:
        return JobSucceeded(Saved(note_id=job.job_id))

    read, job = registry.get("find_notes"), registry.get("export_notes")
    assert read is not None and job is not None
    assert not read.keyed and read.description.replay_behaviour.startswith("Read-only")
    assert job.effect is EffectClass.LONG_RUNNING and "job" in job.description.replay_behaviour
    assert len(set(REPLAY_SENTENCES.values())) == 3


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("async def f(args: dict, ctx: ToolContext) -> Saved:\n    'Use when: x.'", "pydantic"),
        ("async def f(args, ctx) -> Saved:\n    'Use when: x.'", "pydantic"),
        ("async def f(args: Note, ctx: ToolContext):\n    'Use when: x.'", "return annotation"),
        ("async def f(args: Note) -> dict:\n    'Use when: x.'", "not a pydantic model"),
        ("def f(args: Note) -> Saved:\n    'Use when: x.'", "async"),
        ("async def f(args: Note) -> Saved:\n    pass", "no docstring"),
        ("async def f(args: Note) -> Saved:\n    'Saves.'", "'Use when:'"),
        ("async def f(a: Note, b: ToolContext, c: int) -> Saved:\n    'Use when: x.'", "takes 3"),
        ("async def f(args: Note) -> Saved:\n    'Use when: x. Use when: y.'", "two"),
    ],
)
def test_a_handler_that_does_not_say_enough_is_refused_with_what_is_missing(
    source: str, message: str
) -> None:
    namespace: dict[str, object] = {"Note": Note, "Saved": Saved, "ToolContext": ToolContext}
    exec(source, namespace)
    registry = Registry()
    with pytest.raises(ToolRegistrationError, match=message):
        registry.mutation()(namespace["f"])  # type: ignore[type-var]
    assert len(registry) == 0


def test_trusted_context_fields_are_refused_as_for_explicit_tools() -> None:
    class Smuggled(BaseModel):
        tenant_id: str

    registry = Registry()
    with pytest.raises(ToolRegistrationError, match="trusted-context"):

        @registry.mutation()
        async def leak(args: Smuggled) -> Saved:
            """Use when: never."""
            return Saved(note_id="x")


async def test_reconcile_returns_the_result_model_or_none() -> None:
    registry = Registry()
    effects: dict[str, str] = {}

    @registry.mutation(risk="irreversible")
    async def send(args: Note, ctx: ToolContext) -> Saved:
        """Send a note. Use when: asked to."""
        effects[ctx.idempotency_key] = args.text
        return Saved(note_id=args.text)

    with pytest.raises(ToolRegistrationError, match="needs a reconcile hook"):
        registry.get("send")
    with pytest.raises(ToolRegistrationError, match="needs a reconcile hook"):
        Ledger.embedded("unused.db", registry)

    @send.reconcile
    async def find_sent(ctx: ToolContext) -> Saved | None:
        text = effects.get(ctx.idempotency_key)
        return None if text is None else Saved(note_id=text)

    tool = registry.get("send")
    assert tool is not None and tool.reconcile is not None
    assert isinstance(await tool.reconcile(_context("send")), NotHappened)
    effects["k-1"] = "hello"
    found = await tool.reconcile(_context("send"))
    assert isinstance(found, Found) and Saved.model_validate_json(found.result_json).note_id == (
        "hello"
    )
    assert await send(Note(text="direct"), _context("send", "k-2")) == Saved(note_id="direct")


async def test_a_decorated_tool_runs_once_per_key_on_the_embedded_ledger(tmp_path: Path) -> None:
    registry = Registry()
    runs: list[str] = []

    @registry.mutation()
    async def save_note(args: Note) -> Saved:
        """Save a note. Use when: asked to remember."""
        runs.append(args.text)
        return Saved(note_id=f"n{len(runs)}")

    async with Ledger.embedded(tmp_path / "ledger.db", registry, context=ALICE) as ledger:
        first = await ledger.call("save_note", {"text": "milk"}, idempotency_key="note-1")
        again = await ledger.call("save_note", {"text": "milk"}, idempotency_key="note-1")
        other = await ledger.call("save_note", {"text": "eggs"}, idempotency_key="note-1")
        tools = await ledger.tools()
    assert first.ok and first.result == {"note_id": "n1"} and not first.replayed
    assert again.ok and again.result == first.result and again.replayed
    assert other.rejected and other.error is not None
    assert other.error.code == "IDEMPOTENCY_KEY_REUSED"
    assert runs == ["milk"]
    assert [t.name for t in tools] == ["save_note"] and tools[0].keyed


async def test_an_embedded_call_without_a_context_is_refused_with_the_reason(
    tmp_path: Path,
) -> None:
    registry = Registry()

    @registry.read_only()
    async def ping(args: Note) -> Saved:
        """Ping. Use when: checking."""
        return Saved(note_id=args.text)

    async with Ledger.embedded(tmp_path / "ledger.db", registry) as ledger:
        with pytest.raises(ValueError, match="TrustedContext"):
            await ledger.call("ping", {"text": "x"}, idempotency_key=None)
        answered = await ledger.call("ping", {"text": "x"}, idempotency_key=None, context=ALICE)
    assert answered.ok and answered.result == {"note_id": "x"}
