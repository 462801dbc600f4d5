"""An error no route answered is answered 503 by the API's own middleware, not re-raised to
the server (which would drop the keep-alive connection without ``Connection: close``)."""

from __future__ import annotations

import json
from collections.abc import MutableMapping
from typing import Any

from toolledger.producers.http.app import _AnswerErrors


async def test_an_unhandled_error_becomes_a_503_problem_and_is_not_re_raised() -> None:
    async def broken(scope: Any, receive: Any, send: Any) -> None:
        raise RuntimeError("driver said: disk I/O error at /secret/path")

    sent: list[MutableMapping[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "GET", "path": "/v1/calls", "headers": []}
    await _AnswerErrors(broken)(scope, receive, send)  # returns: the server sees no error
    start, body = sent[0], sent[1]
    assert start["status"] == 503
    headers = dict(start["headers"])
    assert headers[b"retry-after"] == b"1"
    assert headers[b"content-type"].startswith(b"application/problem+json")
    problem = json.loads(body["body"])
    assert problem["code"] == "INTERNAL" and problem["retryable"] is True
    assert "secret" not in body["body"].decode()  # no driver message reaches the caller
