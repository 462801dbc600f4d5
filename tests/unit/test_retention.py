"""Key retention settings: what a duration may be, how it is shown, and that a tool's manifest
or the command line cannot set one that is not a duration."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from pydantic import BaseModel

from toolledger.config import ConfigError
from toolledger.processors.tools.manifest import Tool, ToolContext, ToolDescription
from toolledger.processors.tools.registry import ToolRegistrationError, ToolRegistry
from toolledger.processors.tools.retention import (
    DEFAULT_KEY_RETENTION,
    FOREVER,
    RetentionError,
    describe,
    parse_retention,
    seconds_of,
)
from toolledger.settings import LedgerSettings


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90s", 90), ("30m", 1800), ("24h", 86400), ("7d", 604800), ("3600", 3600),
     ("PT24H", 86400), ("P7D", 604800), ("PT1M30S", 90), ("pt2m", 120), (" 2m ", 120)],
)  # fmt: skip
def test_durations(text: str, seconds: int) -> None:
    assert seconds_of(parse_retention(text)) == seconds


def test_forever_is_said_explicitly() -> None:
    assert parse_retention("forever") == FOREVER and seconds_of(FOREVER) is None
    assert describe(FOREVER) == "forever"


@pytest.mark.parametrize("text", ["", "soon", "0", "0s", "-5m", "1.5h", "P", "PT", "24 hours"])
def test_what_is_not_a_retention(text: str) -> None:
    with pytest.raises(RetentionError, match=r"duration|seconds"):
        parse_retention(text)


@pytest.mark.parametrize(
    ("retention", "shown"),
    [(DEFAULT_KEY_RETENTION, "PT24H"), (timedelta(days=7), "PT168H"),
     (timedelta(seconds=90), "PT1M30S"), (timedelta(seconds=1), "PT1S")],
)  # fmt: skip
def test_shown_as_an_exact_iso_duration(retention: timedelta, shown: str) -> None:
    assert describe(retention) == shown
    assert seconds_of(parse_retention(shown)) == int(retention.total_seconds())


class Args(BaseModel):
    n: int


async def _handler(args: Args, ctx: ToolContext) -> Args:
    return args


def _tool(retention: Any) -> Tool:
    return Tool(
        name="t", version="1", arguments=Args, result=Args, handler=_handler,
        description=ToolDescription("t", "tests", "never", "none", "replayed"),
        key_retention=retention,
    )  # fmt: skip


@pytest.mark.parametrize(
    "bad", ["soon", "24 hours", "0s", 3600, timedelta(0), timedelta(milliseconds=1500)]
)
def test_a_manifest_retention_that_is_no_duration_is_refused_at_registration(bad: Any) -> None:
    with pytest.raises(ToolRegistrationError, match=r"key_retention|key retention"):
        ToolRegistry().register(_tool(bad))


def test_the_manifest_states_the_retention_in_force() -> None:
    registry = ToolRegistry()
    default = registry.register(_tool(None))
    assert registry.manifest(default)["key_retention"] == "PT24H"
    assert registry.policy(default).key_retention_s == 86_400
    registry.set_default_key_retention(FOREVER)
    assert registry.manifest(default)["key_retention"] == "forever"
    assert registry.policy(default).key_retention_s is None
    own = ToolRegistry()
    tool = own.register(_tool(timedelta(minutes=2)))
    assert own.manifest(tool)["key_retention_seconds"] == 120


@pytest.mark.parametrize(
    ("given", "seconds", "shown"),
    [("24h", 86_400, "PT24H"), ("PT2H", 7_200, "PT2H"), ("90s", 90, "PT1M30S"),
     ("forever", None, "forever")],
)  # fmt: skip
def test_a_manifest_retention_may_be_a_duration_text(
    given: str, seconds: int | None, shown: str
) -> None:
    registry = ToolRegistry()
    tool = registry.register(_tool(given))
    assert registry.policy(tool).key_retention_s == seconds
    assert registry.manifest(tool)["key_retention"] == shown
    assert registry.manifest(tool)["key_retention_seconds"] == seconds


def test_the_command_line_option_refuses_what_is_no_duration() -> None:
    with pytest.raises(ConfigError, match="not a duration"):
        LedgerSettings.of(key_retention="a day")


@pytest.mark.parametrize("command", [["executor", "--demo"], ["topics"]], ids=lambda c: c[0])
def test_kafka_commands_read_the_intents_retention_as_a_duration(
    command: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner

    from toolledger.cli import app

    monkeypatch.setenv("TOOLLEDGER_REDACTION_SECRET", "00112233445566778899aabbccddeeff")
    for bad, why in (("soon", "not a duration"), ("forever", "time retention")):
        answer = CliRunner().invoke(app, [*command, "--intents-retention", bad])
        assert answer.exit_code == 2, answer.output
        assert why in answer.output
