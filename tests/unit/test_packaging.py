"""The base install (``pip install toolledger``) is the embedded ledger, its HTTP API and the
SDK: ``import toolledger``, ``toolledger --help``/``--version``, every command's help,
``toolledger demo`` and ``toolledger serve`` on the embedded backend run without the optional
packages (Kafka, PostgreSQL, MCP, faust, the agent frameworks), and import nothing that the
base requirements do not install. A command that needs an extra says which one."""

from __future__ import annotations

import functools
import json
import os
import re
import signal
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator
from importlib.metadata import PackageNotFoundError, distribution, packages_distributions
from pathlib import Path
from typing import Any

import httpx
import pytest
import typer.main
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.http.servers import ACME, free_port, write_tokens
from toolledger.cli import app

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
OWN_PACKAGES = {"schemas", "producers", "processors", "projections", "toolledger", "tests"}
# the top-level packages of the optional dependencies
OPTIONAL_MODULES = {"aiokafka", "psycopg", "psycopg_pool", "mcp", "faust", "agents", "anthropic"}
OPTIONAL_MODULES |= {"uvloop"}
BLOCKED_ENV = "TOOLLEDGER_TEST_BLOCKED"

# Runs first in each subprocess: the packages named in $TOOLLEDGER_TEST_BLOCKED cannot be
# imported, as if they were not installed.
PRELUDE = """
import importlib.abc, json, os, sys
BLOCKED = frozenset(json.loads(os.environ["TOOLLEDGER_TEST_BLOCKED"]))

class Blocker(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r} (blocked)", name=name)
        return None

sys.meta_path.insert(0, Blocker())
"""
CLI = PRELUDE + "from toolledger.cli import app\napp(prog_name='toolledger')\n"


def _names(requirements: list[str]) -> set[str]:
    return {canonicalize_name(Requirement(r).name) for r in requirements}


EXTRAS: dict[str, list[str]] = PYPROJECT["project"]["optional-dependencies"]
BASE = _names(PYPROJECT["project"]["dependencies"])
OPTIONAL = {
    "kafka": {"aiokafka"},
    "postgres": {"psycopg", "psycopg-pool"},
    "mcp": {"mcp"},
    "openai": {"openai-agents"},
    "anthropic": {"anthropic"},
    "faust": {"faust-streaming"},
    "speed": {"uvloop"},
    "export": {"pyarrow", "duckdb"},
}


def test_each_extra_holds_its_optional_packages_and_the_base_none() -> None:
    for extra, names in OPTIONAL.items():
        assert _names(EXTRAS[extra]) == names, extra
        assert not BASE & names, names
    assert sorted(EXTRAS["all"]) == sorted(r for e in OPTIONAL for r in EXTRAS[e])
    assert set(EXTRAS["all"]) <= set(EXTRAS["dev"])  # the tests need every extra
    assert {"pytest", "mypy", "ruff", "hypothesis", "schemathesis"} <= _names(EXTRAS["dev"])
    needed = {"pydantic", "fastavro", "typer", "rich", "fastapi", "uvicorn", "httpx"}
    needed |= {"prometheus-client", "pyjwt", "opentelemetry-api", "opentelemetry-sdk"}
    assert needed <= BASE
    assert "psycopg[binary]" in "".join(EXTRAS["postgres"]).replace(" ", "")


def test_make_installs_every_extra() -> None:
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    assert re.search(r"pip install .*-e '\.\[all,dev\]'", makefile)
    assert "-e '.[dev]'" not in makefile


def _base_distributions() -> set[str]:
    """toolledger's base requirements and theirs, as installed here (extras only where a
    requirement asks for them, e.g. pyjwt[crypto])."""
    found: set[str] = set()
    todo: list[tuple[str, frozenset[str]]] = [("toolledger", frozenset())]
    while todo:
        name, extras = todo.pop()
        try:
            dist = distribution(name)
        except PackageNotFoundError:  # e.g. a requirement of another platform only
            continue
        found.add(canonicalize_name(name))
        for raw in dist.requires or []:
            req = Requirement(raw)
            environments = [{"extra": e} for e in {"", *extras}]
            if req.marker is not None and not any(req.marker.evaluate(e) for e in environments):
                continue
            key = canonicalize_name(req.name)
            if key not in found or req.extras:
                todo.append((key, frozenset(req.extras)))
    return found


@functools.cache
def blocked() -> list[str]:
    """The optional packages, and every other top-level module that only a distribution
    outside the base requirements installs here (a base install would not have it)."""
    base = _base_distributions()
    names = set(OPTIONAL_MODULES)
    for module, dists in packages_distributions().items():
        if module in OWN_PACKAGES or module in sys.stdlib_module_names:
            continue
        if not {canonicalize_name(d) for d in dists} & base:
            names.add(module)
    return sorted(names)


