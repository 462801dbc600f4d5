"""Issue 33, item 6, through the HTTP API of real ``toolledger serve`` processes on both
backends: a key is scoped by tenant, tool and key *and principal* (the default of a new
ledger). After an operator approved alice's charge and it ran, another user of her tenant
sending the same key and arguments used to get alice's call (it "ran under his request"), and
anyone of the tenant could read a call by its key. Now his is a call of its own (its own
approval request, its own charge), and alice's call is not his to read. Under the scope
``tenant`` (``--key-scope tenant``) the tenant shares its keys, as before: the second user gets
the first one's outcome, other arguments are 422. The setting is the ledger's: an embedded
ledger keeps the scope it was made with and refuses another with one line; on Kafka an
executor of another scope refuses the front door's calls, naming the setting."""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest

from tests.faults.serve import EmbeddedServe
from tests.http.conftest import BACKENDS, serving
from tests.http.helpers import assert_call, assert_problem, post_call
from tests.http.servers import ACME, CAROL, OPERATOR, ROOT, Server, Token, start_distributed
from tests.services import Services

CHARGE = {"customer_id": "cus_7", "amount_cents": 1250, "currency": "EUR"}  # an operator's
TICKET = {"title": "The printer is on fire"}


@pytest.fixture(scope="module", params=BACKENDS)
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    yield from serving(request, tmp_path_factory, "key-scope")


@pytest.fixture
async def api(server: Server) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as client:
        yield client


def _as(token: Token) -> dict[str, str]:
    return token.headers


async def _approve(api: httpx.AsyncClient, request: dict[str, object]) -> None:
    approved = await api.post(
        f"/v1/approval-requests/{request['id']}/approve", headers=_as(OPERATOR)
    )
    assert approved.status_code == 200, approved.text


async def test_an_approved_charge_does_not_run_under_another_users_request(
    server: Server, api: httpx.AsyncClient
) -> None:
    key = f"pay-{uuid.uuid4().hex[:12]}"
    asked = await post_call(api, "charge_card", CHARGE, key=key, headers=_as(ACME))
    alices_request = assert_problem(asked, 428, "APPROVAL_REQUIRED")["approval_request"]
    await _approve(api, alices_request)
    ran = assert_call(
        await post_call(api, "charge_card", CHARGE, key=key, headers=_as(ACME)),
        "SUCCEEDED",
        replayed=False,
    )
    assert server.effects(ACME.tenant, "charge_card", key) == 1

    # carol, of alice's tenant, sends the same key and arguments: a call of her own, which
    # asks for its own approval; alice's charge is not hers, nor its result
    theirs = await post_call(api, "charge_card", CHARGE, key=key, headers=_as(CAROL))
    problem = assert_problem(theirs, 428, "APPROVAL_REQUIRED")
    assert problem["approval_request"]["id"] != alices_request["id"]
    assert problem["call_id"] != ran["call_id"] and "result" not in problem
    assert server.effects(ACME.tenant, "charge_card", key) == 1
    await _approve(api, problem["approval_request"])
    carols = assert_call(
        await post_call(api, "charge_card", CHARGE, key=key, headers=_as(CAROL)),
        "SUCCEEDED",
        replayed=False,
    )
    assert carols["call_id"] == problem["call_id"]
    assert carols["result"]["charge_id"] != ran["result"]["charge_id"]
    assert server.effects(ACME.tenant, "charge_card", key) == 2
    again = await post_call(api, "charge_card", CHARGE, key=key, headers=_as(ACME))
    assert assert_call(again, "SUCCEEDED", replayed=True)["result"] == ran["result"]


async def test_a_users_call_is_not_read_by_another_user_of_the_tenant(
    server: Server, api: httpx.AsyncClient
) -> None:
    key = f"mine-{uuid.uuid4().hex[:12]}"
    made = await post_call(api, "create_ticket", TICKET, key=key, headers=_as(ACME))
    alice = assert_call(made, "SUCCEEDED", replayed=False)
    call = f"/v1/calls/{alice['call_id']}"
    by_key = {"idempotency_key": key}
    # alice and the tenant's operators read it, by id and by key
    for token in (ACME, OPERATOR):
        read = await api.get(call, headers=_as(token))
        assert read.status_code == 200 and read.json()["result"] == alice["result"], read.text
        events = await api.get(f"{call}/events", headers=_as(token))
        assert events.status_code == 200 and events.json()["items"], events.text
        found = await api.get("/v1/calls", params=by_key, headers=_as(token))
        assert [c["call_id"] for c in found.json()["items"]] == [alice["call_id"]], found.text
    # carol finds nothing of it: not by its id, its events, its key, nor a job's cancel
    for path in (call, f"{call}/events"):
        assert_problem(await api.get(path, headers=_as(CAROL)), 404, "NOT_FOUND")
    found = await api.get("/v1/calls", params=by_key, headers=_as(CAROL))
    assert found.status_code == 200 and found.json()["items"] == [], found.text
    # her own call under the key is hers alone: a new ticket, found by her by the key
    hers = assert_call(
        await post_call(api, "create_ticket", TICKET, key=key, headers=_as(CAROL)),
        "SUCCEEDED",
        replayed=False,
    )
    assert hers["result"] != alice["result"]
    found = await api.get("/v1/calls", params=by_key, headers=_as(CAROL))
    assert [c["call_id"] for c in found.json()["items"]] == [hers["call_id"]]
    everyone = await api.get("/v1/calls", params=by_key, headers=_as(OPERATOR))
    assert sorted(c["call_id"] for c in everyone.json()["items"]) == sorted(
        [alice["call_id"], hers["call_id"]]
    )
    assert server.effects(ACME.tenant, "create_ticket", key) == 2


