"""MCP over streamable HTTP authenticates like the HTTP API: tokens of the tokens file and JWTs
verified against a JWKS file (issuer, audience, key by ``kid``); the tenant comes from the token.

* ``toolledger mcp --transport http --jwks ... --jwt-issuer ... --jwt-audience ...`` in a
  subprocess: JWT calls, opaque tokens next to them, 401s with the verifier's reason;
* in process: one embedded front door serving both the HTTP API and MCP, so an operator (a JWT
  with the ``operator`` scope) approves over HTTP what an agent (a JWT) asked for over MCP.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import httpx2
import jwt
import pytest
import uvicorn
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.hazmat.primitives.asymmetric.rsa import RSAPrivateKey
from jwt.algorithms import RSAAlgorithm
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS

from tests.mcp.common import (
    ACME_TOKEN,
    CHARGE,
    ROOT,
    Deployment,
    approval_request,
    body,
    deployment,
    error_code,
    free_port,
    http_client,
    http_server_process,
    new_key,
    server_command,
)
from toolledger import serve
from toolledger.mcp_wiring import door_authenticator, mcp_server
from toolledger.processors.toolsets.helpdesk import HelpdeskStore, helpdesk_registry
from toolledger.producers.http.app import create_app
from toolledger.producers.http.auth import TokenStore
from toolledger.settings import LedgerSettings

ISSUER = "https://issuer.test/"
AUDIENCE = "toolledger-mcp-test"


# -- keys and tokens --------------------------------------------------------------------------


@dataclass(frozen=True)
class Keys:
    signing: RSAPrivateKey  # in the JWKS as kid "rsa-1"
    other: RSAPrivateKey  # in no JWKS

    def jwks(self) -> dict[str, Any]:
        public = json.loads(RSAAlgorithm.to_jwk(self.signing.public_key()))
        return {"keys": [{**public, "kid": "rsa-1", "use": "sig"}]}

    def write_jwks(self, path: Path) -> Path:
        path.write_text(json.dumps(self.jwks()))
        return path


@pytest.fixture(scope="module")
def keys() -> Keys:
    return Keys(
        rsa.generate_private_key(public_exponent=65537, key_size=2048),
        rsa.generate_private_key(public_exponent=65537, key_size=2048),
    )


def claims(tenant: str, subject: str, **overrides: Any) -> dict[str, Any]:
    now = int(time.time())
    values: dict[str, Any] = {
        "iss": ISSUER,
        "aud": AUDIENCE,
        "sub": subject,
        "tenant_id": tenant,
        "scope": "tools:call",
        "iat": now,
        "exp": now + 600,
    }
    values.update(overrides)
    return {k: v for k, v in values.items() if v is not None}


def sign(
    keys: Keys, tenant: str, subject: str, *, key: RSAPrivateKey | None = None, **overrides: Any
) -> str:
    return jwt.encode(
        claims(tenant, subject, **overrides),
        key or keys.signing,
        algorithm="RS256",
        headers={"kid": "rsa-1"},
    )


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def fresh_tenant() -> str:
    return f"t-{uuid.uuid4().hex[:10]}"


# -- toolledger mcp with --jwks, in a subprocess ----------------------------------------------


def jwt_options(jwks: Path) -> tuple[str, ...]:
    return ("--jwks", str(jwks), "--jwt-issuer", ISSUER, "--jwt-audience", AUDIENCE)


@pytest.fixture(scope="module")
def jwt_server(keys: Keys, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    deploy = deployment(tmp_path_factory.mktemp("mcp-jwt"))
    jwks = keys.write_jwks(deploy.tokens.parent / "jwks.json")
    # keys scoped by tenant: an opaque token of the tenant (another principal) shares the JWT
    # caller's keys, which is what test_jwt_calls_over_mcp shows
    with http_server_process(deploy, *jwt_options(jwks), "--key-scope", "tenant") as running:
        yield running


async def test_jwt_calls_over_mcp(jwt_server: Deployment, keys: Keys, mode: str) -> None:
    """The tenant and principal come from the JWT's claims; an opaque token of the same tenant
    sees the same calls."""
    key = new_key()
    arguments = {"title": "From a JWT", "idempotency_key": key}
    async with http_client(jwt_server.url, sign(keys, "acme", "agent-jwt"), mode) as client:
        first = body(await client.call_tool("create_ticket", arguments))
        assert first["ok"] is True and first["replayed"] is False
        # approvals work the same for JWT callers
        request = approval_request(
            await client.call_tool("charge_card", {**CHARGE, "idempotency_key": key})
        )
        assert request["tool"] == "charge_card"
    async with http_client(jwt_server.url, ACME_TOKEN, mode) as client:
        again = body(await client.call_tool("create_ticket", dict(arguments)))
    assert again["replayed"] is True and again["result"] == first["result"]
    assert jwt_server.effects("acme", "create_ticket", key) == 1

    tenant = fresh_tenant()
    async with http_client(jwt_server.url, sign(keys, tenant, "agent-x"), mode) as client:
        theirs = body(await client.call_tool("create_ticket", dict(arguments)))
        listed = body(await client.call_tool("list_tickets", {}))
    assert theirs["replayed"] is False  # another tenant: another call
    assert [t["ticket_id"] for t in listed["result"]["tickets"]] == [theirs["result"]["ticket_id"]]
    assert jwt_server.effects(tenant, "create_ticket", key) == 1


_INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": HANDSHAKE_PROTOCOL_VERSIONS[-1],
        "capabilities": {},
        "clientInfo": {"name": "raw", "version": "0"},
    },
}
_ACCEPT = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


async def test_bad_jwts_are_refused_with_the_reason(jwt_server: Deployment, keys: Keys) -> None:
    now = int(time.time())
    unsigned = ".".join(
        (
            b64(json.dumps({"alg": "none", "typ": "JWT"}).encode()),
            b64(json.dumps(claims("acme", "a")).encode()),
            "",
        )
    )
    refused = {
        "expired": sign(keys, "acme", "a", iat=now - 900, exp=now - 600),
        "audience": sign(keys, "acme", "a", aud="someone-else"),
        "issuer": sign(keys, "acme", "a", iss="https://evil.test/"),
        "signature": sign(keys, "acme", "a", key=keys.other),
        "alg none": unsigned,
        "no tenant": sign(keys, "acme", "a", tenant_id=None),
        "unknown opaque token": "not-a-known-token-at-all",
    }
    details = {
        "expired": "expired",
        "audience": "audience",
        "issuer": "issuer",
        "signature": "signature",
        "alg none": "Unsigned",
        "no tenant": "tenant_id",
        "unknown opaque token": "not known",
    }
    async with httpx2.AsyncClient(timeout=30) as http:
        for name, token in refused.items():
            response = await http.post(
                jwt_server.url,
                json=_INITIALIZE,
                headers={**_ACCEPT, "Authorization": f"Bearer {token}"},
            )
            assert response.status_code == 401, name
            challenge = response.headers["www-authenticate"]
            assert challenge.startswith('Bearer error="invalid_token"'), challenge
            detail = response.json()["error_description"]
            assert details[name] in detail and details[name] in challenge, (name, detail)
            assert token not in response.text and token not in challenge
        missing = await http.post(jwt_server.url, json=_INITIALIZE, headers=_ACCEPT)
        assert missing.status_code == 401 and missing.headers["www-authenticate"] == "Bearer"
    log = (jwt_server.tokens.parent / "server.log").read_text()
    assert "authentication failed" in log
    assert refused["expired"] not in log  # the reason is logged, never the token


async def test_a_session_is_bound_to_the_jwt_identity(jwt_server: Deployment, keys: Keys) -> None:
    async with httpx2.AsyncClient(timeout=30) as http:
        opened = await http.post(
            jwt_server.url,
            json=_INITIALIZE,
            headers={**_ACCEPT, "Authorization": f"Bearer {sign(keys, 'acme', 'agent-jwt')}"},
        )
        assert opened.status_code == 200
        listing = {"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}}
        session = {
            **_ACCEPT,
            "Mcp-Session-Id": opened.headers["mcp-session-id"],
            "MCP-Protocol-Version": HANDSHAKE_PROTOCOL_VERSIONS[-1],
        }
        for other in (
            sign(keys, "globex", "agent-jwt"),  # the same subject in another tenant
            sign(keys, "acme", "agent-other"),  # another subject of the same tenant
        ):
            foreign = {**session, "Authorization": f"Bearer {other}"}
            hijack = await http.post(jwt_server.url, json=listing, headers=foreign)
            stream = await http.get(jwt_server.url, headers=foreign)
            closed = await http.delete(jwt_server.url, headers=foreign)
            assert (hijack.status_code, stream.status_code, closed.status_code) == (404, 404, 404)
        owner = {**session, "Authorization": f"Bearer {sign(keys, 'acme', 'agent-jwt')}"}
        still = await http.post(jwt_server.url, json=listing, headers=owner)
        assert still.status_code == 200, still.text  # a foreign DELETE did not end it


def test_unusable_jwt_settings_refuse_to_start(tmp_path: Path, keys: Keys) -> None:
    deploy = deployment(tmp_path)
    jwks = keys.write_jwks(tmp_path / "jwks.json")
    broken = tmp_path / "broken.json"
    broken.write_text('{"keys": []}')
    for options, message in (
        (("--jwks", str(jwks), "--jwt-issuer", ISSUER), b"issuer and an audience"),
        (("--jwt-issuer", ISSUER), b"JWKS"),
        (jwt_options(broken), b"no signing keys"),
        ((*jwt_options(jwks), "--jwt-algorithms", "HS256"), b"HS256"),
    ):
        done = subprocess.run(
            server_command(deploy, "--transport", "http", "--port", str(free_port()), *options),
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=120,
        )
        assert done.returncode == 2, (options, done.stderr)
        assert message in b" ".join(done.stderr.split()), (options, done.stderr)


# -- in process: the HTTP API and MCP on one front door ----------------------------------------


@dataclass
class Door:
    mcp_url: str
    api: httpx.AsyncClient
    store: HelpdeskStore


@contextlib.asynccontextmanager
async def uvicorn_serving(app: Any, port: int) -> AsyncIterator[None]:
    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=port,
        log_config=None,
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=5,
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    try:
        deadline = time.monotonic() + 30
        while not server.started:
            if task.done():
                task.result()
                raise AssertionError("the MCP server stopped before it started")
            assert time.monotonic() < deadline, "the MCP server did not start"
            await asyncio.sleep(0.02)
        yield
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 30)


@contextlib.asynccontextmanager
async def one_door(root: Path, keys: Keys) -> AsyncIterator[Door]:
    """An embedded front door authenticating tokens and JWTs, serving the HTTP API (through
    an ASGI transport) and MCP (uvicorn on a free port), as ``toolledger serve`` and
    ``toolledger mcp`` would on the same flags."""
    store = HelpdeskStore(root / "helpdesk.db")
    try:
        security = serve.Security(
            TokenStore([]), keys.write_jwks(root / "jwks.json"), ISSUER, AUDIENCE
        )
        settings = LedgerSettings(path=root / "ledger.db", create=True)
        async with serve.front_door(settings, helpdesk_registry(store), security) as door:
            port = free_port()
            app = mcp_server(door, wait_s=10).http_app(
                door_authenticator(door), throttle=door.auth_throttle, host="127.0.0.1"
            )
            transport = httpx.ASGITransport(app=create_app(door))
            async with (
                uvicorn_serving(app, port),
                httpx.AsyncClient(transport=transport, base_url="http://api", timeout=30) as api,
            ):
                yield Door(f"http://127.0.0.1:{port}/mcp", api, store)
    finally:
        store.close()


async def approve_over_http(api: httpx.AsyncClient, operator: str, approval_id: str) -> str:
    """``POST /v1/approval-requests/{id}/approve`` as an operator; the approval token."""
    headers = {"Authorization": f"Bearer {operator}"}
    deadline = time.monotonic() + 10
    while True:  # the projection may be a moment behind the answer the agent got
        response = await api.post(f"/v1/approval-requests/{approval_id}/approve", headers=headers)
        if response.status_code != 404 or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.05)
    assert response.status_code == 200, response.text
    approved = response.json()
    assert approved["confirmed"] is True and approved["approval_request"]["id"] == approval_id
    token: str = approved["approval_token"]
    return token


async def test_approval_round_trip_over_http_with_jwts(
    tmp_path: Path, keys: Keys, mode: str
) -> None:
    agent = sign(keys, "acme", "agent-jwt")
    operator = sign(keys, "acme", "op-jwt", scope="operator")
    async with one_door(tmp_path, keys) as door:
        key = new_key()
        arguments = {**CHARGE, "idempotency_key": key}
        async with http_client(door.mcp_url, agent, mode) as client:
            request = approval_request(await client.call_tool("charge_card", arguments))
            # the operator sees the same request in the HTTP API's listing
            pending = await door.api.get(
                "/v1/approval-requests?status=pending",
                headers={"Authorization": f"Bearer {operator}"},
            )
            assert pending.status_code == 200, pending.text
            listed = {item["id"]: item for item in pending.json()["items"]}
            assert request["id"] in listed
            for field in ("tool", "arguments", "args_digest", "impact"):
                assert listed[request["id"]][field] == request[field], field
            assert listed[request["id"]]["requested_by"] == "agent-jwt"

            token = await approve_over_http(door.api, operator, request["id"])
            approved = await client.call_tool("charge_card", {**arguments, "approval_token": token})
            assert approved.is_error is False, body(approved)
            done = body(approved)
            assert done["ok"] is True and done["replayed"] is False
            assert door.store.effect_count("acme", "charge_card", key) == 1

            replayed = body(await client.call_tool("charge_card", dict(arguments)))
            assert replayed["replayed"] is True and replayed["result"] == done["result"]
            other = {**CHARGE, "idempotency_key": new_key(), "approval_token": token}
            assert error_code(await client.call_tool("charge_card", other)) == "APPROVAL_INVALID"
        assert door.store.effect_count("acme", "charge_card", key) == 1
        assert door.store.effect_count("acme", "charge_card", other["idempotency_key"]) == 0
