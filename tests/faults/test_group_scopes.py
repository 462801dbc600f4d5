"""A group submitted by a token without the scopes its steps need (a job's token, with only
``jobs:report``), through the HTTP API on both backends: ``403 FORBIDDEN`` naming the steps
and the scopes, before anything is stored or the key is used (it used to be stored, its key
used up, and each step then failed ``FORBIDDEN``); the same group with the same key then runs
for a caller that holds the scopes."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.http.conftest import BACKENDS, serving
from tests.http.servers import ACME, JOB_REPORTER, Server
from toolledger.schemas.groups import step_key


@pytest.fixture(scope="module", params=BACKENDS)
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    yield from serving(request, tmp_path_factory, "group-scopes")


def _group(run_id: str) -> dict[str, Any]:
    return {
        "run_id": run_id,
        "steps": [
            {"id": "open", "tool": "create_ticket", "arguments": {"title": "scoped"}},
            {
                "id": "close",
                "tool": "close_ticket",
                "arguments": {"ticket_id": {"$from": "open", "path": "ticket_id"}},
            },
        ],
    }


async def test_a_group_needs_the_scopes_of_its_steps_before_anything_is_stored(
    server: Server,
) -> None:
    key, run_id = f"scoped-{uuid.uuid4().hex[:12]}", f"run-{uuid.uuid4().hex[:8]}"
    async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as client:
        refused = await client.post(
            "/v1/groups",
            json=_group(run_id),
            headers={**JOB_REPORTER.headers, "Idempotency-Key": key, "Prefer": "wait=10"},
        )
        assert refused.status_code == 403, refused.text
        problem = refused.json()
        assert problem["code"] == "FORBIDDEN" and "tools:call" in problem["detail"]
        assert [(e["loc"], e["type"]) for e in problem["errors"]] == [
            ("steps.0.tool", "forbidden"),
            ("steps.1.tool", "forbidden"),
        ]
        stored = await client.get(
            "/v1/groups", params={"run_id": run_id}, headers=JOB_REPORTER.headers
        )
        assert stored.status_code == 200 and stored.json()["items"] == []
        assert server.effects(ACME.tenant, "create_ticket", step_key(key, "open")) == 0
        # the key was not used: the same group under it runs for a caller with the scopes
        ran = await client.post(
            "/v1/groups",
            json=_group(run_id),
            headers={**ACME.headers, "Idempotency-Key": key, "Prefer": "wait=30"},
        )
        assert ran.status_code == 200, ran.text
        assert ran.json()["status"] == "SUCCEEDED" and "idempotent-replayed" not in ran.headers
    assert server.effects(ACME.tenant, "create_ticket", step_key(key, "open")) == 1
