"""One key retention per Kafka deployment (issue 33, item 10): it is recorded on the
deployment's settings topic, by ``toolledger topics --key-retention`` or else by the first
process to start; ``serve`` and ``executor`` apply and state the recorded one, and one whose
``--key-retention`` disagrees refuses to start in one line, so ``GET /v1/tools`` never states
another retention than the executors apply. On a real broker (and PostgreSQL for serve)."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from datetime import timedelta
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from tests.http.servers import ACME, REDACTION_SECRET, start_distributed, write_tokens
from tests.services import Services
from toolledger.cli import app
from toolledger.config import ConfigError
from toolledger.kafka_admin import ensure_topics
from toolledger.kafka_settings import agreed_key_retention, recorded_key_retention
from toolledger.processors.tools.retention import FOREVER, KeyRetention
from toolledger.schemas.topics import Topics

pytestmark = pytest.mark.services


def _topics(services: Services, prefix: str, *more: str) -> str:
    done = CliRunner().invoke(
        app, ["topics", "--kafka", services.kafka, "--prefix", prefix, "--partitions", "4", *more]
    )
    assert done.exit_code == 0, done.output
    return done.output


def _refusal(output: str) -> str:
    lines = [line for line in output.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in output, output
    return lines[0]


def test_topics_records_it_and_a_disagreeing_executor_or_serve_refuses_in_one_line(
    services: Services, tmp_path: Path
) -> None:
    prefix = f"kr{uuid.uuid4().hex[:8]}."
    before = _topics(services, prefix)
    assert f"{prefix}settings: no key retention recorded yet" in before
    assert f"{prefix}settings: cleanup.policy=delete, retention.ms=-1" in before
    output = _topics(services, prefix, "--key-retention", "2s")
    assert f"{prefix}settings: key_retention=PT2S (recorded by topics" in output
    common = ["--kafka", services.kafka, "--prefix", prefix, "--partitions", "4"]
    executor = CliRunner(env={"TOOLLEDGER_REDACTION_SECRET": REDACTION_SECRET}).invoke(
        app,
        [
            "executor",
            "--demo",
            *common,
            "--helpdesk-db",
            str(tmp_path / "helpdesk.db"),
            "--key-retention",
            "1h",
        ],
    )
    assert executor.exit_code == 2
    line = _refusal(executor.output)
    assert "--key-retention PT1H disagrees with this deployment's key retention PT2S" in line
    assert "'toolledger topics --key-retention PT1H'" in line
    dsn = asyncio.run(services.fresh_database())
    serve = CliRunner().invoke(
        app,
        [
            "serve",
            *common,
            "--demo",
            "--postgres",
            dsn,
            "--data",
            str(tmp_path / "serve"),
            "--tokens",
            str(write_tokens(tmp_path / "tokens.json")),
            "--key-retention",
            "forever",
        ],
    )
    assert serve.exit_code == 2
    assert "--key-retention forever disagrees" in _refusal(serve.output)
    # the same value is no disagreement, and a later 'topics' changes it for every process
    assert _topics(services, prefix, "--key-retention", "24h").count("key_retention=PT24H") == 1


async def test_processes_starting_at_once_agree_on_the_first_record(services: Services) -> None:
    topics = Topics(f"kr{uuid.uuid4().hex[:8]}.", 4)
    await ensure_topics(services.kafka, topics)
    assert await recorded_key_retention(services.kafka, topics) is None
    asked: list[KeyRetention] = [timedelta(seconds=30), timedelta(hours=2), FOREVER]
    answers = await asyncio.gather(
        *(
            agreed_key_retention(services.kafka, topics, a, timedelta(hours=24), who=f"p{i}")
            for i, a in enumerate(asked)
        ),
        return_exceptions=True,
    )
    agreed = [a for a in answers if not isinstance(a, BaseException)]
    refused = [a for a in answers if isinstance(a, BaseException)]
    assert len(agreed) == 1 and len(refused) == 2, answers
    assert all(isinstance(r, ConfigError) and "disagrees" in str(r) for r in refused)
    # whoever comes next, without an option of its own, applies the same one
    later = await agreed_key_retention(
        services.kafka, topics, None, timedelta(hours=24), who="late"
    )
    assert later == agreed[0]


def test_serve_and_executor_apply_and_state_the_recorded_retention(
    services: Services, tmp_path: Path
) -> None:
    """``topics --key-retention 2s``, then an executor and a front door without the option:
    ``GET /v1/tools`` states 2 s and the executor expires the key after it (the same key then
    runs as a new call). Before, both took their own --key-retention (24h by default)."""
    prefix = f"kr{uuid.uuid4().hex[:8]}."
    _topics(services, prefix, "--key-retention", "2s")
    server = start_distributed(tmp_path, services, prefix=prefix)
    try:
        tools = httpx.get(f"{server.base_url}/v1/tools", headers=ACME.headers, timeout=30)
        assert tools.status_code == 200, tools.text
        listed = tools.json()
        assert (listed["key_retention"], listed["key_retention_seconds"]) == ("PT2S", 2)
        ticket = next(t for t in listed["items"] if t["name"] == "create_ticket")
        assert ticket["key_retention"] == "PT2S"
        headers = {**ACME.headers, "Idempotency-Key": "kept-2s", "Prefer": "wait=30"}
        body = {"arguments": {"title": "kept two seconds"}}
        url = f"{server.base_url}/v1/tools/create_ticket/calls"
        first = httpx.post(url, headers=headers, json=body, timeout=60)
        assert first.status_code in (200, 201), first.text
        replay = httpx.post(url, headers=headers, json=body, timeout=60)
        assert replay.headers.get("Idempotent-Replayed") == "true", replay.text
        assert server.effects(ACME.tenant, "create_ticket", "kept-2s") == 1
        deadline = time.monotonic() + 60
        while server.effects(ACME.tenant, "create_ticket", "kept-2s") < 2:
            assert time.monotonic() < deadline, server.logs()
            time.sleep(1.0)
            again = httpx.post(url, headers=headers, json=body, timeout=60)
            assert again.status_code in (200, 201), again.text
        assert json.loads(again.text)["result"] != json.loads(first.text)["result"]
    finally:
        server.stop()
