"""What a new user sees first: ``--version``, and where ``serve`` listens."""

from __future__ import annotations

from importlib.metadata import version
from pathlib import Path

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
