"""A distributed-mode command whose Kafka cluster or PostgreSQL server cannot be reached when
it starts says so in one line naming the service and the option that names it, and exits 1:
no traceback, and no password of the PostgreSQL URL in what it prints."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tests.http.servers import free_port, write_tokens
from tests.services import Services

TOOLLEDGER = str(Path(sys.executable).parent / "toolledger")
PASSWORD = "pw-" + uuid.uuid4().hex


def _commands(kafka: str, postgres: str) -> dict[str, list[str]]:
    prefix = f"down{uuid.uuid4().hex[:8]}."
    both = ["--kafka", kafka, "--postgres", postgres, "--prefix", prefix]
    return {
        "topics": ["topics", "--kafka", kafka, "--prefix", prefix],
        "executor": ["executor", "--kafka", kafka, "--prefix", prefix, "--demo"],
        "projector": ["projector", *both],
        "serve": ["serve", "--demo", *both, "--tokens", "tokens.json", "--port", "0"],
        "mcp": ["mcp", "--demo", *both, "--tokens", "tokens.json", "--transport", "http"],
    }


def _run(cwd: Path, args: list[str]) -> tuple[int, str]:
    write_tokens(cwd / "tokens.json")
    env = dict(os.environ, TOOLLEDGER_REDACTION_SECRET="00" * 32, COLUMNS="80")
    done = subprocess.run(
        [TOOLLEDGER, *args, *(["--state-dir", "state"] if args[0] == "executor" else [])],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return done.returncode, done.stdout + done.stderr


def _the_line(output: str, start: str) -> str:
    assert "Traceback" not in output and PASSWORD not in output, output
    lines = [line for line in output.splitlines() if line.startswith(start)]
    assert len(lines) == 1, output
    return lines[0]


NO_BROKER = f"127.0.0.1:{free_port()}"  # nothing listens there
NO_DATABASE = f"postgresql://toolledger:{PASSWORD}@127.0.0.1:{free_port()}/toolledger"


@pytest.mark.parametrize("command", sorted(_commands(NO_BROKER, NO_DATABASE)))
def test_a_broker_that_cannot_be_reached_is_one_line(tmp_path: Path, command: str) -> None:
    status, output = _run(tmp_path, _commands(NO_BROKER, NO_DATABASE)[command])
    assert status == 1, output
    line = _the_line(output, f"cannot reach Kafka at {NO_BROKER} (")
    assert line.endswith("start the broker, or name it with --kafka or TOOLLEDGER_KAFKA")


@pytest.mark.services
@pytest.mark.parametrize("command", ["projector", "serve", "mcp"])
def test_a_database_that_cannot_be_reached_is_one_line(
    tmp_path: Path, services: Services, command: str
) -> None:
    status, output = _run(tmp_path, _commands(services.kafka, NO_DATABASE)[command])
    assert status == 1, output
    line = _the_line(output, "cannot reach PostgreSQL (")
    assert "Connection refused" in line
    assert line.endswith("start it, or name it with --postgres or TOOLLEDGER_POSTGRES")
