"""A call group's definition: parsing, validation, the digest, references and derived keys.

A group is submitted as::

    {"run_id": "...", "on_failure": "compensate" | "stop",
     "steps": [{"id": "a", "tool": "create_ticket", "arguments": {...}, "depends_on": []}, ...]}

An argument value ``{"$from": "a", "path": "ticket_id"}`` (anywhere in the arguments) is
replaced, when the step starts, by that path of step ``a``'s result, and makes the step depend
on ``a``. The path is dotted; a segment of digits indexes a list (``"items.0.id"``); a missing
or empty path takes the whole result. An object with a ``"$from"`` key is always a reference
(there is no escape for a literal object with that key).

:func:`parse_group` refuses, with field errors and before anything runs: a malformed body,
more than ``max_steps`` steps, arguments nested deeper than ``schemas.nesting.MAX_DEPTH``
levels, duplicate step ids, unknown tools, references (``depends_on`` or ``$from``) to
unknown steps, malformed references, dependency cycles (a self-dependency too), and literal
arguments that fail their tool's validation. Arguments holding references
are validated as submitted, references in place, and a field error that the referenced value
could change is dropped: one at a reference or inside it, or a custom validator's error
(``value_error``, ``assertion_error``) on an object that contains a reference. Every other
error (a missing or extra field, a wrong literal next to a reference) is reported. At run
time ``decide`` validates the resolved arguments in full before the step may start.

Pure: no I/O, no clock, no randomness.
"""

from __future__ import annotations

import hashlib
import heapq
import json
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from toolledger.processors.groups.facts import StepTool, field_errors
from toolledger.schemas.canonical import CanonicalJsonError, args_digest, canonical_json
from toolledger.schemas.errors import ErrorCode, ErrorInfo, FieldError
from toolledger.schemas.groups import STEP_ID_PATTERN, compensation_key, step_key
from toolledger.schemas.nesting import NestingTooDeep, check_depth

__all__ = [
    "DEFAULT_MAX_STEPS",
    "REF_KEY",
    "STEP_ID_PATTERN",
    "GroupDefinition",
    "InvalidGroup",
    "OnFailure",
    "Reference",
    "ReferenceFailure",
    "Resolved",
    "Step",
    "call_intent_id",
    "compensation_key",
    "missing_scopes",
    "parse_group",
    "resolve_arguments",
    "step_key",
]

DEFAULT_MAX_STEPS = 100
REF_KEY = "$from"
PATH_KEY = "path"
# letters, digits, "_" and "-": no ":" (key suffixes stay unambiguous) and no "." (locs)


class OnFailure(StrEnum):
    COMPENSATE = "compensate"
    STOP = "stop"


# -- keys ----------------------------------------------------------------------------------------


def call_intent_id(group_key: str, kind: str, step_id: str, round_: int) -> str:
    """A deterministic intent id for one round of a step's (``kind="step"``) or compensation's
    (``kind="compensate"``) call. Used as the ledger intent id, a runner that lost track after
    a crash can tell whether this round reached the ledger (the call state's latest intent)."""
    raw = json.dumps([group_key, kind, step_id, round_]).encode("utf-8")
    return "grp_" + hashlib.sha256(raw).hexdigest()[:32]


# -- the definition ------------------------------------------------------------------------------

Loc = tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Reference:
    """``{"$from": step_id, "path": path}`` at ``loc`` in a step's arguments."""

    loc: Loc
    step_id: str
    path: str  # dotted; "" is the whole result

    @property
    def segments(self) -> tuple[str, ...]:
        return tuple(self.path.split(".")) if self.path else ()


@dataclass(frozen=True, slots=True)
class Step:
    index: int  # its place in the submitted list
    id: str
    tool: str
    arguments_json: str  # canonical JSON, references in the form {"$from": ..., "path": ...}
    depends_on: tuple[str, ...]  # explicit and implied (by references), in listing order
    facts: StepTool = field(compare=False, repr=False)  # the tool's facts, not its data
    references: tuple[Reference, ...] = ()

    @property
    def arguments(self) -> dict[str, Any]:
        """A fresh copy of the arguments as submitted (references not resolved)."""
        value: dict[str, Any] = json.loads(self.arguments_json)
        return value


