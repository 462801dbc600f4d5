"""``GET /v1/runs/{run_id}/report`` on both backends: the run's evaluation report for the
caller's tenant, as JSON, Markdown or HTML; another tenant's run is empty for it, and only
``operator:global`` names another tenant."""

from __future__ import annotations

import asyncio
import uuid

import httpx

from tests.http.helpers import JSON, PROBLEM, assert_problem, media_type, post_call
from tests.http.servers import GLOBEX, OPERATOR, PLATFORM_OP, Server


async def test_a_runs_report_in_three_formats_scoped_to_the_tenant(
    server: Server, client: httpx.AsyncClient, key: str
) -> None:
    run = f"run-{uuid.uuid4().hex}"
    for n in range(2):  # the same arguments under two keys: likely one too many
        made = await post_call(
            client, "create_ticket", {"title": "same"}, key=f"{key}-{n}", run_id=run
        )
        assert made.status_code == 200
    again = await post_call(client, "create_ticket", {"title": "same"}, key=f"{key}-0", run_id=run)
    assert again.headers.get("Idempotent-Replayed") == "true"
    bad = await post_call(client, "create_ticket", {"title": ""}, key=f"{key}-v", run_id=run)
    assert bad.status_code in (400, 422)
    failed = await post_call(
        client, "flaky_write", {"payload": "p", "fault": "final"}, key=f"{key}-f", run_id=run
    )
    assert failed.json()["status"] == "FAILED_FINAL"
    mine = await post_call(client, "flaky_write", {"payload": "p"}, key=f"{key}-ok", run_id=run)
    assert mine.status_code == 200

    got = await client.get(f"/v1/runs/{run}/report")
    assert got.status_code == 200 and media_type(got) == JSON
    report = got.json()
    assert report["scope"] == {"tenant_id": "acme", "run_id": run}
    metrics, checks = report["metrics"], report["checks"]
    assert (metrics["calls"], metrics["succeeded"], metrics["duplicates"]) == (4, 3, 1)
    assert metrics["validation_failures"] == 1 and metrics["success_rate"] == 0.75
    assert [r["keys"] for r in checks["repeated_calls"]] == [[f"{key}-0", f"{key}-1"]]
    assert [r["field"] for r in checks["argument_refusals"]] == ["title"]
    assert [r["how"] for r in checks["recoveries"]] == ["a later call"]

    markdown = await client.get(f"/v1/runs/{run}/report", params={"format": "md"})
    assert markdown.status_code == 200 and media_type(markdown) == "text/markdown"
    assert markdown.text.startswith(f"# Evaluation of run {run}\n")
    page = await client.get(f"/v1/runs/{run}/report", params={"format": "html"})
    assert page.status_code == 200 and media_type(page) == "text/html"
    assert f"<h1>Evaluation of run {run}</h1>" in page.text

    theirs = await client.get(f"/v1/runs/{run}/report", headers=GLOBEX.headers)
    assert theirs.status_code == 200 and theirs.json()["metrics"]["calls"] == 0
    peek = await client.get(f"/v1/runs/{run}/report", params={"tenant": "acme"},
                            headers=GLOBEX.headers)  # fmt: skip
    assert_problem(peek, 403, "FORBIDDEN")
    platform = await client.get(
        f"/v1/runs/{run}/report", params={"tenant": "acme"}, headers=PLATFORM_OP.headers
    )
    assert platform.status_code == 200 and platform.json()["metrics"]["calls"] == 4
    wrong = await client.get(f"/v1/runs/{run}/report", params={"format": "pdf"})
    assert wrong.status_code == 400 and media_type(wrong) == PROBLEM


async def test_a_decision_carries_the_run_of_the_call_it_decides(
    server: Server, client: httpx.AsyncClient, key: str
) -> None:
    run = f"run-{uuid.uuid4().hex}"
    charge = {"customer_id": "cus_77", "amount_cents": 4200, "currency": "USD"}
    asked = await post_call(client, "charge_card", charge, key=key, run_id=run)
    assert asked.status_code == 428, asked.text
    approval_id = asked.json()["approval_request"]["id"]
    denied = await client.post(
        f"/v1/approval-requests/{approval_id}/deny",
        headers=OPERATOR.headers,
        json={"reason": "Not this customer."},
    )
    assert denied.status_code in (200, 202), denied.text
    for _ in range(100):  # the projection applies the decision shortly
        checks = (await client.get(f"/v1/runs/{run}/report")).json()["checks"]
        if checks["human_rejections"]:
            break
        await asyncio.sleep(0.1)
    assert [(r["approval_id"], r["approver"], r["reason"]) for r in checks["human_rejections"]] == [
        (approval_id, "olga", "Not this customer.")
    ]
