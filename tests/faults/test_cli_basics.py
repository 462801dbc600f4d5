"""What a new user sees first: ``--version``, where ``serve`` listens, and help that fits
80 columns."""

from __future__ import annotations

from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest
import typer.main
from typer.testing import CliRunner

from tests.faults.serve import EmbeddedServe
from toolledger.cli import app


def test_version_prints_the_installed_version() -> None:
    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.output.strip() == f"toolledger {version('toolledger')}"


def test_serve_says_where_it_listens(tmp_path: Path) -> None:
    serve = EmbeddedServe.new(tmp_path, "--create")
    serve.start()
    try:
        assert serve.process is not None
        assert f"toolledger listening on http://127.0.0.1:{serve.port}" in serve.process.log()
    finally:
        serve.stop()


def _commands(group: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    """Every command of the CLI, with the words that name it (the group itself first)."""
    yield path, group
    for name, sub in getattr(group, "commands", {}).items():
        yield from _commands(sub, (*path, name))


COMMANDS = list(_commands(typer.main.get_command(app)))


def _squeezed(text: str) -> str:
    return "".join(text.split())


@pytest.mark.parametrize("path", [p for p, _ in COMMANDS], ids=lambda p: " ".join(p) or "-")
def test_help_at_80_columns_cuts_nothing(path: tuple[str, ...]) -> None:
    command = dict(COMMANDS)[path]
    result = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    text = result.stdout
    assert "…" not in text
    for line in text.splitlines():
        assert len(line) <= 80, line
        if not line.startswith("Usage:"):
            assert "..." not in line, line  # click's cut of a command's first sentence
    whole = _squeezed(text)
    for param in command.params:
        for name in [*param.opts, *param.secondary_opts]:
            if name.startswith("-"):
                assert name in text.split() or f"{name}," in text, name
        if getattr(param, "help", None) and not getattr(param, "hidden", False):
            assert _squeezed(param.help) in whole, param.help
    for sub in getattr(command, "commands", {}).values():
        assert _squeezed(sub.get_short_help_str(limit=10_000)) in whole, sub.name


def test_the_helpdesk_options_are_a_section_of_their_own() -> None:
    text = CliRunner().invoke(app, ["executor", "--help"], env={"COLUMNS": "80"}).stdout
    options, _, helpdesk = text.partition("The demo's helpdesk tools (only with --demo)")
    assert "--tools" in options and "--demo" in options
    for name in ("--helpdesk-db", "--timeout-s", "--flaky-timeout-s"):
        assert name in helpdesk and name not in options


def test_the_helpdesk_options_are_refused_with_another_toolset() -> None:
    result = CliRunner().invoke(
        app, ["executor", "--tools", "my_tools:registry", "--flaky-timeout-s", "2"]
    )
    assert result.exit_code == 2
    assert "--flaky-timeout-s is an option of the demo's helpdesk tools (--demo)" in result.output
