"""The OpenAPI document as clients generate from it: a valid OpenAPI 3.1 document with a bearer
security scheme on every authenticated operation, stable camelCase operation ids, and a typed
path per tool whose body's ``arguments`` is that tool's arguments schema.

The served document is read from the real server; documents of other front doors (JWTs
accepted, a tool with nested models) are built in process, nothing is served."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, cast

import httpx
from openapi_spec_validator import validate
from pydantic import BaseModel

from tests.http.helpers import JSON
from toolledger.processors.toolsets.helpdesk.store import HelpdeskStore
from toolledger.processors.toolsets.helpdesk.tools import (
    CreateTicketArgs,
    TicketRef,
    helpdesk_registry,
)
from toolledger.producers.client import TrustedContext
from toolledger.producers.http.app import FrontDoor, ToolInfo, create_app
from toolledger.producers.http.auth import AuthFailure, CombinedAuthenticator, TokenStore
from toolledger.serve import tool_infos

# the operation ids clients are generated with: changing one breaks their code
OPERATION_IDS = {
    ("post", "/v1/tools/{tool}/calls"): "callTool",
    ("get", "/v1/calls/{call_id}"): "getCall",
    ("get", "/v1/calls"): "searchCalls",
    ("get", "/v1/calls/{call_id}/events"): "getCallEvents",
    ("post", "/v1/calls/{call_id}/job"): "reportJob",
    ("post", "/v1/calls/{call_id}/job/cancel"): "cancelJob",
    ("post", "/v1/groups"): "submitGroup",
    ("get", "/v1/groups"): "searchGroups",
    ("get", "/v1/groups/{group_id}"): "getGroup",
    ("post", "/v1/groups/{group_id}/resume"): "resumeGroup",
    ("get", "/v1/tools"): "listTools",
    ("get", "/v1/approval-requests"): "listApprovalRequests",
    ("get", "/v1/approval-requests/{approval_id}"): "getApprovalRequest",
    ("post", "/v1/approval-requests/{approval_id}/approve"): "approveApprovalRequest",
    ("post", "/v1/approval-requests/{approval_id}/deny"): "denyApprovalRequest",
    ("put", "/v1/tools/{tool}/switch"): "setToolSwitch",
    ("get", "/v1/stats"): "getStats",
    ("get", "/v1/runs/{run_id}/report"): "getRunReport",
    ("get", "/healthz"): "healthz",
    ("get", "/readyz"): "readyz",
    ("get", "/metrics"): "metrics",
    ("get", "/problems/{code}"): "getProblemType",
}
PUBLIC = {"/healthz", "/readyz", "/metrics", "/problems/{code}"}
CAMEL_CASE = re.compile(r"[a-z]+(?:[A-Z][a-z]*)*")


def operations(doc: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {
        (method, path): operation
        for path, methods in doc["paths"].items()
        for method, operation in methods.items()
    }


def resolve(doc: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    ref = schema.get("$ref")
    if ref is None:
        return schema
    assert ref.startswith("#/components/schemas/"), ref
    found: dict[str, Any] = doc["components"]["schemas"][ref.rsplit("/", 1)[1]]
    return found


def body_schema(doc: dict[str, Any], operation: dict[str, Any]) -> dict[str, Any]:
    return resolve(doc, operation["requestBody"]["content"][JSON]["schema"])


async def served(client: httpx.AsyncClient) -> dict[str, Any]:
    response = await client.get("/openapi.json")
    assert response.status_code == 200
    doc: dict[str, Any] = response.json()
    return doc


async def test_the_document_is_valid_openapi(client: httpx.AsyncClient) -> None:
    doc = await served(client)
    assert doc["openapi"].startswith("3.1")
    validate(doc)  # raises on any violation of the OpenAPI 3.1 schema, and on broken $refs


async def test_authenticated_operations_have_the_bearer_scheme(client: httpx.AsyncClient) -> None:
    doc = await served(client)
    schemes = doc["components"]["securitySchemes"]
    assert list(schemes) == ["bearerAuth"]
    assert schemes["bearerAuth"]["type"] == "http"
    assert schemes["bearerAuth"]["scheme"] == "bearer"
    assert "bearerFormat" not in schemes["bearerAuth"]  # this server takes opaque tokens only
    for (method, path), operation in operations(doc).items():
        if path in PUBLIC:
            assert "security" not in operation, (method, path)
        else:
            assert operation["security"] == [{"bearerAuth": []}], (method, path)
            assert "401" in operation["responses"], (method, path)


async def test_operation_ids_are_stable_unique_and_camel_case(client: httpx.AsyncClient) -> None:
    doc = await served(client)
    found = {where: op["operationId"] for where, op in operations(doc).items()}
    assert len(set(found.values())) == len(found), "operation ids must be unique"
    generic = {where: name for where, name in found.items() if where in OPERATION_IDS}
    assert generic == OPERATION_IDS
    tools = (await client.get("/v1/tools")).json()["items"]
    per_tool = {where: name for where, name in found.items() if where not in OPERATION_IDS}
    assert per_tool == {
        ("post", f"/v1/tools/{t['name']}/calls"): f"callTool_{t['name']}" for t in tools
    }
    for name in generic.values():
        assert CAMEL_CASE.fullmatch(name), (
            name
        )  # not FastAPI's call_tool_v1_tools__tool__calls_post


async def test_each_tool_has_a_typed_path(client: httpx.AsyncClient) -> None:
    doc = await served(client)
    tools = {t["name"]: t for t in (await client.get("/v1/tools")).json()["items"]}
    assert {"create_ticket", "list_tickets", "send_email"} <= set(tools)
    for name, manifest in tools.items():
        operation = doc["paths"][f"/v1/tools/{name}/calls"]["post"]
        body = body_schema(doc, operation)
        assert body["properties"]["arguments"] == manifest["arguments_schema"], name
        assert set(body["properties"]) == {"arguments", "run_id", "step_id", "approval_token"}
        assert body["required"] == ["arguments"] and body["additionalProperties"] is False
        call = resolve(doc, operation["responses"]["200"]["content"][JSON]["schema"])
        assert call["properties"]["result"]["anyOf"] == [
            manifest["result_schema"],
            {"type": "null"},
        ]
        assert not any(p["in"] == "path" for p in operation.get("parameters", []))
        keys = [p for p in operation.get("parameters", []) if p["name"] == "Idempotency-Key"]
        if manifest["idempotency_key_required"]:
            assert keys and keys[0]["required"] is True, name
        else:
            assert keys == [], name  # a read-only tool ignores the key
    create = doc["paths"]["/v1/tools/create_ticket/calls"]["post"]
    assert (
        body_schema(doc, create)["properties"]["arguments"] == CreateTicketArgs.model_json_schema()
    )
    typed = resolve(doc, create["responses"]["200"]["content"][JSON]["schema"])
    assert typed["properties"]["result"]["anyOf"][0] == TicketRef.model_json_schema()
    # the generic path stays documented, with untyped arguments
    generic = doc["paths"]["/v1/tools/{tool}/calls"]["post"]
    assert body_schema(doc, generic)["properties"]["arguments"]["type"] == "object"
    assert "properties" not in body_schema(doc, generic)["properties"]["arguments"]


# -- documents of other front doors, built in process ----------------------------------------


class _AnyJwt:
    def verify(self, token: str) -> TrustedContext | AuthFailure:
        return AuthFailure("unknown_token", "not used here", "jwt")


async def _never_ready() -> dict[str, bool]:
    return {}


def _document(tools: dict[str, ToolInfo], *, jwt: bool = False) -> dict[str, Any]:
    tokens = TokenStore([])
    door = FrontDoor(
        cast(Any, None),  # the document needs no backend
        cast(Any, None),
        tools,
        tokens,
        _never_ready,
        authenticator=CombinedAuthenticator(tokens, _AnyJwt()) if jwt else None,
    )
    doc: dict[str, Any] = create_app(door).openapi()
    return doc


def test_where_jwts_are_accepted_the_bearer_format_is_jwt(tmp_path: Path) -> None:
    tools = tool_infos(helpdesk_registry(HelpdeskStore(tmp_path / "helpdesk.db")))
    doc = _document(tools, jwt=True)
    validate(doc)
    assert doc["components"]["securitySchemes"]["bearerAuth"]["bearerFormat"] == "JWT"
    assert "bearerFormat" not in _document(tools)["components"]["securitySchemes"]["bearerAuth"]


class Address(BaseModel):
    street: str


class Shipment(BaseModel):
    to: Address
    via: list[Address] = []


def test_nested_argument_models_become_components(tmp_path: Path) -> None:
    """A schema's ``$defs`` would not resolve inside an OpenAPI document: they are moved to
    the components, named after the tool, and the references follow them."""
    manifest = {
        "name": "ship",
        "description": "Ship a parcel.",
        "arguments_schema": Shipment.model_json_schema(),
        "result_schema": Address.model_json_schema(),
    }
    doc = _document({"ship": ToolInfo("ship", True, manifest)})
    validate(doc)
    arguments = body_schema(doc, doc["paths"]["/v1/tools/ship/calls"]["post"])["properties"][
        "arguments"
    ]
    assert "$defs" not in arguments
    assert arguments["properties"]["to"] == {"$ref": "#/components/schemas/ship_arguments_Address"}
    assert doc["components"]["schemas"]["ship_arguments_Address"] == Address.model_json_schema()
