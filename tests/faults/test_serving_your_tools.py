"""Serving your own tools (issue 32, item 4), as a new user runs them: the installed
``toolledger`` command, from the directory that holds ``mytools.py``. ``--tools module:attr``
imports from the working directory and ``--tools path/to/file.py:attr`` from the file; an
import that fails is one line naming the module and where it was looked for, and leaves
nothing behind; the demo's tools are named (``--demo``), never a default; ``replay`` writes
nothing beside the ledger."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.http.servers import ACME, free_port, write_tokens

TOOLLEDGER = str(Path(sys.executable).parent / "toolledger")  # the console script, as installed

MYTOOLS = '''
from pydantic import BaseModel

from toolledger import Registry

registry = Registry()


class Note(BaseModel):
    text: str


class Saved(BaseModel):
    note_id: str


@registry.mutation()
async def save_note(args: Note) -> Saved:
    """Save a note for the user. Use when: the user asks to remember something."""
    return Saved(note_id=f"{NAME}-{len(args.text)}")
'''


def _project(tmp_path: Path) -> Path:
    """An application's folder: mytools.py, tools/other.py (another name in its result), and a
    tokens file."""
    (tmp_path / "mytools.py").write_text(MYTOOLS.replace("{NAME}", "mine"))
    (tmp_path / "tools").mkdir()
    (tmp_path / "tools" / "other.py").write_text(MYTOOLS.replace("{NAME}", "other"))
    write_tokens(tmp_path / "tokens.json")
    return tmp_path


def _run(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, TOOLLEDGER_REDACTION_SECRET="00" * 32, COLUMNS="80")
    return subprocess.run(
        [TOOLLEDGER, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )


def _one_line(done: subprocess.CompletedProcess[str]) -> str:
    text = done.stdout + done.stderr
    lines = [line for line in text.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in text, text
    return lines[0]


def _serve_and_call(cwd: Path, tools: str, data: str) -> dict[str, object]:
    port = free_port()
    args = ["serve", "--tools", tools, "--data", data, "--tokens", "tokens.json"]
    env = dict(os.environ)
    process = subprocess.Popen(
        [TOOLLEDGER, *args, "--port", str(port)],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            if process.poll() is not None:
                out = process.stdout.read().decode() if process.stdout else ""
                raise AssertionError(f"serve exited {process.returncode}:\n{out}")
            try:
                if httpx.get(f"{base}/readyz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "serve not ready in 60 s"
            time.sleep(0.1)
        headers = {**ACME.headers, "Idempotency-Key": "note-1"}
        answer = httpx.post(
            f"{base}/v1/tools/save_note/calls",
            headers=headers,
            json={"arguments": {"text": "milk"}},
            timeout=30,
        )
        assert answer.status_code in (200, 201), answer.text
        found: dict[str, object] = answer.json()
        return found
    finally:
        process.terminate()
        process.wait(timeout=30)
        if process.stdout is not None:
            process.stdout.close()


def test_serve_imports_module_attr_from_the_working_directory_and_a_file_path(
    tmp_path: Path,
) -> None:
    project = _project(tmp_path)
    mine = _serve_and_call(project, "mytools:registry", "data")
    assert mine["result"] == {"note_id": "mine-4"}
    other = _serve_and_call(project, "tools/other.py:registry", "data-other")
    assert other["result"] == {"note_id": "other-4"}


@pytest.mark.parametrize(
    "command",
    [
        ["serve", "--data", "data", "--tokens", "tokens.json"],
        ["mcp", "--data", "data", "--tokens", "tokens.json", "--transport", "http"],
        ["executor", "--ready-file", "data/ready", "--state-dir", "data/state"],
        ["replay", "--data", "data"],
    ],
    ids=lambda c: c[0],
)
def test_a_module_that_does_not_import_is_one_line_and_nothing_is_created(
    tmp_path: Path, command: list[str]
) -> None:
    project = _project(tmp_path)
    before = sorted(p.name for p in project.iterdir())
    missing = _run(project, *command, "--tools", "nosuch:registry")
    assert missing.returncode == 2
    line = _one_line(missing)
    # the module, and the head of the search path: the working directory first
    assert "no module named 'nosuch'" in line and f"looked in {project}," in line
    # a module of a file that is not there, and an attribute the module lacks
    absent = _run(project, *command, "--tools", "tools/gone.py:registry")
    assert absent.returncode == 2 and f"there is no file {project / 'tools' / 'gone.py'}" in (
        _one_line(absent)
    )
    lacking = _run(project, *command, "--tools", "mytools:tools")
    assert lacking.returncode == 2 and "mytools" in _one_line(lacking)
    assert "has no attribute 'tools'" in lacking.stdout + lacking.stderr
    assert sorted(p.name for p in project.iterdir() if p.name != "__pycache__") == before


@pytest.mark.parametrize("command", ["serve", "mcp", "executor", "replay"])
def test_the_demo_tools_are_never_a_default(tmp_path: Path, command: str) -> None:
    project = _project(tmp_path)
    unnamed = _run(project, command, "--data" if command != "executor" else "--state-dir", "d")
    assert unnamed.returncode == 2
    assert "name the tools: --tools module:attribute" in _one_line(unnamed)
    assert "--demo" in unnamed.stdout + unnamed.stderr and not (project / "d").exists()


def test_replay_writes_nothing_beside_the_ledger(tmp_path: Path) -> None:
    """Before, replay made a helpdesk.db in --data: loading the demo's tools made their store."""
    made = _run(tmp_path, "init", "data")
    assert made.returncode == 0, made.stdout + made.stderr
    before = {p.name for p in (tmp_path / "data").iterdir()}
    for tools in (["--demo"], ["--tools", "toolledger.examples.helpdesk:registry"]):
        replayed = _run(tmp_path, "replay", "--data", "data", *tools)
        assert replayed.returncode == 0, replayed.stdout + replayed.stderr
        assert "rebuilt projections from 0 events" in replayed.stdout
        after = {p.name for p in (tmp_path / "data").iterdir()}
        assert after - before <= {"ledger.db-wal", "ledger.db-shm"}, after - before
        assert not (tmp_path / "helpdesk.db").exists()


