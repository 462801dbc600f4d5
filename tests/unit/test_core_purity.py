"""The ledger core stays pure: no I/O, no clock, no randomness, no uuid4, no drivers.

Every ``.py`` file in ``processors/ledger/`` and ``processors/groups/`` (the call groups' core)
is parsed with :mod:`ast`; a forbidden import or a
reference to a forbidden callable fails the test with file, line and what was found.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import toolledger.processors.groups
import toolledger.processors.ledger

LEDGER_DIR = Path(toolledger.processors.ledger.__file__).resolve().parent
GROUPS_DIR = Path(toolledger.processors.groups.__file__).resolve().parent

FORBIDDEN_MODULES = frozenset(
    {
        "asyncio",
        "time",
        "uuid",
        "random",
        "os",
        "socket",
        "sqlite3",
        "threading",
        "subprocess",
        "aiokafka",
        "psycopg",
        "faust",
        "httpx",
        "requests",
        "logging",
        "secrets",
    }
)
# dotted names: matched exactly or as the tail of a longer dotted name (datetime.datetime.now)
FORBIDDEN_DOTTED = frozenset(
    {
        "datetime.now",
        "datetime.utcnow",
        "datetime.today",
        "date.today",
        "time.time",
        "time.monotonic",
        "time.perf_counter",
        "uuid.uuid4",
        "uuid.uuid1",
    }
)
FORBIDDEN_NAMES = frozenset({"uuid4", "uuid1", "open", "print", "input", "__import__"})
FORBIDDEN_PREFIXES = ("random.", "os.", "secrets.")


def _dotted(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return None if base is None else f"{base}.{node.attr}"
    return None


def impurities(source: str, filename: str = "<string>") -> list[str]:
    """Every forbidden import and every reference to a forbidden callable in ``source``."""
    found: list[str] = []
    tree = ast.parse(source, filename)
    for node in ast.walk(tree):
        where = f"{filename}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in FORBIDDEN_MODULES:
                    found.append(f"{where}: import {alias.name}")
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level == 0 and module.split(".")[0] in FORBIDDEN_MODULES:
                found.append(f"{where}: from {module} import ...")
            for alias in node.names:
                if alias.name in FORBIDDEN_NAMES:
                    found.append(f"{where}: from {module} import {alias.name}")
        elif isinstance(node, ast.Attribute | ast.Name):
            name = _dotted(node)
            if name is None:
                continue
            if (
                (name in FORBIDDEN_NAMES and isinstance(node, ast.Name))
                or any(name == d or name.endswith("." + d) for d in FORBIDDEN_DOTTED)
                or name.startswith(FORBIDDEN_PREFIXES)
            ):
                found.append(f"{where}: uses {name}")
    # ``datetime.datetime.now`` is both an Attribute and contains ``datetime.now``: report once
    return sorted(set(found))


def _ledger_files() -> list[Path]:
    return sorted([*LEDGER_DIR.glob("*.py"), *GROUPS_DIR.glob("*.py")])


def test_the_ledger_package_has_the_expected_modules() -> None:
    names = {p.name for p in _ledger_files()}
    assert {"__init__.py", "commands.py", "decide.py", "evolve.py", "state.py"} <= names


@pytest.mark.parametrize("path", _ledger_files(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_ledger_module_is_pure(path: Path) -> None:
    assert impurities(path.read_text(encoding="utf-8"), str(path)) == []


IMPURE_SOURCE = """
import asyncio
import os.path
from time import sleep
from uuid import uuid4
from datetime import datetime, date
import random as rnd
import logging

def stamp() -> object:
    print("hello")
    with open("/tmp/x") as f:
        f.read()
    return datetime.now(), datetime.utcnow(), date.today(), uuid4(), random.random()
"""


def test_the_checker_reports_forbidden_imports_and_calls() -> None:
    found = "\n".join(impurities(IMPURE_SOURCE, "impure.py"))
    for expected in (
        "import asyncio",
        "import os.path",
        "from time import",
        "from uuid import",
        "import logging",
        "import random",
        "from uuid import uuid4",
        "uses datetime.now",
        "uses datetime.utcnow",
        "uses date.today",
        "uses uuid4",
        "uses random.random",
        "uses print",
        "uses open",
    ):
        assert expected in found, expected


@pytest.mark.parametrize(
    "snippet",
    [
        "import time\nx = time.time()",
        "import datetime\nx = datetime.datetime.now()",
        "import uuid\nx = uuid.uuid1()",
        "from dataclasses import field\nfrom datetime import datetime\n"
        "def f(x: object = field(default_factory=datetime.now)) -> None: ...",
        "import secrets",
        "from aiokafka import AIOKafkaProducer",
        "import psycopg.rows",
        "import subprocess",
    ],
)
def test_the_checker_catches_each_kind(snippet: str) -> None:
    assert impurities(snippet) != []


def test_the_checker_accepts_pure_code() -> None:
    pure = (
        "from __future__ import annotations\n"
        "import hashlib\nimport re\nfrom datetime import datetime, timedelta\n"
        "def later(now: datetime, opened: bool) -> datetime:\n"
        "    cmd_now = now\n"
        "    return cmd_now + timedelta(seconds=1)\n"
    )
    assert impurities(pure) == []
