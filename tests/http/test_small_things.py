"""What a new user hit first with approvals: a tokens file that needed a restart, a four-eyes
refusal that did not say what it was, an APPROVAL_REQUIRED that did not say to retry with the
same key, an approve response without its approver. Embedded, on a server of its own."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from pathlib import Path

import httpx

from tests.faults.serve import EmbeddedServe
from tests.http.helpers import assert_problem, post_call
from tests.http.servers import ACME, OPERATOR, SELF_OP

CHARGE = {"customer_id": "cus_small", "amount_cents": 1200, "currency": "USD"}


def _tokens(path: Path, extra: list[dict[str, object]]) -> None:
    data = json.loads(path.read_text())
    data["tokens"].extend(extra)
    path.write_text(json.dumps(data))


async def test_a_token_added_to_the_file_works_without_a_restart(tmp_path: Path) -> None:
    server = EmbeddedServe.new(tmp_path, "--create")
    server.start()
    try:
        newcomer = f"new-{uuid.uuid4().hex}"
        headers = {"Authorization": f"Bearer {newcomer}"}
        async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:
            assert (await client.get("/v1/tools", headers=headers)).status_code == 401
            entry: dict[str, object] = {"token": newcomer, "tenant": "acme", "principal": "nina",
                     "scopes": ["tools:call"]}  # fmt: skip
            _tokens(tmp_path / "tokens.json", [entry])
            deadline = time.monotonic() + 10
            while (await client.get("/v1/tools", headers=headers)).status_code != 200:
                assert time.monotonic() < deadline, "the new token never took effect"
                await asyncio.sleep(0.1)
            (tmp_path / "tokens.json").write_text("{not json")  # a half-written file
            await asyncio.sleep(1.2)
            still = await client.get("/v1/tools", headers=ACME.headers)
            assert still.status_code == 200  # the tokens in force stay
    finally:
        server.stop()


async def test_approval_texts_say_what_happened_and_what_to_do(tmp_path: Path) -> None:
    server = EmbeddedServe.new(tmp_path, "--create")
    server.start()
    try:
        async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:
            asked = await post_call(
                client, "charge_card", CHARGE, key="small-1", headers=SELF_OP.headers
            )
            body = assert_problem(asked, 428, "APPROVAL_REQUIRED")
            assert "same idempotency key" in body["suggested_action"]
            request_id = body["approval_request"]["id"]
            own = await client.post(
                f"/v1/approval-requests/{request_id}/approve", headers=SELF_OP.headers
            )
            refused = assert_problem(own, 403, "FORBIDDEN")
            assert "Four eyes" in refused["detail"]
            assert "another operator" in refused["suggested_action"]
            approved = await client.post(
                f"/v1/approval-requests/{request_id}/approve", headers=OPERATOR.headers
            )
            assert approved.status_code == 200, approved.text
            shown = approved.json()["approval_request"]
            assert shown["approver"] == "olga" and shown["decided_at"]
            again = await client.post(
                f"/v1/approval-requests/{request_id}/approve", headers=OPERATOR.headers
            )
            assert_problem(again, 409, "APPROVAL_INVALID")  # approving twice
    finally:
        server.stop()
