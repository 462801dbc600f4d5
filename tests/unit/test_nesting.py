"""The nesting limit of a call's arguments (schemas/nesting): 64 levels of arrays and objects
pass, 65 are refused with a message naming the limit, at any depth and without recursion, in
parsed values and in JSON text (whose strings' brackets do not count)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from toolledger.schemas.nesting import MAX_DEPTH, NestingTooDeep, check_depth, check_text_depth


def nested(depth: int) -> Any:
    """An object of ``depth`` levels: objects and arrays in turn, a scalar at the bottom."""
    value: Any = "leaf"
    for level in range(depth):
        value = {"a": value} if level % 2 else [value]
    return value


def deep_text(depth: int) -> bytes:
    """JSON text ``depth`` levels deep, without building the value (which would recurse)."""
    half, odd = divmod(depth, 2)
    return b'{"a":[' * half + b"[" * odd + b"1" + b"]" * odd + b"]}" * half


def test_the_limit_is_64() -> None:
    assert MAX_DEPTH == 64


@pytest.mark.parametrize("depth", [0, 1, 2, MAX_DEPTH])
def test_values_up_to_the_limit_pass(depth: int) -> None:
    check_depth(nested(depth))
    check_text_depth(json.dumps(nested(depth)))


@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 1000, 100_000])
def test_a_value_past_the_limit_is_refused_naming_it(depth: int) -> None:
    with pytest.raises(NestingTooDeep) as refused:
        check_depth(nested(depth))
    assert "64 levels" in str(refused.value)
    assert "the arguments" in str(refused.value)


@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 1000, 1_000_001])
def test_text_past_the_limit_is_refused_at_any_depth(depth: int) -> None:
    with pytest.raises(NestingTooDeep, match="the limit is 64 levels"):
        check_text_depth(deep_text(depth), "a step's arguments")
    with pytest.raises(NestingTooDeep):
        check_text_depth(b"[" * depth)  # not even JSON: the brackets still count


def test_the_text_check_counts_from_the_envelope() -> None:
    body = b'{"arguments":' + deep_text(MAX_DEPTH) + b"}"
    check_text_depth(body, envelope=1)
    with pytest.raises(NestingTooDeep):
        check_text_depth(body)
    deeper = b'{"arguments":' + json.dumps(nested(MAX_DEPTH + 1)).encode() + b"}"
    with pytest.raises(NestingTooDeep):
        check_text_depth(deeper, envelope=1)


def test_brackets_inside_strings_do_not_count() -> None:
    text = json.dumps({"a": "[" * 500, "b": '\\"{{{' * 100, "c": ["]]]" * 10]})
    check_text_depth(text)
    check_text_depth(text.encode())


def test_an_escaped_quote_does_not_end_a_string() -> None:
    text = '{"a": "x\\"' + "[" * 100 + '"}'
    check_text_depth(text)
    with pytest.raises(NestingTooDeep):
        check_text_depth('{"a": "x\\\\"' + "," + '"b":' + "[" * 100 + "]" * 100 + "}")


def test_many_shallow_containers_pass() -> None:
    check_depth([[{"a": [1]}] for _ in range(10_000)])
    check_text_depth(json.dumps([[{"a": [1]}] for _ in range(10_000)]))
