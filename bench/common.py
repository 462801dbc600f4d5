"""What every benchmark shares: the no-op tool, the progress display, the result writer."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)

from processors.ledger import NotHappened, ReconcileOutcome
from processors.tools.manifest import EffectClass, RiskTier, Tool, ToolContext, ToolDescription
from processors.tools.registry import ToolRegistry


def new_progress(console: Console, width: int = 26) -> Progress:
    """Bar, count, elapsed time and a live ``rate`` field per task."""
    return Progress(
        TextColumn(f"[bold]{{task.description:<{width}}}"), BarColumn(), MofNCompleteColumn(),
        TimeElapsedColumn(), TextColumn("{task.fields[rate]}"), console=console)


def write_result(result: dict[str, Any], out: Path | str, console: Console | None = None) -> Path:
    """The result as indented JSON (NaN and infinities refused) under ``bench/results/``."""
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2, allow_nan=False) + "\n")
    if console is not None:
        console.print(f"wrote {path}")
    return path


TOOL = "bench_noop"


class NoteArgs(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)
    text: str


class NoteAck(BaseModel):
    ok: bool


@dataclass
class Counter:
    invocations: int = 0
    marks: dict[str, float] = field(default_factory=dict)  # idempotency key -> handler start


def make_registry(counter: Counter, *, mark: bool = False) -> ToolRegistry:
    """The no-op mutation tool every benchmark measures; it counts its invocations."""

    async def handler(arguments: NoteArgs, ctx: ToolContext) -> NoteAck:
        counter.invocations += 1
        if mark:
            counter.marks[ctx.idempotency_key] = time.perf_counter()
        return NoteAck(ok=True)

    async def reconcile(ctx: ToolContext) -> ReconcileOutcome:
        return NotHappened()

    registry = ToolRegistry()
    registry.register(Tool(
        name=TOOL, version="1", arguments=NoteArgs, result=NoteAck, handler=handler,
        description=ToolDescription(
            summary="Does nothing (benchmark).", when_to_use="Benchmarks only.",
            when_not_to_use="Anything real.", preconditions="None.",
            replay_behaviour="A repeated key returns the first result without running again."),
        effect=EffectClass.MUTATION, risk=RiskTier.LOW, reconcile=reconcile))
    return registry
