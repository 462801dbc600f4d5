"""The OpenAPI document (``/openapi.json``): the problem responses every route documents, and
what FastAPI does not write by itself: problems under ``application/problem+json``, the bearer
scheme's token format, and a typed path per registered tool (``/v1/tools/create_ticket/calls``,
operation ``callTool_create_ticket``) whose body has that tool's arguments schema. A tool's
path is documentation only: the server routes it as ``/v1/tools/{tool}/calls``."""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI

from toolledger.producers.http.access import SCHEME
from toolledger.producers.http.door import FrontDoor, ToolInfo
from toolledger.producers.http.models import Call, CallBody
from toolledger.producers.http.problems import Problem
from toolledger.producers.http.responses import JSON, PROBLEM

CALLS_PATH = "/v1/tools/{tool}/calls"
_REF = "#/components/schemas/"


def header_doc(description: str) -> dict[str, Any]:
    return {"description": description, "schema": {"type": "string"}}


RETRY_AFTER_DOC = {"Retry-After": header_doc("Seconds to wait before retrying with the same key.")}
ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": Problem, "content": {PROBLEM: {}}, "description": description}
    for status, description in [
        (400, "Invalid request"),
        (401, "Not authenticated"),
        (403, "Forbidden"),
        (404, "Not found"),
        (405, "Method not allowed"),
        (409, "Still running"),
        (413, "Too large"),
        (422, "Key reused"),
        (428, "Approval required"),
        (429, "Rate limited"),
        (502, "Downstream failure"),
        (503, "Unavailable"),
    ]
}


def documented(*codes: int) -> dict[int | str, dict[str, Any]]:
    """Responses ``codes`` (described by their body) and the problems every route documents."""
    return {code: {"description": "See the body"} for code in codes} | ERRORS


def call_responses() -> dict[int | str, dict[str, Any]]:
    """The responses of ``POST /v1/tools/{tool}/calls``, with the headers they carry."""
    responses: dict[int | str, dict[str, Any]] = {
        200: {
            "model": Call,
            "description": "The call finished (or a replay of its stored outcome)",
            "headers": {
                "Idempotent-Replayed": header_doc(
                    "'true' on a replay; absent on a first execution."
                )
            },
        },
        202: {
            "model": Call,
            "description": "Still running after the wait: status PENDING",
            "headers": {"Location": header_doc("/v1/calls/{call_id}: where the outcome appears.")},
        },
        **ERRORS,
    }
    for status in (409, 429, 503):
        responses[status] = {**responses[status], "headers": RETRY_AFTER_DOC}
    return responses


def request_body(schema: dict[str, Any]) -> dict[str, Any]:
    """``openapi_extra`` for a route that reads its JSON body itself."""
    return {"requestBody": {"required": True, "content": {JSON: {"schema": schema}}}}


def install(app: FastAPI, door: FrontDoor) -> None:
    """Serve ``app``'s document with what this module adds (built once, on first request)."""
    generated = app.openapi

    def document() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = generated()  # FastAPI keeps it as app.openapi_schema
            problem_media(schema)
            bearer_format(schema, door)
            tool_paths(schema, door.tools)
        return app.openapi_schema  # type: ignore[return-value]

    app.openapi = document  # type: ignore[method-assign]


def problem_media(schema: dict[str, Any]) -> None:
    """Document problems under ``application/problem+json`` (the media type they are sent with)
    and drop FastAPI's default 422 (this API answers invalid requests with 400)."""
    for operations in schema.get("paths", {}).values():
        for operation in operations.values():
            responses = operation.get("responses", {})
            default_422 = responses.get("422", {}).get("content", {}).get(JSON, {})
            if default_422.get("schema", {}).get("$ref", "").endswith("/HTTPValidationError"):
                del responses["422"]
            for response in responses.values():
                content = response.get("content", {})
                if PROBLEM not in content or "schema" in content[PROBLEM]:
                    continue
                for media in [m for m in content if m != PROBLEM]:
                    if content[media].get("schema", {}).get("$ref", "").endswith("/Problem"):
                        content[PROBLEM] = content.pop(media)
    components = schema.get("components", {}).get("schemas", {})
    if "HTTPValidationError" not in json.dumps(schema.get("paths", {})):
        components.pop("HTTPValidationError", None)
        components.pop("ValidationError", None)


