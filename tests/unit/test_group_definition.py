"""Parsing and validating call groups: each bad input with the field error it gets, the
definition digest, reference resolution and the derived keys (processors/groups/definition)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

import pytest
from pydantic import BaseModel, ConfigDict, Field, model_validator

from toolledger.processors.groups import (
    Compensation,
    GroupDefinition,
    InvalidGroup,
    OnFailure,
    ReferenceFailure,
    Resolved,
    Step,
    StepTool,
    ToolFacts,
    call_intent_id,
    compensation_key,
    missing_scopes,
    parse_group,
    resolve_arguments,
    step_key,
)
from toolledger.schemas.errors import ErrorCode
from toolledger.schemas.keys import check_idempotency_key
from toolledger.schemas.nesting import MAX_DEPTH

# ------------------------------------------------------------------ the tools of these tests

_STRICT = ConfigDict(strict=True, extra="forbid", frozen=True)


class TicketArgs(BaseModel):
    model_config = _STRICT
    title: Annotated[str, Field(min_length=1, max_length=200)]
    priority: Literal["low", "normal", "high"] = "normal"


class TicketRef(BaseModel):
    model_config = _STRICT
    ticket_id: Annotated[str, Field(min_length=1)]


class CommentArgs(BaseModel):
    model_config = _STRICT
    ticket_id: Annotated[str, Field(min_length=1)]
    text: Annotated[str, Field(min_length=1)]


class NotifyArgs(BaseModel):
    model_config = _STRICT
    to: Annotated[str, Field(min_length=1)]
    ticket_ids: list[str] = Field(default_factory=list)


class ChargeArgs(BaseModel):
    model_config = _STRICT
    ticket_id: Annotated[str, Field(min_length=1)]
    amount_cents: Annotated[int, Field(ge=1)]


class NoArgs(BaseModel):
    model_config = _STRICT


def _close(_arguments: Mapping[str, Any], result: Any) -> Mapping[str, Any]:
    return {"ticket_id": result["ticket_id"]}


def _delete_comment(_arguments: Mapping[str, Any], result: Any) -> Mapping[str, Any]:
    return {"comment_id": result["comment_id"]}


TOOLS: dict[str, StepTool] = {
    "create_ticket": ToolFacts.of_model(
        TicketArgs, compensation=Compensation("close_ticket", _close)
    ),
    "close_ticket": ToolFacts.of_model(TicketRef),
    "add_comment": ToolFacts.of_model(
        CommentArgs, compensation=Compensation("delete_comment", _delete_comment)
    ),
    "notify": ToolFacts.of_model(NotifyArgs),
    "charge_card": ToolFacts.of_model(ChargeArgs, irreversible=True),
    "list_tickets": ToolFacts.of_model(NoArgs, keyed=False),
}


def ref(step_id: str, path: str | None = None, **extra: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"$from": step_id, **extra}
    if path is not None:
        out["path"] = path
    return out


def step(
    step_id: str,
    tool: str = "notify",
    arguments: dict[str, Any] | None = None,
    depends_on: list[Any] | None = None,
) -> dict[str, Any]:
    out: dict[str, Any] = {"id": step_id, "tool": tool}
    out["arguments"] = {"to": "ops"} if arguments is None and tool == "notify" else arguments or {}
    if depends_on is not None:
        out["depends_on"] = depends_on
    return out


def body(*steps: dict[str, Any], on_failure: str | None = None, **extra: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"run_id": "run-1", "steps": list(steps), **extra}
    if on_failure is not None:
        out["on_failure"] = on_failure
    return out


def parsed(raw: object, tools: Mapping[str, StepTool] = TOOLS) -> GroupDefinition:
    result = parse_group(raw, tools)
    assert isinstance(result, GroupDefinition), result
    return result


def refused(
    raw: object, tools: Mapping[str, StepTool] = TOOLS, **options: Any
) -> list[tuple[str, str]]:
    result = parse_group(raw, tools, **options)
    assert isinstance(result, InvalidGroup), result
    return [(e.loc, e.type) for e in result.field_errors]


DIAMOND = body(
    step("a", "create_ticket", {"title": "Printer on fire"}),
    step("b", "add_comment", {"ticket_id": ref("a", "ticket_id"), "text": "on it"}),
    step("c", "add_comment", {"ticket_id": ref("a", "ticket_id"), "text": "ordered parts"}),
    step("d", "notify", {"to": "ops", "ticket_ids": [ref("a", "ticket_id")]}, ["b", "c"]),
)

# ---------------------------------------------------------------------------- a valid group


def test_a_diamond_parses_with_implied_dependencies_and_a_topological_order() -> None:
    d = parsed(DIAMOND)
    assert d.run_id == "run-1"
    assert d.on_failure is OnFailure.COMPENSATE  # the default
    assert d.order == ("a", "b", "c", "d")
    assert [s.depends_on for s in d.steps] == [(), ("a",), ("a",), ("a", "b", "c")]
    assert d.dependents("a") == ("b", "c", "d")
    assert d.dependents("b") == ("d",)
    assert d.dependents("d") == ()
    b = d.step("b")
    assert [(r.loc, r.step_id, r.path) for r in b.references] == [
        (("ticket_id",), "a", "ticket_id")
    ]
    assert d.step("d").references[0].loc == ("ticket_ids", "0")
    assert b.facts is TOOLS["add_comment"]


def test_the_order_puts_dependencies_first_whatever_the_listing_order() -> None:
    d = parsed(body(step("z", depends_on=["y"]), step("y", depends_on=["x"]), step("x")))
    assert d.order == ("x", "y", "z")
    assert d.step("z").index == 0


def test_stop_is_accepted() -> None:
    assert parsed(body(step("a"), on_failure="stop")).on_failure is OnFailure.STOP


def test_a_reference_without_a_path_takes_the_whole_result() -> None:
    d = parsed(body(step("a"), step("b", "notify", {"to": ref("a")})))
    assert d.step("b").references[0].path == ""
    assert d.step("b").arguments == {"to": {"$from": "a", "path": ""}}  # normalised


def test_the_digest_ignores_listing_order_key_order_defaults_and_explicit_duplicates() -> None:
    same = body(
        step("d", "notify", {"ticket_ids": [ref("a", "ticket_id")], "to": "ops"}, ["c", "b", "a"]),
        step("c", "add_comment", {"text": "ordered parts", "ticket_id": ref("a", "ticket_id")}),
        step("a", "create_ticket", {"title": "Printer on fire"}, []),
        step("b", "add_comment", {"ticket_id": ref("a", "ticket_id"), "text": "on it"}, ["a"]),
        on_failure="compensate",
    )
    assert parsed(same).digest == parsed(DIAMOND).digest
    assert parsed(DIAMOND).digest.startswith("sha256:")


@pytest.mark.parametrize(
    "other",
    [
        body(*DIAMOND["steps"], on_failure="stop"),
        {**DIAMOND, "run_id": "run-2"},
        body(step("a", "create_ticket", {"title": "Printer on fire!"}), *DIAMOND["steps"][1:]),
        body(*DIAMOND["steps"][:3], step("d", "notify", {"to": "ops"}, ["b", "c"])),
        body(*DIAMOND["steps"][:3], step("d", "notify", {"to": "ops"}, ["b"])),
        body(*DIAMOND["steps"][:3], step("e", "notify", {"to": "ops"}, ["b", "c"])),
    ],
    ids=["on-failure", "run-id", "arguments", "reference", "dependency", "step-id"],
)
def test_the_digest_changes_with_the_definition(other: dict[str, Any]) -> None:
    assert parsed(other).digest != parsed(DIAMOND).digest


def test_as_body_parses_back_to_an_equal_definition() -> None:
    d = parsed(DIAMOND)
    again = parsed(d.as_body())
    assert again == d
    assert again.digest == d.digest


def test_a_definition_built_by_hand_must_be_acyclic() -> None:
    facts = TOOLS["notify"]
    a = Step(0, "a", "notify", "{}", ("b",), facts)
    b = Step(1, "b", "notify", "{}", ("a",), facts)
    with pytest.raises(ValueError, match="cycle"):
        GroupDefinition("run-1", OnFailure.STOP, (a, b))
    with pytest.raises(ValueError, match="unknown step"):
        GroupDefinition("run-1", OnFailure.STOP, (Step(0, "a", "notify", "{}", ("x",), facts),))


# ------------------------------------------------------------------------ refused, by field

_101 = body(*[step(f"s{i}") for i in range(101)])

BAD: list[tuple[str, object, list[tuple[str, str]]]] = [
    # the semantic checks of the issue
    (
        "unknown-tool",
        body(step("a"), step("b"), step("c", "launch_rocket")),
        [("steps.2.tool", "unknown_tool")],
    ),
    (
        "duplicate-id",
        body(step("a"), step("b"), step("c"), step("a")),
        [("steps.3.id", "duplicate_step_id")],
    ),
    (
        "self-dependency",
        body(step("a", depends_on=["a"])),
        [("steps.0.depends_on.0", "dependency_cycle")],
    ),
    (
        "self-reference",
        body(step("a", "create_ticket", {"title": ref("a", "title")})),
        [("steps.0.arguments.title.$from", "dependency_cycle")],
    ),
    (
        "two-step-cycle",
        body(step("a", depends_on=["b"]), step("b", depends_on=["a"])),
        [
            ("steps.0.depends_on.0", "dependency_cycle"),
            ("steps.1.depends_on.0", "dependency_cycle"),
        ],
    ),
    (
        "cycle-through-a-reference",
        body(
            step("a", "notify", {"to": ref("c", "x")}),
            step("b", depends_on=["a"]),
            step("c", depends_on=["b"]),
            step("d", depends_on=["c"]),
        ),
        [
            ("steps.0.arguments.to.$from", "dependency_cycle"),
            ("steps.1.depends_on.0", "dependency_cycle"),
            ("steps.2.depends_on.0", "dependency_cycle"),
        ],
    ),
    (
        "unknown-step-in-depends-on",
        body(step("a"), step("b", depends_on=["a", "zz"])),
        [("steps.1.depends_on.1", "unknown_step")],
    ),
    (
        "unknown-step-in-from",
        body(step("a"), step("b", "close_ticket", {"ticket_id": ref("zz", "ticket_id")})),
        [("steps.1.arguments.ticket_id.$from", "unknown_step")],
    ),
    ("too-many-steps", _101, [("steps", "too_many_steps")]),
    (
        "literal-argument-too-short",
        body(step("a"), step("b", "create_ticket", {"title": ""})),
        [("steps.1.arguments.title", "string_too_short")],
    ),
    (
        "literal-argument-missing",
        body(step("a", "create_ticket", {})),
        [("steps.0.arguments.title", "missing")],
    ),
    (
        "literal-argument-extra",
        body(step("a", "create_ticket", {"title": "x", "colour": "red"})),
        [("steps.0.arguments.colour", "extra_forbidden")],
    ),
    (
        "literal-argument-in-a-list",
        body(step("a", "notify", {"to": "ops", "ticket_ids": [7]})),
        [("steps.0.arguments.ticket_ids.0", "string_type")],
    ),
    (
        "literal-argument-next-to-a-reference",
        body(
            step("a", "create_ticket", {"title": "x"}),
            step("b", "add_comment", {"ticket_id": ref("a", "ticket_id"), "text": ""}),
        ),
        [("steps.1.arguments.text", "string_too_short")],
    ),
    (
        "literal-list-item-next-to-a-reference",
        body(step("a"), step("b", "notify", {"to": "ops", "ticket_ids": [ref("a", "id"), 5]})),
        [("steps.1.arguments.ticket_ids.1", "string_type")],
    ),
    (
        "extra-field-holding-a-reference",
        body(step("a"), step("b", "notify", {"to": "ops", "nested": {"deep": ref("a", "x")}})),
        [("steps.1.arguments.nested", "extra_forbidden")],
    ),
    # malformed references
    (
        "reference-with-an-extra-key",
        body(step("a"), step("b", "close_ticket", {"ticket_id": ref("a", "id", default="T")})),
        [("steps.1.arguments.ticket_id.default", "reference_invalid")],
    ),
    (
        "reference-to-an-empty-step-id",
        body(step("b", "close_ticket", {"ticket_id": ref("")})),
        [("steps.0.arguments.ticket_id.$from", "reference_invalid")],
    ),
    (
        "reference-to-a-non-string",
        body(step("b", "close_ticket", {"ticket_id": {"$from": 3}})),
        [("steps.0.arguments.ticket_id.$from", "reference_invalid")],
    ),
    (
        "reference-with-an-empty-path-segment",
        body(step("a"), step("b", "close_ticket", {"ticket_id": ref("a", "items..id")})),
        [("steps.1.arguments.ticket_id.path", "path_invalid")],
    ),
    (
        "reference-with-a-non-string-path",
        body(step("a"), step("b", "close_ticket", {"ticket_id": {"$from": "a", "path": 0}})),
        [("steps.1.arguments.ticket_id.path", "path_invalid")],
    ),
    # the body's shape
    ("body-not-an-object", [], [("$", "model_type")]),
    ("missing-run-id", {"steps": [step("a")]}, [("run_id", "missing")]),
    ("empty-run-id", body(step("a"), run_id=""), [("run_id", "string_too_short")]),
    ("no-steps", body(), [("steps", "too_short")]),
    ("unknown-field", body(step("a"), priority="high"), [("priority", "extra_forbidden")]),
    ("bad-on-failure", body(step("a"), on_failure="retry"), [("on_failure", "literal_error")]),
    (
        "step-without-id",
        body({"tool": "notify", "arguments": {"to": "x"}}),
        [("steps.0.id", "missing")],
    ),
    ("step-id-with-a-colon", body(step("a:b")), [("steps.0.id", "string_pattern_mismatch")]),
    (
        "step-with-an-unknown-field",
        body({**step("a"), "retries": 3}),
        [("steps.0.retries", "extra_forbidden")],
    ),
    (
        "depends-on-not-a-list",
        body(step("a"), step("b", depends_on="a")),  # type: ignore[arg-type]
        [("steps.1.depends_on", "list_type")],
    ),
    (
        "arguments-not-an-object",
        body({"id": "a", "tool": "notify", "arguments": [1]}),
        [("steps.0.arguments", "dict_type")],
    ),
    # several at once: every one is reported
    (
        "several-problems",
        body(
            step("a", "create_ticket", {"title": ""}),
            step("a"),
            step("c", "nope"),
            step("d", depends_on=["zz"]),
        ),
        [
            ("steps.0.arguments.title", "string_too_short"),
            ("steps.1.id", "duplicate_step_id"),
            ("steps.2.tool", "unknown_tool"),
            ("steps.3.depends_on.0", "unknown_step"),
        ],
    ),
]


@pytest.mark.parametrize(
    ("raw", "expected"), [(r, e) for _, r, e in BAD], ids=[name for name, _, _ in BAD]
)
def test_a_bad_group_is_refused_with_its_field_errors(
    raw: object, expected: list[tuple[str, str]]
) -> None:
    assert refused(raw) == expected


def test_a_refusal_is_a_validation_error_with_messages() -> None:
    result = parse_group(body(step("a", depends_on=["a"])), TOOLS)
    assert isinstance(result, InvalidGroup)
    assert result.error.code == ErrorCode.VALIDATION_FAILED.value
    assert result.error.retryable is False
    assert result.field_errors[0].msg == "A step cannot depend on itself."
    cycle = parse_group(body(step("a", depends_on=["b"]), step("b", depends_on=["a"])), TOOLS)
    assert isinstance(cycle, InvalidGroup)
    assert "'a', 'b'" in cycle.field_errors[0].msg


def test_the_step_limit_is_configurable() -> None:
    three = body(step("a"), step("b"), step("c"))
    assert refused(three, max_steps=2) == [("steps", "too_many_steps")]
    assert isinstance(parse_group(three, TOOLS, max_steps=3), GroupDefinition)
    assert isinstance(parse_group(body(*_101["steps"][:100]), TOOLS), GroupDefinition)


@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 100_000])
def test_step_arguments_nested_past_the_limit_are_a_field_error_at_any_depth(depth: int) -> None:
    deep: Any = "x"
    for _ in range(depth - 1):  # the arguments object is the last level
        deep = [deep]
    result = parse_group(body(step("a"), step("b", "notify", {"to": deep})), TOOLS)
    assert isinstance(result, InvalidGroup)
    assert [(e.loc, e.type) for e in result.field_errors] == [("steps.1.arguments", "too_deep")]
    assert "the limit is 64 levels" in result.field_errors[0].msg


def test_step_arguments_at_the_limit_reach_the_tool_validation() -> None:
    deep: Any = "x"
    for _ in range(MAX_DEPTH - 1):
        deep = [deep]
    assert refused(body(step("a", "notify", {"to": deep}))) == [
        ("steps.0.arguments.to", "string_type")
    ]


def test_the_scopes_a_groups_steps_need_are_listed_per_step() -> None:
    scoped = {
        **TOOLS,
        "notify": ToolFacts.of_model(NotifyArgs, scopes=frozenset({"tools:call"})),
        "charge_card": ToolFacts.of_model(
            ChargeArgs, irreversible=True, scopes=frozenset({"tools:call", "payments"})
        ),
    }
    group = parsed(
        body(
            step("a", "notify"),
            step("b", "charge_card", {"ticket_id": "T-1", "amount_cents": 5}),
            step("c", "create_ticket", {"title": "no scope needed"}),
        ),
        scoped,
    )
    assert missing_scopes(group, {"tools:call", "payments"}) == ()
    assert [(e.loc, e.type) for e in missing_scopes(group, {"tools:call"})] == [
        ("steps.1.tool", "forbidden")
    ]
    only_reports = missing_scopes(group, {"jobs:report"})
    assert [e.loc for e in only_reports] == ["steps.0.tool", "steps.1.tool"]
    assert "['payments', 'tools:call']" in only_reports[1].msg


def test_fields_holding_references_are_left_to_run_time() -> None:
    # a reference where a string is expected, inside a list, and in place of a whole object
    d = parsed(
        body(
            step("a", "create_ticket", {"title": "x"}),
            step("b", "close_ticket", {"ticket_id": ref("a", "ticket_id")}),
            step("c", "notify", {"to": ref("a", "owner"), "ticket_ids": [ref("a", "ticket_id")]}),
            step("d", "notify", {"to": "ops", "ticket_ids": ref("a", "all_ids")}),
        )
    )
    assert d.step("c").depends_on == ("a",)


def test_an_unknown_tool_skips_argument_validation_but_not_references() -> None:
    assert refused(body(step("a", "nope", {"x": ref("zz")}))) == [
        ("steps.0.arguments.x.$from", "unknown_step"),
        ("steps.0.tool", "unknown_tool"),
    ]


# --------------------------------------------------------------------- references at run time

RESULT = {"ticket_id": "T-1", "items": [{"id": "i0"}, {"id": "i1", "tags": ["x"]}], "n": 3}


def _with_ref(path: str | None) -> Step:
    # "nested" is not a field of notify: refused in a group, but fine to resolve
    d = parsed(body(step("a"), step("b", "notify", {"to": "ops", "ticket_ids": [ref("a", path)]})))
    raw = d.as_body()
    raw["steps"][1]["arguments"]["nested"] = {"deep": ref("a", path)}
    lenient = {**TOOLS, "notify": ToolFacts()}
    return parsed(raw, lenient).step("b")


@pytest.mark.parametrize(
    ("path", "value"),
    [
        ("ticket_id", "T-1"),
        ("items.1.id", "i1"),
        ("items.1.tags.0", "x"),
        ("n", 3),
        (None, RESULT),
        ("", RESULT),
        ("items.0", {"id": "i0"}),
    ],
)
def test_references_resolve_to_the_value_at_their_path(path: str | None, value: Any) -> None:
    resolved = resolve_arguments(_with_ref(path), {"a": RESULT})
    assert resolved == Resolved({"to": "ops", "ticket_ids": [value], "nested": {"deep": value}})


@pytest.mark.parametrize(
    ("path", "reason"),
    [
        ("ticket", "there is no key 'ticket' at the top"),
        ("items.2.id", "index 2 is out of range (the list at items has 2 items)"),
        ("items.first", "'first' is not a list index (a list is at items)"),
        ("items.-1", "'-1' is not a list index (a list is at items)"),
        ("n.value", "the value at n is a number, not an object or a list"),
        ("ticket_id.0", "the value at ticket_id is a string, not an object or a list"),
        ("items.0.name", "there is no key 'name' at items.0"),
    ],
)
def test_a_path_missing_at_run_time_is_a_clear_error(path: str, reason: str) -> None:
    failure = resolve_arguments(_with_ref(path), {"a": RESULT})
    assert isinstance(failure, ReferenceFailure)
    assert failure.reason == reason
    # the first one in the canonical order of the arguments ("nested" < "ticket_ids")
    assert failure.reference.loc == ("nested", "deep")
    error = failure.error
    assert error.code == ErrorCode.VALIDATION_FAILED.value
    assert error.retryable is False
    assert error.message == (
        f"Step 'b' takes argument 'nested.deep' from path {path!r} of the result of step 'a', "
        f"and {reason}."
    )


def test_a_reference_to_a_step_without_a_result_fails() -> None:
    failure = resolve_arguments(_with_ref("ticket_id"), {})
    assert isinstance(failure, ReferenceFailure)
    assert failure.reason == "that step has no result"


def test_resolving_does_not_touch_the_definition() -> None:
    b = _with_ref("ticket_id")
    before = b.arguments_json
    resolved = resolve_arguments(b, {"a": RESULT})
    assert isinstance(resolved, Resolved)
    resolved.arguments["ticket_ids"].append("mutated")
    assert b.arguments_json == before


# ------------------------------------------------------------------------------------ keys


def test_step_and_compensation_keys_derive_from_the_group_key() -> None:
    assert step_key("grp-1", "a") == "step:grp-1:step:a"
    assert compensation_key("grp-1", "a") == "step:grp-1:compensate:a"
    assert step_key("grp-1", "a") == step_key("grp-1", "a")
    keys = {step_key(g, s) for g in ("grp-1", "grp-2") for s in ("a", "b")}
    keys |= {compensation_key(g, s) for g in ("grp-1", "grp-2") for s in ("a", "b")}
    assert len(keys) == 8


@pytest.mark.parametrize("group_key", ["grp-1", "tenant:grp:1", "x" * 255, "with space é"])
def test_derived_keys_are_valid_idempotency_keys(group_key: str) -> None:
    for key in (step_key(group_key, "s" * 64), compensation_key(group_key, "s" * 64)):
        assert check_idempotency_key(key) == key
    # a group key with ':' would be ambiguous in the readable form: it is hashed
    assert step_key("tenant:grp:1", "a").startswith("step-sha256:")


def test_intent_ids_differ_by_kind_step_and_round() -> None:
    ids = {
        call_intent_id("g", kind, s, r)
        for kind in ("step", "compensate")
        for s in ("a", "b")
        for r in (1, 2)
    }
    assert len(ids) == 8
    assert call_intent_id("g", "step", "a", 1) == call_intent_id("g", "step", "a", 1)
    assert all(check_idempotency_key(i) for i in ids)


class Window(BaseModel):
    model_config = _STRICT
    start: int
    end: int

    @model_validator(mode="after")
    def _ordered(self) -> Window:
        if self.start > self.end:
            raise ValueError("start must not be after end")
        return self


def test_a_custom_validator_over_a_reference_is_left_to_run_time() -> None:
    tools = {**TOOLS, "book": ToolFacts.of_model(Window)}
    assert refused(body(step("w", "book", {"start": 5, "end": 1})), tools=tools) == [
        ("steps.0.arguments", "value_error")
    ]
    # with a reference inside, the model-level check cannot be judged before run time
    ok = parse_group(body(step("a"), step("w", "book", {"start": ref("a", "n"), "end": 1})), tools)
    assert isinstance(ok, GroupDefinition)
