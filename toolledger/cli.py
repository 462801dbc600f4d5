"""The ``toolledger`` command: the composition root that wires backends."""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from processors.runtime.sqlite_log import LedgerFileError, SqliteLog
from toolledger import logs

app = typer.Typer(
    help="toolledger: an execution ledger for AI agents' tool calls.",
    no_args_is_help=True,
    add_completion=False,
)
console = Console()

DataOption = Annotated[
    Path | None,
    typer.Option("--data", help="Directory of the embedded ledger (a temporary one if omitted)."),
]


@app.callback()
def main(log_level: Annotated[str, typer.Option(help="Log level.")] = "WARNING") -> None:
    logs.configure(log_level)


@app.command()
def demo(data: DataOption = None) -> None:
    """Run a scripted agent session on the embedded backend and check its invariants."""
    from toolledger.demo import print_result, run_demo

    with tempfile.TemporaryDirectory(prefix="toolledger-demo-") as tmp:
        workdir = data or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        console.print(f"[bold]toolledger demo[/] (embedded, data in {workdir})")
        checks = asyncio.run(run_demo(workdir, console))
    print_result(console, checks)
    raise typer.Exit(1 if checks.failures else 0)


@app.command()
def replay(
    data: Annotated[Path, typer.Option("--data", help="Embedded ledger directory.")],
) -> None:
    """Drop the projections and rebuild them from the outcome log."""
    try:
        log = SqliteLog(data / "ledger.db")
    except LedgerFileError as exc:
        console.print(f"[red]{exc}[/]")
        raise typer.Exit(2) from None
    try:
        with console.status("rebuilding projections from the log"):
            count = log.rebuild_projections()
    except LedgerFileError as exc:
        console.print(f"[red]{exc}[/]")
        raise typer.Exit(2) from None
    finally:
        log.close()
    console.print(f"rebuilt projections from {count} events")


if __name__ == "__main__":
    app()
