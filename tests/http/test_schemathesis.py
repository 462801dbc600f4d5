"""Schemathesis against the live ``/openapi.json``: no 5xx, and every response fits the
documented status codes, media types and schemas."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from tests.http.servers import SELF_OP, Server

CHECKS = (
    "not_a_server_error,response_schema_conformance,status_code_conformance,"
    "content_type_conformance"
)
# Fixed tool and arguments for the calls endpoint, so fuzzed keys, run ids, waits and
# approval tokens reach the executor instead of failing argument validation. The kill switch
# is fuzzed switching tools on only: the fuzzer learns the tools' names (the document has a
# path per tool), and a tool it switched off would answer every later call with its
# documented 503 TOOL_DISABLED, which the no-server-error check counts as a failure.
CONFIG = """
[[operations]]
include-name = "POST /v1/tools/{tool}/calls"
parameters = { "path.tool" = "flaky_write", "body.arguments" = { payload = "fuzz" } }

[[operations]]
include-name = "PUT /v1/tools/{tool}/switch"
parameters = { "body.enabled" = true }
"""


def _schemathesis() -> str:
    local = Path(sys.executable).with_name("schemathesis")
    found = str(local) if local.exists() else shutil.which("schemathesis")
    assert found, "schemathesis is a dev dependency: pip install -e '.[dev]'"
    return found


def test_schemathesis_finds_no_server_error_and_no_schema_violation(
    embedded_server: Server, tmp_path: Path
) -> None:
    config = tmp_path / "schemathesis.toml"
    config.write_text(CONFIG)
    command = [
        _schemathesis(),
        "--config-file",
        str(config),
        "run",
        f"{embedded_server.base_url}/openapi.json",
        "--header",
        f"Authorization: Bearer {SELF_OP.token}",
        "--checks",
        CHECKS,
        "--max-examples",
        os.environ.get("TOOLLEDGER_FUZZ_EXAMPLES", "50"),
        "--seed",
        os.environ.get("TOOLLEDGER_FUZZ_SEED", "20261129"),
        "--generation-database",
        "none",
        "--request-timeout",
        "30",
        "--no-color",
    ]
    run = subprocess.run(
        command, cwd=tmp_path, capture_output=True, text=True, timeout=240, check=False
    )
    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-12000:]
    selected = re.search(r"Selected: (\d+)/(\d+)", output)
    tested = re.search(r"Tested: (\d+)", output)
    assert selected and tested, output[-4000:]
    assert selected.group(1) == selected.group(2) == tested.group(1), output[-4000:]
    assert int(tested.group(1)) >= 9  # every operation of the API was exercised
