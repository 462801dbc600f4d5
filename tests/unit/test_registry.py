"""The tool registry refuses, at registration, a tool that is not ready to run unattended."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict, Field, create_model

from toolledger.processors.ledger import NotHappened, ReconcileOutcome
from toolledger.processors.tools.manifest import (
    EffectClass,
    JobRef,
    JobRunning,
    PollAnswer,
    RetryPolicy,
    RiskTier,
    Tool,
    ToolContext,
    ToolDescription,
    always,
    never,
)
from toolledger.processors.tools.registry import (
    TRUSTED_CONTEXT_FIELDS,
    ToolRegistrationError,
    ToolRegistry,
)
from toolledger.processors.toolsets.helpdesk import HelpdeskStore, helpdesk_registry


class Args(BaseModel):
    model_config = ConfigDict(extra="forbid")
    target: str
    amount: int = 1


class Result(BaseModel):
    ok: bool


async def handler(args: Any, ctx: ToolContext) -> BaseModel:
    return Result(ok=True)


async def reconcile(ctx: ToolContext) -> ReconcileOutcome:
    return NotHappened()


async def poll(job: JobRef, ctx: ToolContext) -> PollAnswer:
    return JobRunning()


DESCRIPTION = ToolDescription(
    summary="Do a thing.",
    when_to_use="When the thing must be done.",
    when_not_to_use="When it is done.",
    preconditions="None.",
    replay_behaviour="Same key and arguments return the stored outcome.",
)


def make_tool(
    name: str = "do_thing",
    *,
    effect: EffectClass = EffectClass.MUTATION,
    risk: RiskTier = RiskTier.LOW,
    with_reconcile: bool = False,
    arguments: type[BaseModel] = Args,
    **changes: Any,
) -> Tool:
    tool = Tool(
        name=name,
        version="1",
        arguments=arguments,
        result=Result,
        handler=handler,
        description=DESCRIPTION,
        effect=effect,
        risk=risk,
        reconcile=reconcile if with_reconcile else None,
        poll=poll if effect is EffectClass.LONG_RUNNING else None,
    )
    return replace(tool, **changes) if changes else tool


# ------------------------------------------------------------------------------ reconcile hooks


@pytest.mark.parametrize("effect", [EffectClass.MUTATION, EffectClass.LONG_RUNNING])
@pytest.mark.parametrize("risk", [RiskTier.HIGH, RiskTier.IRREVERSIBLE])
def test_high_risk_mutation_without_reconcile_is_refused(
    effect: EffectClass, risk: RiskTier
) -> None:
    registry = ToolRegistry()
    with pytest.raises(ToolRegistrationError) as info:
        registry.register(make_tool(effect=effect, risk=risk))
    message = str(info.value)
    assert "reconcile" in message
    assert "do_thing" in message and risk.value in message
    assert registry.get("do_thing") is None and len(registry) == 0


@pytest.mark.parametrize("effect", [EffectClass.MUTATION, EffectClass.LONG_RUNNING])
@pytest.mark.parametrize("risk", [RiskTier.HIGH, RiskTier.IRREVERSIBLE])
def test_high_risk_mutation_with_reconcile_is_accepted(effect: EffectClass, risk: RiskTier) -> None:
    registry = ToolRegistry()
    tool = registry.register(make_tool(effect=effect, risk=risk, with_reconcile=True))
    assert registry.get("do_thing") is tool
    assert tool.policy.has_reconcile


@pytest.mark.parametrize("risk", list(RiskTier))
def test_read_only_tools_need_no_reconcile_whatever_the_risk(risk: RiskTier) -> None:
    registry = ToolRegistry()
    tool = registry.register(make_tool(effect=EffectClass.READ_ONLY, risk=risk))
    assert registry.get("do_thing") is tool
    assert not tool.keyed


def test_low_risk_mutation_may_omit_reconcile() -> None:
    tool = ToolRegistry().register(make_tool(risk=RiskTier.LOW))
    assert tool.keyed and not tool.policy.has_reconcile


# ------------------------------------------------------------------------------ trusted context


@pytest.mark.parametrize("field_name", sorted(TRUSTED_CONTEXT_FIELDS))
def test_trusted_context_fields_in_arguments_are_refused(field_name: str) -> None:
    fields: dict[str, Any] = {field_name: (str, ...)}
    smuggling = create_model(f"Smuggling_{field_name}", __base__=Args, **fields)
    registry = ToolRegistry()
    with pytest.raises(ToolRegistrationError) as info:
        registry.register(make_tool(arguments=smuggling))
    assert field_name in str(info.value)
    assert len(registry) == 0


def test_the_trusted_set_covers_tenant_and_user() -> None:
    assert {"tenant_id", "user_id", "principal", "scopes"} <= TRUSTED_CONTEXT_FIELDS


class AliasedTenant(BaseModel):
    """The model reads ``tenant_id`` from the arguments, under another attribute name."""

    model_config = ConfigDict(extra="forbid")
    target: str
    org: str = Field(alias="tenant_id", default="")


def test_trusted_context_fields_under_an_alias_are_refused() -> None:
    # the model accepts {"tenant_id": ...} from the caller: it is the field a model would set
    assert "tenant_id" in AliasedTenant.model_json_schema()["properties"]
    assert AliasedTenant.model_validate({"target": "x", "tenant_id": "other"}).org == "other"
    with pytest.raises(ToolRegistrationError, match="tenant_id"):
        ToolRegistry().register(make_tool(arguments=AliasedTenant))


# ------------------------------------------------------------------------------ names


@pytest.mark.parametrize(
    "name",
    [
        "",
        "Create",
        "create-ticket",
        "1tool",
        "_tool",
        "tool name",
        "tööl",
        "a" * 65,
        "tool.x",
        "tool\n",
        "tool\x00",
    ],
    ids=[
        "empty",
        "capital",
        "dash",
        "digit-first",
        "underscore-first",
        "space",
        "non-ascii",
        "65-chars",
        "dot",
        "trailing-newline",
        "nul",
    ],
)
def test_bad_names_are_refused(name: str) -> None:
    registry = ToolRegistry()
    with pytest.raises(ToolRegistrationError, match="name"):
        registry.register(make_tool(name))
    assert len(registry) == 0


@pytest.mark.parametrize("name", ["a", "create_ticket", "tool_2", "a" * 64])
def test_good_names_are_accepted(name: str) -> None:
    assert ToolRegistry().register(make_tool(name)).name == name


def test_duplicate_names_are_refused_and_the_first_tool_stays() -> None:
    registry = ToolRegistry()
    first = registry.register(make_tool("do_thing"))
    with pytest.raises(ToolRegistrationError, match="already registered"):
        registry.register(make_tool("do_thing", risk=RiskTier.HIGH, with_reconcile=True))
    assert registry.get("do_thing") is first and len(registry) == 1


# ------------------------------------------------------------------------------ other checks


@pytest.mark.parametrize(
    ("changes", "needle"),
    [
        ({"timeout_s": 0.0}, "timeout_s"),
        ({"timeout_s": -1.0}, "timeout_s"),
        ({"retry": RetryPolicy(max_attempts=0)}, "max_attempts"),
        ({"retry": RetryPolicy(max_rounds=0)}, "max_rounds"),
        ({"description": replace(DESCRIPTION, when_to_use="  ")}, "description"),
        ({"description": replace(DESCRIPTION, replay_behaviour="")}, "description"),
        ({"redact_fields": frozenset({"password"})}, "redact_fields"),
    ],
    ids=[
        "zero-timeout",
        "negative-timeout",
        "no-attempts",
        "no-rounds",
        "no-when-to-use",
        "no-replay-behaviour",
        "unknown-redact-field",
    ],
)
def test_other_readiness_checks(changes: dict[str, Any], needle: str) -> None:
    with pytest.raises(ToolRegistrationError, match=needle):
        ToolRegistry().register(make_tool(**changes))


def test_all_problems_are_reported_at_once() -> None:
    with pytest.raises(ToolRegistrationError) as info:
        ToolRegistry().register(make_tool("Bad", risk=RiskTier.HIGH, timeout_s=0.0))
    message = str(info.value)
    assert "name" in message and "reconcile" in message and "timeout_s" in message


def test_registry_iterates_in_name_order() -> None:
    registry = ToolRegistry()
    for name in ("zeta", "alpha", "mid"):
        registry.register(make_tool(name))
    assert [t.name for t in registry] == ["alpha", "mid", "zeta"]


# ------------------------------------------------------------------------------ helpdesk

HELPDESK: dict[str, tuple[EffectClass, RiskTier, bool]] = {
    "create_ticket": (EffectClass.MUTATION, RiskTier.LOW, True),
    "list_tickets": (EffectClass.READ_ONLY, RiskTier.LOW, False),
    "close_ticket": (EffectClass.MUTATION, RiskTier.LOW, True),
    "send_email": (EffectClass.MUTATION, RiskTier.HIGH, True),
    "charge_card": (EffectClass.MUTATION, RiskTier.IRREVERSIBLE, True),
    "flaky_write": (EffectClass.MUTATION, RiskTier.LOW, True),
    "export_tickets": (EffectClass.LONG_RUNNING, RiskTier.LOW, True),
}


@pytest.fixture
def helpdesk(tmp_path: Path) -> Iterator[ToolRegistry]:
    store = HelpdeskStore(tmp_path / "helpdesk.sqlite")
    try:
        yield helpdesk_registry(store)
    finally:
        store.close()


def test_helpdesk_registers_all_seven_tools(helpdesk: ToolRegistry) -> None:
    assert len(helpdesk) == 7
    assert [t.name for t in helpdesk] == sorted(HELPDESK)


@pytest.mark.parametrize("name", sorted(HELPDESK))
def test_helpdesk_tool_classes(helpdesk: ToolRegistry, name: str) -> None:
    effect, risk, has_reconcile = HELPDESK[name]
    tool = helpdesk.get(name)
    assert tool is not None
    assert (tool.effect, tool.risk, tool.reconcile is not None) == (effect, risk, has_reconcile)
    assert tool.keyed is (effect is not EffectClass.READ_ONLY)
    assert tool.policy.has_reconcile is has_reconcile
    assert not (TRUSTED_CONTEXT_FIELDS & set(tool.arguments.model_fields))


def test_helpdesk_redacts_sensitive_fields(helpdesk: ToolRegistry) -> None:
    send_email, charge_card = helpdesk.get("send_email"), helpdesk.get("charge_card")
    assert send_email is not None and charge_card is not None
    assert send_email.redact_fields == {"to", "body"}
    assert charge_card.redact_fields == {"customer_id"}


@pytest.mark.parametrize("name", sorted(HELPDESK))
def test_helpdesk_manifest_is_json_with_argument_schemas(helpdesk: ToolRegistry, name: str) -> None:
    tool = helpdesk.get(name)
    assert tool is not None
    manifest = tool.manifest()
    text = json.dumps(manifest, allow_nan=False)
    assert json.loads(text) == manifest
    effect, risk, has_reconcile = HELPDESK[name]
    assert manifest["name"] == name
    assert (manifest["effect"], manifest["risk"], manifest["reconcile"]) == (
        effect.value,
        risk.value,
        has_reconcile,
    )
    assert manifest["idempotency_key_required"] is (effect is not EffectClass.READ_ONLY)
    for schema_key in ("arguments_schema", "result_schema"):
        schema = manifest[schema_key]
        assert schema["type"] == "object"
        assert isinstance(schema.get("properties", {}), dict)
    assert "Replay:" in manifest["description"]


def test_helpdesk_argument_schemas_carry_constraints(helpdesk: ToolRegistry) -> None:
    charge_card, create_ticket = helpdesk.get("charge_card"), helpdesk.get("create_ticket")
    assert charge_card is not None and create_ticket is not None
    charge = charge_card.manifest()["arguments_schema"]
    assert set(charge["required"]) == {"customer_id", "amount_cents", "currency"}
    assert charge["properties"]["amount_cents"]["minimum"] == 1
    assert set(charge["properties"]["currency"]["enum"]) == {"CNY", "USD", "EUR"}
    assert charge["additionalProperties"] is False
    ticket = create_ticket.manifest()["arguments_schema"]
    assert ticket["properties"]["title"]["minLength"] == 1
    assert ticket["required"] == ["title"]


def test_all_manifests_serialise_together(helpdesk: ToolRegistry) -> None:
    listing = json.dumps([t.manifest() for t in helpdesk])
    assert [m["name"] for m in json.loads(listing)] == sorted(HELPDESK)


# ------------------------------------------------------------------------------ approval rules


@pytest.mark.parametrize(
    ("effect", "risk", "rule", "amount", "needed", "shown"),
    [
        (EffectClass.MUTATION, RiskTier.LOW, None, 1, False, "none"),
        (EffectClass.MUTATION, RiskTier.HIGH, None, 1, True, "operator"),
        (EffectClass.LONG_RUNNING, RiskTier.IRREVERSIBLE, None, 1, True, "operator"),
        (EffectClass.READ_ONLY, RiskTier.HIGH, None, 1, False, "none"),
        (EffectClass.READ_ONLY, RiskTier.LOW, always, 1, False, "none"),
        (EffectClass.MUTATION, RiskTier.HIGH, never, 1, False, "none"),
        (EffectClass.MUTATION, RiskTier.LOW, always, 1, True, "operator"),
        (EffectClass.MUTATION, RiskTier.LOW, "user", 1, True, "user"),
        (EffectClass.MUTATION, RiskTier.HIGH, "operator", 1, True, "operator"),
        # a policy with a limit: auto-approved up to 100, a human above
        (EffectClass.MUTATION, RiskTier.LOW, lambda a: a.amount > 100, 100, False, "by arguments"),
        (EffectClass.MUTATION, RiskTier.LOW, lambda a: a.amount > 100, 101, True, "by arguments"),
    ],
)
def test_approval_rules(
    effect: EffectClass, risk: RiskTier, rule: Any, amount: int, needed: bool, shown: str
) -> None:
    tool = make_tool(effect=effect, risk=risk, with_reconcile=True, approval=rule)
    assert tool.needs_approval(Args(target="x", amount=amount)) is needed
    assert tool.manifest()["approval"] == shown


def test_the_default_impact_says_what_runs_and_whether_it_can_be_undone() -> None:
    impact = make_tool(risk=RiskTier.IRREVERSIBLE, with_reconcile=True).impact(Args(target="x"))
    assert impact.irreversible is True and "do_thing" in impact.summary
    assert set(impact.to_json()) == {
        "summary",
        "target",
        "scope",
        "cost",
        "irreversible",
        "approver_kind",
    }


def by_amount(args: Args) -> str | None:
    """The user below 100, an operator from 1,000, nobody in between (a rule's three answers)."""
    if args.amount < 100:
        return "user"
    return "operator" if args.amount >= 1000 else None


@pytest.mark.parametrize(("amount", "kind"), [(5, "user"), (500, None), (1000, "operator")])
def test_a_rule_chooses_who_approves_by_the_arguments(amount: int, kind: str | None) -> None:
    tool = make_tool(with_reconcile=True, approval=by_amount)
    assert tool.approver_for(Args(target="x", amount=amount)) == kind
    assert tool.manifest()["approval"] == "by arguments"
    if kind is not None:  # the approver is told who decides, from the rule, in the impact
        assert tool.impact(Args(target="x", amount=amount)).approver_kind == kind


def test_an_approval_that_is_neither_a_kind_nor_a_rule_is_refused_at_registration() -> None:
    with pytest.raises(ToolRegistrationError, match="approval must be one of"):
        ToolRegistry().register(make_tool(with_reconcile=True, approval="manager"))


def test_a_rule_answering_something_else_raises_so_the_pipeline_asks_an_operator() -> None:
    tool = make_tool(with_reconcile=True, approval=lambda a: "boss")
    with pytest.raises(ValueError, match="approval rule answered 'boss'"):
        tool.approver_for(Args(target="x"))


def test_a_long_running_tool_without_poll_is_refused() -> None:
    registry = ToolRegistry()
    with pytest.raises(ToolRegistrationError, match="poll"):
        registry.register(make_tool(effect=EffectClass.LONG_RUNNING, poll=None))
    assert len(registry) == 0


def test_poll_and_cancel_are_for_long_running_tools_only() -> None:
    with pytest.raises(ToolRegistrationError, match="long_running tools only"):
        ToolRegistry().register(make_tool(poll=poll))