def _env() -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "COLUMNS": "80",
        BLOCKED_ENV: json.dumps(blocked()),
    }


def _run(
    code: str, *args: str, tmp_path: Path, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=tmp_path,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def _command_paths(group: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    yield path
    for name, sub in getattr(group, "commands", {}).items():
        yield from _command_paths(sub, (*path, name))


def test_the_optional_packages_and_only_they_are_blocked(tmp_path: Path) -> None:
    names = set(blocked())
    assert names >= OPTIONAL_MODULES
    assert not names & {"fastapi", "uvicorn", "httpx", "typer", "pydantic", "fastavro", "jwt"}
    ran = _run(PRELUDE + "import aiokafka\n", tmp_path=tmp_path)
    assert ran.returncode == 1 and "No module named 'aiokafka' (blocked)" in ran.stderr


def test_import_toolledger_the_embedded_ledger_and_the_sdk(tmp_path: Path) -> None:
    code = PRELUDE + (
        "import toolledger, toolledger.cli, toolledger.embedded, toolledger.serve\n"
        "from producers.client import LedgerClient\n"
        "from toolledger.embedded import EmbeddedLedger\n"
    )
    ran = _run(code, tmp_path=tmp_path)
    assert ran.returncode == 0, ran.stderr


def test_help_and_version_need_no_extra(tmp_path: Path) -> None:
    ran = _run(CLI, "--version", tmp_path=tmp_path)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.startswith("toolledger ")
    paths = [list(p) for p in _command_paths(typer.main.get_command(app))]
    every_help = PRELUDE + (
        "import json, sys\n"
        "from toolledger.cli import app\n"
        "for path in json.loads(sys.argv[1]):\n"
        "    code = app([*path, '--help'], prog_name='toolledger', standalone_mode=False)\n"
        "    assert code in (0, None), (path, code)\n"
    )
    ran = _run(every_help, json.dumps(paths), tmp_path=tmp_path)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.count("Usage: toolledger") == len(paths)


def test_the_demo_needs_no_extra(tmp_path: Path) -> None:
    ran = _run(CLI, "demo", "--data", str(tmp_path / "demo"), tmp_path=tmp_path)
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr
    assert "invariant checks passed" in ran.stdout


def test_serve_on_the_embedded_backend_needs_no_extra(tmp_path: Path) -> None:
    port = free_port()
    tokens = write_tokens(tmp_path / "tokens.json")
    args = ["serve", "--demo", "--port", str(port), "--data", str(tmp_path / "data"), "--tokens"]
    log = tmp_path / "serve.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-c", CLI, *args, str(tokens)],
            cwd=tmp_path,
            env=_env(),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert process.poll() is None, log.read_text()
            try:
                if httpx.get(f"{base}/readyz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        done = httpx.post(
            f"{base}/v1/tools/create_ticket/calls",
            json={"arguments": {"title": "Printer on fire"}},
            headers={**ACME.headers, "Idempotency-Key": "packaging-1"},
            timeout=60,
        )
        assert done.status_code == 200 and done.json()["status"] == "SUCCEEDED", done.text
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
        code = process.wait(timeout=60)
    assert code == 0, log.read_text()
    assert "blocked" not in log.read_text()


@pytest.mark.parametrize(
    ("args", "extra"),
    [
        (["executor"], "kafka"),
        (["topics"], "kafka"),
        (["migrate"], "postgres"),
        (["projector"], "kafka,postgres"),
        (["replay"], "kafka,postgres"),
        (["serve", "--kafka", "127.0.0.1:1", "--postgres", "postgresql://x"], "kafka,postgres"),
        (["mcp"], "mcp"),
    ],
    ids=lambda v: v if isinstance(v, str) else " ".join(v),
)
def test_a_command_that_needs_an_extra_names_it(
    args: list[str], extra: str, tmp_path: Path
) -> None:
    if args[0] in ("executor", "replay", "serve", "mcp"):  # the tools: the demo's
        args = [*args, "--demo"]
    if args[0] in ("serve", "mcp"):
        args = [*args, "--tokens", str(write_tokens(tmp_path / "tokens.json"))]
        args += ["--data", str(tmp_path / "data")]
    ran = _run(CLI, *args, tmp_path=tmp_path, timeout=60)
    assert ran.returncode == 2, ran.stdout + ran.stderr
    assert f"pip install 'toolledger[{extra}]'" in ran.stdout + ran.stderr
    assert "Traceback" not in ran.stdout + ran.stderr
