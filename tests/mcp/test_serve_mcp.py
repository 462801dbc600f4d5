"""``toolledger serve --mcp``: one process serves the HTTP API and MCP (streamable HTTP at
/mcp) over one embedded ledger, so an approval an MCP client runs into is decided on the HTTP
API's approval routes, and the MCP client's retry then runs the call once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx

from tests.mcp.common import (
    ACME_TOKEN,
    CHARGE,
    ROOT,
    approval_request,
    body,
    deployment,
    free_port,
    http_client,
    new_key,
    wait_healthy,
)

OPERATOR_TOKEN = "acme-operator-token-0123456789"


async def test_one_process_serves_http_and_mcp_and_an_mcp_approval_completes(
    tmp_path: Path,
) -> None:
    deploy = deployment(tmp_path)
    tokens = json.loads(deploy.tokens.read_text())
    tokens["tokens"].append(
        {"token": OPERATOR_TOKEN, "tenant": "acme", "principal": "olga", "scopes": ["operator"]}
    )
    deploy.tokens.write_text(json.dumps(tokens))
    port = free_port()
    log = tmp_path / "serve.log"
    with log.open("wb") as out:
        process = subprocess.Popen(  # noqa: ASYNC220  # started once, then waited for over HTTP
            [sys.executable, "-m", "toolledger", "serve", "--demo", "--mcp", "--create",
             "--port", str(port), "--data", str(deploy.data), "--tokens", str(deploy.tokens)],
            cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env=dict(os.environ),
        )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(f"{base}/healthz", process, log)
        key = new_key()
        async with http_client(f"{base}/mcp", ACME_TOKEN, "auto") as mcp:
            asked = await mcp.call_tool("charge_card", {**CHARGE, "idempotency_key": key})
            request = approval_request(asked)
            async with httpx.AsyncClient(base_url=base, timeout=30) as api:
                operator = {"Authorization": f"Bearer {OPERATOR_TOKEN}"}
                approved = await api.post(
                    f"/v1/approval-requests/{request['id']}/approve", headers=operator
                )
                assert approved.status_code == 200, approved.text
                token = approved.json()["approval_token"]
                ran = await mcp.call_tool(
                    "charge_card", {**CHARGE, "idempotency_key": key, "approval_token": token}
                )
                assert body(ran)["ok"] is True, body(ran)
                # the HTTP API sees the call MCP made: one ledger
                agent = {"Authorization": f"Bearer {ACME_TOKEN}"}
                found = await api.get("/v1/calls", params={"idempotency_key": key}, headers=agent)
                assert [c["status"] for c in found.json()["items"]] == ["SUCCEEDED"]
        assert deploy.effects("acme", "charge_card", key) == 1
    finally:
        process.terminate()
        process.wait(timeout=30)
