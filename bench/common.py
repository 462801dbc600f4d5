"""What every benchmark shares: the progress display and how results are written."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)


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
