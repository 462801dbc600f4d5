"""A group step whose ``$from`` reference cannot be resolved at run time (a path missing from
the earlier step's result, or a value of the wrong type on the way), through the HTTP API on
both backends. The step fails as data, without a call; a ``compensate`` group then undoes the
steps before it and ends ``COMPENSATED`` (it used to stay ``COMPENSATING`` until the server
restarted, with no compensation run and every resume answered ``409``); a ``stop`` group ends
``FAILED``, and a resume of it is answered, not refused."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest

from tests.http.conftest import BACKENDS, serving
from tests.http.servers import ACME, Server
from toolledger.schemas.groups import compensation_key, step_key


@pytest.fixture(scope="module", params=BACKENDS)
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    yield from serving(request, tmp_path_factory, "group-refs")


@pytest.fixture
async def client(server: Server) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(
        base_url=server.base_url, headers=ACME.headers, timeout=90
    ) as http:
        yield http


def _group(path: str, on_failure: str) -> dict[str, Any]:
    return {
        "run_id": f"refs-{uuid.uuid4().hex[:8]}",
        "on_failure": on_failure,
        "steps": [
            {"id": "open", "tool": "create_ticket", "arguments": {"title": "refs"}},
            {
                "id": "close",
                "tool": "close_ticket",
                "arguments": {"ticket_id": {"$from": "open", "path": path}},
            },
        ],
    }


# the ticket's result is {"ticket_id": "T-...", ...}: no "owner", and a string has no item 0
PATHS = {
    "owner": "there is no key 'owner' at the top",
    "ticket_id.0": "the value at ticket_id is a string, not an object or a list",
}


def _steps(group: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {step["id"]: step for step in group["steps"]}


@pytest.mark.parametrize("path", sorted(PATHS))
async def test_an_unresolvable_reference_fails_the_step_and_compensation_runs(
    server: Server, client: httpx.AsyncClient, path: str
) -> None:
    key = f"refs-{uuid.uuid4().hex[:12]}"
    answer = await client.post(
        "/v1/groups",
        json=_group(path, "compensate"),
        headers={"Idempotency-Key": key, "Prefer": "wait=30"},
    )
    assert answer.status_code == 200, answer.text  # finished within the wait
    group = answer.json()
    assert group["status"] == "COMPENSATED", group
    steps = _steps(group)
    assert steps["close"]["status"] == "FAILED_FINAL"
    assert steps["close"]["error"]["code"] == "VALIDATION_FAILED"
    assert PATHS[path] in steps["close"]["error"]["message"]
    assert steps["open"]["status"] == "SUCCEEDED"
    assert steps["open"]["compensation"]["status"] == "SUCCEEDED"
    assert group["completion_point"]["compensated"] == ["open"]
    assert server.effects(ACME.tenant, "create_ticket", step_key(key, "open")) == 1
    assert server.effects(ACME.tenant, "close_ticket", compensation_key(key, "open")) == 1
    assert server.effects(ACME.tenant, "close_ticket", step_key(key, "close")) == 0  # no call
    again = await client.post(f"/v1/groups/{group['group_id']}/resume")
    assert again.status_code == 409  # finished: there is nothing to resume
    assert again.json()["code"] == "GROUP_NOT_RESUMABLE"
    assert "COMPENSATED" in again.json()["detail"]


async def test_a_stopped_group_with_an_unresolvable_reference_ends_failed_and_resumes(
    server: Server, client: httpx.AsyncClient
) -> None:
    key = f"refs-{uuid.uuid4().hex[:12]}"
    answer = await client.post(
        "/v1/groups",
        json=_group("owner", "stop"),
        headers={"Idempotency-Key": key, "Prefer": "wait=30"},
    )
    assert answer.status_code == 200, answer.text
    group = answer.json()
    assert group["status"] == "FAILED", group
    assert _steps(group)["close"]["status"] == "FAILED_FINAL"
    assert group["completion_point"]["succeeded"] == ["open"]
    resumed = await client.post(
        f"/v1/groups/{group['group_id']}/resume", headers={"Prefer": "wait=30"}
    )
    assert resumed.status_code == 200, resumed.text  # resumed: a final failure ends it again
    assert resumed.json()["status"] == "FAILED"
    assert server.effects(ACME.tenant, "create_ticket", step_key(key, "open")) == 1
    assert server.effects(ACME.tenant, "close_ticket", step_key(key, "close")) == 0