@dataclass(frozen=True, slots=True)
class GroupDefinition:
    """A validated group. ``order`` is a topological order (ties: listing order); ``digest``
    tells "the same definition" (whatever the listing order of steps, the order of keys, the
    defaults, or whether a dependency is explicit as well as implied) from "another one"."""

    run_id: str
    on_failure: OnFailure
    steps: tuple[Step, ...]
    order: tuple[str, ...] = field(init=False)
    digest: str = field(init=False)
    _index: dict[str, int] = field(init=False, repr=False, compare=False)
    _dependents: dict[str, tuple[str, ...]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        index = {s.id: i for i, s in enumerate(self.steps)}
        if len(index) != len(self.steps):
            raise ValueError("duplicate step ids")
        for s in self.steps:
            for dep in s.depends_on:
                if dep not in index:
                    raise ValueError(f"step {s.id!r} depends on unknown step {dep!r}")
        order = _topological_order(self.steps, index)
        if order is None:
            raise ValueError("the steps' dependencies have a cycle")
        object.__setattr__(self, "_index", index)
        object.__setattr__(self, "order", order)
        object.__setattr__(self, "_dependents", _transitive_dependents(self.steps, order))
        object.__setattr__(self, "digest", args_digest(self._digest_body()))

    def step(self, step_id: str) -> Step:
        return self.steps[self._index[step_id]]

    def dependents(self, step_id: str) -> tuple[str, ...]:
        """Every step that depends on ``step_id``, directly or not, in topological order."""
        return self._dependents[step_id]

    def as_body(self) -> dict[str, Any]:
        """A submission body that parses (with the same tools) to an equal definition."""
        return {
            "run_id": self.run_id,
            "on_failure": self.on_failure.value,
            "steps": [
                {
                    "id": s.id,
                    "tool": s.tool,
                    "arguments": s.arguments,
                    "depends_on": list(s.depends_on),
                }
                for s in self.steps
            ],
        }

    def _digest_body(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "on_failure": self.on_failure.value,
            "steps": [
                {
                    "id": s.id,
                    "tool": s.tool,
                    "arguments": s.arguments,
                    "depends_on": sorted(s.depends_on),
                }
                for s in sorted(self.steps, key=lambda s: s.id)
            ],
        }


def _topological_order(steps: Sequence[Step], index: Mapping[str, int]) -> tuple[str, ...] | None:
    """Kahn's algorithm, the lowest listing index first among the ready; None: a cycle."""
    waiting = [len(set(s.depends_on)) for s in steps]
    children: list[list[int]] = [[] for _ in steps]
    for position, s in enumerate(steps):
        for dep in set(s.depends_on):
            children[index[dep]].append(position)
    ready = [i for i, n in enumerate(waiting) if n == 0]
    heapq.heapify(ready)
    order: list[str] = []
    while ready:
        i = heapq.heappop(ready)
        order.append(steps[i].id)
        for child in children[i]:
            waiting[child] -= 1
            if waiting[child] == 0:
                heapq.heappush(ready, child)
    return tuple(order) if len(order) == len(steps) else None


def _transitive_dependents(
    steps: Sequence[Step], order: Sequence[str]
) -> dict[str, tuple[str, ...]]:
    direct: dict[str, set[str]] = {s.id: set() for s in steps}
    for s in steps:
        for dep in s.depends_on:
            direct[dep].add(s.id)
    below: dict[str, set[str]] = {}
    for step_id in reversed(order):  # every dependent comes later in the order
        found = set(direct[step_id])
        for child in direct[step_id]:
            found |= below[child]
        below[step_id] = found
    position = {step_id: i for i, step_id in enumerate(order)}
    return {k: tuple(sorted(v, key=position.__getitem__)) for k, v in below.items()}


# -- parsing and validation ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class InvalidGroup:
    """A refused submission: nothing runs and nothing is stored."""

    field_errors: tuple[FieldError, ...]

    @property
    def error(self) -> ErrorInfo:
        return ErrorInfo.of(
            ErrorCode.VALIDATION_FAILED,
            f"The group is invalid: {len(self.field_errors)} field error(s).",
            suggested_action="Fix the fields listed in the field errors and submit again.",
        )


class _StepBody(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")

    id: Annotated[str, Field(pattern=STEP_ID_PATTERN)]
    tool: Annotated[str, Field(min_length=1, max_length=200)]
    arguments: dict[str, Any] = Field(default_factory=dict)
    depends_on: list[str] = Field(default_factory=list)


class _GroupBody(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")

    run_id: Annotated[str, Field(min_length=1, max_length=255)]
    on_failure: Literal["compensate", "stop"] = "compensate"
    steps: Annotated[list[_StepBody], Field(min_length=1)]


def _fe(loc: str, msg: str, type_: str) -> FieldError:
    return FieldError(loc=loc, msg=msg, type=type_)


def parse_group(
    body: object, tools: Mapping[str, StepTool], *, max_steps: int = DEFAULT_MAX_STEPS
) -> GroupDefinition | InvalidGroup:
    """Validate a submission body against the tools; every problem is one field error."""
    if isinstance(body, Mapping) and isinstance(body.get("steps"), list):
        count = len(body["steps"])
        if count > max_steps:
            return InvalidGroup(
                (
                    _fe(
                        "steps",
                        f"A group has at most {max_steps} steps; this one has {count}.",
                        "too_many_steps",
                    ),
                )
            )
    try:
        parsed = _GroupBody.model_validate(body)
    except ValidationError as exc:
        return InvalidGroup(tuple(field_errors(exc)))

    errors: list[FieldError] = []
    first: dict[str, int] = {}
    for i, s in enumerate(parsed.steps):
        first.setdefault(s.id, i)

    scanned: list[Any] = []  # each step's arguments, references normalised
    # (step index, dependency id, loc of the dependency) for every edge to a known step
    edges: list[tuple[int, str, str]] = []
    for i, s in enumerate(parsed.steps):
        prefix = f"steps.{i}"
        if first[s.id] != i:
            errors.append(
                _fe(
                    f"{prefix}.id",
                    f"Step id {s.id!r} is already used by steps.{first[s.id]}.",
                    "duplicate_step_id",
                )
            )
        for k, dep in enumerate(s.depends_on):
            if dep in first:
                edges.append((i, dep, f"{prefix}.depends_on.{k}"))
            else:
                errors.append(
                    _fe(
                        f"{prefix}.depends_on.{k}",
                        f"There is no step {dep!r} in this group.",
                        "unknown_step",
                    )
                )
        try:
            check_depth(s.arguments, "this step's arguments")
        except NestingTooDeep as exc:
            errors.append(_fe(f"{prefix}.arguments", str(exc), "too_deep"))
            scanned.append(None)
            continue
        refs: list[Reference] = []
        ref_errors: list[tuple[Loc, str, str]] = []
        held: list[Loc] = []  # where the references are, malformed ones too
        normalised = _scan(s.arguments, (), refs, ref_errors, held)
        scanned.append(normalised)
        for loc, msg, type_ in ref_errors:
            errors.append(_fe(_loc(f"{prefix}.arguments", loc), msg, type_))
        for ref in refs:
            ref_loc = _loc(f"{prefix}.arguments", (*ref.loc, REF_KEY))
            if ref.step_id in first:
                edges.append((i, ref.step_id, ref_loc))
            else:
                errors.append(
                    _fe(ref_loc, f"There is no step {ref.step_id!r} in this group.", "unknown_step")
                )
        tool = tools.get(s.tool)
        if tool is None:
            errors.append(
                _fe(f"{prefix}.tool", f"There is no tool named {s.tool!r}.", "unknown_tool")
            )
            continue
        try:
            canonical_json(normalised)
        except CanonicalJsonError as exc:
            errors.append(
                _fe(f"{prefix}.arguments", f"No canonical JSON form: {exc}", "json_invalid")
            )
            continue
        for fe in tool.validate(normalised):
            loc = _split(fe.loc)
            if any(_known_at_run_time(loc, fe.type, at) for at in held):
                continue
            errors.append(fe.model_copy(update={"loc": _loc(f"{prefix}.arguments", loc)}))

    edges = [(i, dep, loc) for i, dep, loc in edges if first[parsed.steps[i].id] == i]
    errors.extend(_cycle_errors(parsed.steps, first, edges))
    if errors:
        return InvalidGroup(tuple(errors))

    steps: list[Step] = []
    for i, s in enumerate(parsed.steps):
        arguments_json = canonical_json(scanned[i])
        refs = []  # again, from the canonical form: in the order resolution walks them
        _scan(json.loads(arguments_json), (), refs, [], [])
        deps: set[str] = set(s.depends_on) | {r.step_id for r in refs}
        steps.append(
            Step(
                index=i,
                id=s.id,
                tool=s.tool,
                arguments_json=arguments_json,
                depends_on=tuple(sorted(deps, key=first.__getitem__)),
                references=tuple(refs),
                facts=tools[s.tool],
            )
        )
    return GroupDefinition(parsed.run_id, OnFailure(parsed.on_failure), tuple(steps))


def missing_scopes(definition: GroupDefinition, scopes: Collection[str]) -> tuple[FieldError, ...]:
    """One field error (``steps.<i>.tool``, type ``forbidden``) per step whose tool needs a
    scope that ``scopes`` (the submitter's) lacks: such a group is refused before anything is
    stored, as each of its steps would be."""
    held = set(scopes)
    return tuple(
        _fe(
            f"steps.{s.index}.tool",
            f"{s.tool} needs the scope(s) {sorted(s.facts.scopes - held)}, which this caller "
            "lacks.",
            "forbidden",
        )
        for s in definition.steps
        if not s.facts.scopes <= held
    )


def _loc(prefix: str, loc: Loc) -> str:
    return ".".join((prefix, *loc))


def _split(loc: str) -> Loc:
    return () if loc in ("", "$") else tuple(loc.split("."))


# errors of custom validators, which may look at any value below the object they check
_CUSTOM_ERRORS = frozenset({"value_error", "assertion_error"})


def _known_at_run_time(loc: Loc, type_: str, reference: Loc) -> bool:
    """A field error that a reference's value (unknown until run time) may cause: at the
    reference or inside it, or a custom validator's error on an object that contains it."""
    if loc[: len(reference)] == reference:
        return True
    return reference[: len(loc)] == loc and type_ in _CUSTOM_ERRORS


def _scan(
    value: Any,
    loc: Loc,
    refs: list[Reference],
    errors: list[tuple[Loc, str, str]],
    held: list[Loc],
) -> Any:
    """The value with its references normalised; collects the references, their errors and
    where every reference (well-formed or not) is."""
    if isinstance(value, dict):
        if REF_KEY in value:
            held.append(loc)
            return _reference(value, loc, refs, errors)
        return {k: _scan(v, (*loc, str(k)), refs, errors, held) for k, v in value.items()}
    if isinstance(value, list):
        return [_scan(v, (*loc, str(i)), refs, errors, held) for i, v in enumerate(value)]
    return value


def _reference(
    value: dict[str, Any], loc: Loc, refs: list[Reference], errors: list[tuple[Loc, str, str]]
) -> Any:
    ok = True
    for extra in sorted(set(value) - {REF_KEY, PATH_KEY}):
        errors.append(
            (
                (*loc, str(extra)),
                f"A reference has only {REF_KEY!r} and {PATH_KEY!r}.",
                "reference_invalid",
            )
        )
        ok = False
    source = value[REF_KEY]
    if not isinstance(source, str) or not source:
        errors.append(
            (
                (*loc, REF_KEY),
                "The step id of a reference must be a non-empty string.",
                "reference_invalid",
            )
        )
        ok = False
    path = value.get(PATH_KEY, "")
    if not isinstance(path, str):
        errors.append(((*loc, PATH_KEY), "A reference's path must be a string.", "path_invalid"))
        ok = False
    elif path and any(segment == "" for segment in path.split(".")):
        errors.append(
            (
                (*loc, PATH_KEY),
                f"The path {path!r} has an empty segment (use 'a.0.b').",
                "path_invalid",
            )
        )
        ok = False
    if not ok:
        return value
    refs.append(Reference(loc, source, path))
    return {REF_KEY: source, PATH_KEY: path}


def _cycle_errors(
    steps: Sequence[_StepBody], first: Mapping[str, int], edges: Sequence[tuple[int, str, str]]
) -> list[FieldError]:
    """One error per dependency inside a strongly connected component with a cycle."""
    graph: dict[int, list[int]] = {i: [] for i in first.values()}
    for i, dep, _ in edges:
        graph[i].append(first[dep])
    component = _components(graph)
    errors: list[FieldError] = []
    members: dict[int, list[str]] = {}
    for node, comp in sorted(component.items()):
        members.setdefault(comp, []).append(steps[node].id)
    for i, dep, loc in edges:
        j = first[dep]
        if i == j:
            errors.append(_fe(loc, "A step cannot depend on itself.", "dependency_cycle"))
        elif component[i] == component[j]:
            names = ", ".join(repr(n) for n in members[component[i]])
            errors.append(
                _fe(
                    loc,
                    f"This dependency makes a cycle: the steps {names} depend on each other.",
                    "dependency_cycle",
                )
            )
    return errors


def _components(graph: Mapping[int, Sequence[int]]) -> dict[int, int]:
    """Tarjan's strongly connected components, iteratively: node -> component number."""
    counter = 0
    index: dict[int, int] = {}
    low: dict[int, int] = {}
    on_stack: set[int] = set()
    stack: list[int] = []
    component: dict[int, int] = {}
    for root in sorted(graph):
        if root in index:
            continue
        work: list[tuple[int, int]] = [(root, 0)]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, child_at = work[-1]
            children = graph[node]
            if child_at < len(children):
                work[-1] = (node, child_at + 1)
                child = children[child_at]
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, 0))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component[member] = node
                    if member == node:
                        break
    return component


# -- references at run time ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Resolved:
    arguments: dict[str, Any]


@dataclass(frozen=True, slots=True)
class ReferenceFailure:
    """A reference whose path does not exist in the result it points at."""

    step_id: str  # the step whose arguments hold the reference
    reference: Reference
    reason: str

    @property
    def message(self) -> str:
        where = ".".join(self.reference.loc) or "$"
        path = self.reference.path or "(the whole result)"
        return (
            f"Step {self.step_id!r} takes argument {where!r} from path {path!r} of the result "
            f"of step {self.reference.step_id!r}, and {self.reason}."
        )

    @property
    def error(self) -> ErrorInfo:
        return ErrorInfo.of(
            ErrorCode.VALIDATION_FAILED,
            self.message,
            retryable=False,
            suggested_action=f"Fix the path of the reference to step "
            f"{self.reference.step_id!r}: it must exist in that step's result.",
        )


def resolve_arguments(step: Step, results: Mapping[str, Any]) -> Resolved | ReferenceFailure:
    """The step's concrete arguments, each reference replaced by the value at its path in the
    (parsed JSON) result of the step it names, or why one cannot be resolved."""
    by_loc = {ref.loc: ref for ref in step.references}
    failure: list[ReferenceFailure] = []

    def walk(value: Any, loc: Loc) -> Any:
        if loc in by_loc:
            found = _lookup(step.id, by_loc[loc], results)
            if isinstance(found, ReferenceFailure):
                failure.append(found)
                return None
            return found[0]
        if isinstance(value, dict):
            return {k: walk(v, (*loc, k)) for k, v in value.items()}
        if isinstance(value, list):
            return [walk(v, (*loc, str(i))) for i, v in enumerate(value)]
        return value

    arguments = walk(step.arguments, ())
    return failure[0] if failure else Resolved(arguments)


def _lookup(
    step_id: str, ref: Reference, results: Mapping[str, Any]
) -> tuple[Any] | ReferenceFailure:
    if ref.step_id not in results:
        return ReferenceFailure(step_id, ref, "that step has no result")
    value = results[ref.step_id]
    walked: list[str] = []
    for segment in ref.segments:
        here = ".".join(walked) or "the top"
        if isinstance(value, dict):
            if segment not in value:
                return ReferenceFailure(step_id, ref, f"there is no key {segment!r} at {here}")
            value = value[segment]
        elif isinstance(value, list):
            if not segment.isdecimal() or not segment.isascii():
                return ReferenceFailure(
                    step_id, ref, f"{segment!r} is not a list index (a list is at {here})"
                )
            if int(segment) >= len(value):
                return ReferenceFailure(
                    step_id,
                    ref,
                    f"index {segment} is out of range (the list at {here} has {len(value)} items)",
                )
            value = value[int(segment)]
        else:
            return ReferenceFailure(
                step_id, ref, f"the value at {here} is {_kind(value)}, not an object or a list"
            )
        walked.append(segment)
    return (value,)


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return type(value).__name__