def bearer_format(schema: dict[str, Any], door: FrontDoor) -> None:
    """Where the server verifies JWTs, the bearer scheme says its tokens are JWTs."""
    scheme = schema.get("components", {}).get("securitySchemes", {}).get(SCHEME)
    if scheme is not None and door.accepts_jwts:
        scheme["bearerFormat"] = "JWT"


def tool_paths(schema: dict[str, Any], tools: Mapping[str, ToolInfo]) -> None:
    """A path per tool, a copy of the generic call operation typed with the tool's schemas."""
    generic = schema["paths"][CALLS_PATH]["post"]
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    for name in sorted(tools):
        operation = tool_operation(generic, name, tools[name], components)
        schema["paths"][CALLS_PATH.replace("{tool}", name)] = {"post": operation}


def tool_operation(
    generic: dict[str, Any], name: str, info: ToolInfo, components: dict[str, Any]
) -> dict[str, Any]:
    """The body's ``arguments`` is the tool's arguments schema, the Call's ``result`` its result
    schema (or null: failed, pending or unknown calls have none)."""
    manifest = info.manifest
    untyped = {"type": "object"}
    arguments = hoisted(manifest.get("arguments_schema", untyped), f"{name}_arguments_", components)
    result = hoisted(manifest.get("result_schema", {}), f"{name}_result_", components)
    body, call = f"CallBody_{name}", f"Call_{name}"
    components[body] = typed_body(name, arguments)
    components[call] = typed_call(name, components["Call"], result)
    operation = copy.deepcopy(generic)
    operation["operationId"] = f"callTool_{name}"
    operation["summary"] = f"Call {name}"
    operation["description"] = str(manifest.get("description", ""))
    operation["parameters"] = tool_parameters(operation.get("parameters", []), info)
    operation["requestBody"]["content"][JSON]["schema"] = {"$ref": _REF + body}
    for status in ("200", "202"):
        operation["responses"][status]["content"][JSON]["schema"] = {"$ref": _REF + call}
    return operation


def typed_body(tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    body = copy.deepcopy(CallBody.model_json_schema())
    body["title"] = f"CallBody_{tool}"
    body["description"] = f"The request body of POST /v1/tools/{tool}/calls."
    body["properties"]["arguments"] = arguments
    return body


def typed_call(tool: str, generic: dict[str, Any], result: dict[str, Any]) -> dict[str, Any]:
    call = copy.deepcopy(generic)
    call["title"] = f"Call_{tool}"
    call["description"] = f"The Call resource of a call of {tool}."
    call["properties"]["result"] = {"anyOf": [result, {"type": "null"}], "title": "Result"}
    return call


def tool_parameters(parameters: list[dict[str, Any]], info: ToolInfo) -> list[dict[str, Any]]:
    """The generic operation's parameters without ``{tool}``; the key is required for a tool
    that needs one and left out for a read-only tool (which ignores it)."""
    kept = []
    for parameter in parameters:
        if parameter["in"] == "path" and parameter["name"] == "tool":
            continue
        if parameter["in"] == "header" and parameter["name"].lower() == "idempotency-key":
            if not info.keyed:
                continue
            schema = {k: v for k, v in parameter["schema"].items() if k != "anyOf"}
            parameter = {**parameter, "required": True, "schema": {**schema, "type": "string"}}
        kept.append(parameter)
    return kept


def hoisted(schema: dict[str, Any], prefix: str, components: dict[str, Any]) -> dict[str, Any]:
    """``schema`` with its ``$defs`` moved to the document's components (named ``prefix`` +
    their name) and its references rewritten: in an OpenAPI document ``#/$defs/...`` would
    point at the document's root."""
    schema = copy.deepcopy(schema)
    definitions = schema.pop("$defs", {})

    def rewrite(node: Any) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/$defs/"):
                node = {**node, "$ref": _REF + prefix + ref.removeprefix("#/$defs/")}
            return {key: rewrite(value) for key, value in node.items()}
        if isinstance(node, list):
            return [rewrite(item) for item in node]
        return node

    for name, definition in definitions.items():
        components[prefix + name] = rewrite(definition)
    result: dict[str, Any] = rewrite(schema)
    return result
