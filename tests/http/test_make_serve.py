"""``make serve`` takes a new user to an approved ``charge_card`` with the commands it prints
(issue 13, "Done when"): the printed curl commands are run as printed, with the three printed
tokens, against the server it started: a large charge the operator approves (four eyes), and
a small one alice confirms with her own token, which the agent's token cannot (issue 33)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

from tests.http.servers import free_port

ROOT = Path(__file__).resolve().parents[2]


def _printed_commands(lines: list[str]) -> list[str]:
    """The printed curl commands, continuation lines joined."""
    commands, current = [], ""
    for line in lines:
        text = line.strip()
        if not current and not text.startswith("curl "):
            continue
        current += text.removesuffix("\\") + " "
        if not text.endswith("\\"):
            commands.append(current.strip())
            current = ""
    return commands


def _run(command: str, env: dict[str, str]) -> dict[str, object]:
    done = subprocess.run(
        ["bash", "-c", command], env=env, capture_output=True, text=True, timeout=60, check=True
    )
    answer: dict[str, object] = json.loads(done.stdout)
    return answer


def test_the_printed_commands_take_a_new_user_to_an_approved_charge(tmp_path: Path) -> None:
    port = free_port()
    server = subprocess.Popen(
        ["make", "-s", "serve", f"DEV_DIR={tmp_path / 'dev'}", f"SERVE_PORT={port}"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    lines: list[str] = []
    try:
        assert server.stdout is not None
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            line = server.stdout.readline()
            assert line, "make serve stopped:\n" + "".join(lines)
            lines.append(line)
            if "listening on" in line:
                break
        printed = "".join(lines)
        tokens = dict(re.findall(r"^\s+(AGENT|USER|OPERATOR)=(\S+)$", printed, re.M))
        assert set(tokens) == {"AGENT", "USER", "OPERATOR"}, printed
        assert "/console" in printed
        env = {**os.environ, **tokens}
        commands = _printed_commands(lines)
        charge, small_charge = [c for c in commands if "charge_card" in c]
        approve, confirm = [c for c in commands if "/approve" in c]

        asked = _run(charge, env)
        assert asked["code"] == "APPROVAL_REQUIRED", asked
        request = asked["approval_request"]
        assert isinstance(request, dict) and request["approver_kind"] == "operator"
        decided = _run(approve.replace("<id>", str(request["id"])), env)
        assert decided["approver"] == "operator" and decided["decided_at"], decided
        done = _run(charge, env)  # the same command again: no token to carry
        assert done["status"] == "SUCCEEDED", done
        again = _run(charge, env)
        assert again["call_id"] == done["call_id"] and again["result"] == done["result"]

        asked = _run(small_charge, env)
        assert asked["code"] == "APPROVAL_REQUIRED", asked
        request = asked["approval_request"]
        assert isinstance(request, dict) and request["approver_kind"] == "user"
        confirm = confirm.replace("<id>", str(request["id"]))
        by_agent = _run(confirm.replace("$USER", "$AGENT"), env)
        assert by_agent["status"] == 403 and by_agent["code"] == "FORBIDDEN", by_agent
        confirmed = _run(confirm, env)
        assert confirmed["approver"] == "alice" and confirmed["decided_at"], confirmed
        done = _run(small_charge, env)
        assert done["status"] == "SUCCEEDED", done
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