async def test_the_tools_list_states_the_key_scope(api: httpx.AsyncClient) -> None:
    listed = await api.get("/v1/tools", headers=_as(ACME))
    assert listed.status_code == 200, listed.text
    body = listed.json()
    assert body["key_scope"] == "tenant+principal"
    assert {t["key_scope"] for t in body["items"]} == {"tenant+principal"}


async def _shared_key_story(server: Server) -> None:
    """Under the scope ``tenant``: one execution for the tenant, the second user replays it,
    other arguments under the key are 422."""
    key = f"shared-{uuid.uuid4().hex[:12]}"
    async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as api:
        listed = await api.get("/v1/tools", headers=_as(ACME))
        assert listed.json()["key_scope"] == "tenant", listed.text
        first = assert_call(
            await post_call(api, "create_ticket", TICKET, key=key, headers=_as(ACME)),
            "SUCCEEDED",
            replayed=False,
        )
        again = await post_call(api, "create_ticket", TICKET, key=key, headers=_as(CAROL))
        assert assert_call(again, "SUCCEEDED", replayed=True)["call_id"] == first["call_id"]
        other = {"title": "Another fire"}
        refused = await post_call(api, "create_ticket", other, key=key, headers=_as(CAROL))
        assert_problem(refused, 422, "IDEMPOTENCY_KEY_REUSED")
        read = await api.get(f"/v1/calls/{first['call_id']}", headers=_as(CAROL))
        assert read.status_code == 200, read.text  # the tenant's call, as before
    assert server.effects(ACME.tenant, "create_ticket", key) == 1


def _serve(data: Path, tokens: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    """``toolledger serve`` that is expected to refuse to start."""
    command = [sys.executable, "-m", "toolledger.cli", "serve", "--port", "0"]
    command += ["--data", str(data), "--tokens", str(tokens), "--demo", *extra]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=60)


async def test_an_embedded_ledger_keeps_the_key_scope_it_was_made_with(tmp_path: Path) -> None:
    serve = EmbeddedServe.new(tmp_path, "--create")
    serve.start("--key-scope", "tenant")
    try:
        await _shared_key_story(Server("embedded", serve.base_url, serve.data / "helpdesk.db", 5))
    finally:
        serve.stop()
    serve.start()  # without the option: the ledger's own scope
    try:
        await _shared_key_story(Server("embedded", serve.base_url, serve.data / "helpdesk.db", 5))
    finally:
        serve.stop()
    refused = _serve(serve.data, serve.workdir / "tokens.json", "--key-scope", "tenant+principal")
    assert refused.returncode == 2, refused
    lines = [line for line in refused.stdout.splitlines() if line.strip()]
    assert len(lines) == 1 and "scopes keys by tenant, not tenant+principal" in lines[0], lines
    unknown = _serve(serve.data, serve.workdir / "tokens.json", "--key-scope", "principal")
    assert unknown.returncode == 2 and "'tenant' or 'tenant+principal'" in unknown.stdout


@pytest.fixture
def tenant_scoped_kafka(services: Services, tmp_path: Path) -> Iterator[Server]:
    """Front door and executor both ``--key-scope tenant``."""
    shared = start_distributed(
        tmp_path, services, "--key-scope", "tenant", executor_extra=("--key-scope", "tenant")
    )
    try:
        yield shared
    finally:
        shared.stop()


@pytest.fixture
def split_kafka(services: Services, tmp_path: Path) -> Iterator[Server]:
    """A front door of the default scope (tenant+principal) before a ``--key-scope tenant``
    executor."""
    split = start_distributed(tmp_path, services, executor_extra=("--key-scope", "tenant"))
    try:
        yield split
    finally:
        split.stop()


@pytest.mark.services
async def test_kafka_front_doors_and_executors_of_one_key_scope(
    tenant_scoped_kafka: Server,
) -> None:
    await _shared_key_story(tenant_scoped_kafka)


@pytest.mark.services
async def test_a_kafka_executor_of_another_key_scope_refuses_the_calls(
    split_kafka: Server,
) -> None:
    """A front door that scopes keys by principal in front of an executor that scopes them by
    tenant would split one call's keys: every call is refused, naming the setting, and runs
    nothing."""
    key = f"split-{uuid.uuid4().hex[:12]}"
    async with httpx.AsyncClient(base_url=split_kafka.base_url, timeout=60) as api:
        answer = await post_call(api, "create_ticket", TICKET, key=key, headers=_as(ACME))
    problem = assert_problem(answer, 503, "INTERNAL")
    assert (
        "by tenant+principal, the executor scopes create_ticket's keys by tenant"
        in problem["detail"]
    )
    assert "--key-scope" in problem["detail"]
    assert split_kafka.effects(ACME.tenant, "create_ticket", key) == 0