@pytest.mark.parametrize("command", ["serve", "mcp"])
def test_a_tokens_file_that_does_not_validate_is_one_line_naming_each_entry(
    tmp_path: Path, command: str
) -> None:
    project = _project(tmp_path)
    (project / "tokens.json").write_text(
        '{"tokens": [{"token": "short", "tenant": "dev", "principal": "alice"},'
        ' {"tenant": "dev", "principal": "bob", "token": "x" }]}'
    )
    args = [command, "--tools", "mytools:registry", "--data", "d", "--tokens", "tokens.json"]
    if command == "mcp":
        args += ["--transport", "http"]
    refused = _run(project, *args)
    assert refused.returncode == 2
    line = _one_line(refused)
    assert "tokens.json: not a usable tokens file" in line
    assert "tokens.0.token: String should have at least 16 characters" in line
    assert "tokens.1.token" in line and not (project / "d").exists()


BAD_SETTINGS = {
    "policy": (
        ["--policy", "policy.json"],
        "policy.json: not a usable rate limit policy (rate_limits.tenant.rate:",
    ),
    "jwks not json": (
        ["--jwks", "broken.json", "--jwt-issuer", "i", "--jwt-audience", "a"],
        "broken.json: not JSON",
    ),
    "jwks missing": (
        ["--jwks", "nosuch.json", "--jwt-issuer", "i", "--jwt-audience", "a"],
        "nosuch.json: cannot read the JWKS file",
    ),
    "port": (["--port", "65536"], "Invalid value for '--port'"),
}


@pytest.mark.parametrize("case", sorted(BAD_SETTINGS))
def test_serve_refuses_bad_settings_before_it_writes_anything(tmp_path: Path, case: str) -> None:
    project = _project(tmp_path)
    (project / "policy.json").write_text('{"rate_limits": {"tenant": {"rate": -1, "burst": 1}}}')
    (project / "broken.json").write_text("{not json")
    extra, expected = BAD_SETTINGS[case]
    refused = _run(
        project, "serve", "--demo", "--data", "d", "--create", "--tokens", "tokens.json", *extra
    )
    assert refused.returncode == 2
    assert expected in refused.stdout + refused.stderr, refused.stdout + refused.stderr
    assert "Traceback" not in refused.stdout + refused.stderr
    assert not (project / "d").exists()  # neither the ledger nor the demo's store


@pytest.mark.parametrize("case", ["jwks not json", "jwks missing"])
def test_mcp_refuses_a_bad_jwks_before_it_writes_anything(tmp_path: Path, case: str) -> None:
    project = _project(tmp_path)
    (project / "broken.json").write_text("{not json")
    extra, expected = BAD_SETTINGS[case]
    refused = _run(
        project, "mcp", "--demo", "--data", "d", "--create", "--tokens", "tokens.json",
        "--transport", "http", *extra,
    )  # fmt: skip
    assert refused.returncode == 2
    assert expected in _one_line(refused)
    assert not (project / "d").exists()
