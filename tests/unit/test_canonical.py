"""Canonical JSON and the arguments digest (docs/architecture.md#vocabulary and
docs/architecture.md#the-http-contract)."""

from __future__ import annotations

import hashlib
import json
import re
import unicodedata
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from toolledger.schemas.canonical import (
    CanonicalJsonError,
    args_digest,
    canonical_bytes,
    canonical_json,
    normalise,
)

NFC_E = "\u00e9"  # é as one code point
NFD_E = "e\u0301"  # e + combining acute accent

# ------------------------------------------------------------------------------ key order


def test_keys_are_sorted() -> None:
    assert canonical_json({"b": 1, "a": 2, "c": 3}) == '{"a":2,"b":1,"c":3}'
    assert args_digest({"b": 1, "a": 2}) == args_digest({"a": 2, "b": 1})


def test_keys_are_sorted_by_code_point() -> None:
    value = {NFC_E: 1, "z": 2, "Z": 3, "a": 4, "10": 5, "9": 6, "": 7}
    assert canonical_json(value) == f'{{"":7,"10":5,"9":6,"Z":3,"a":4,"z":2,"{NFC_E}":1}}'


def test_nested_objects_and_arrays() -> None:
    value = {"outer": {"z": [{"b": 1, "a": [True, None, "x"]}], "a": {}}, "list": [3, 1, 2]}
    assert canonical_json(value) == (
        '{"list":[3,1,2],"outer":{"a":{},"z":[{"a":[true,null,"x"],"b":1}]}}'
    )
    # array order is significant
    assert args_digest([1, 2]) != args_digest([2, 1])


def test_tuples_are_arrays() -> None:
    assert canonical_json({"a": (1, 2)}) == canonical_json({"a": [1, 2]}) == '{"a":[1,2]}'


# ------------------------------------------------------------------------------ Unicode


def test_nfc_and_nfd_strings_are_the_same_argument() -> None:
    assert NFC_E != NFD_E
    assert canonical_json(NFD_E) == canonical_json(NFC_E) == f'"{NFC_E}"'
    assert args_digest({"name": f"Ren{NFD_E}e"}) == args_digest({"name": f"Ren{NFC_E}e"})


def test_nfc_and_nfd_keys_are_the_same_key() -> None:
    assert canonical_json({f"caf{NFD_E}": 1}) == canonical_json({f"caf{NFC_E}": 1})
    assert args_digest({f"caf{NFD_E}": {NFD_E: NFD_E}}) == args_digest(
        {f"caf{NFC_E}": {NFC_E: NFC_E}}
    )


def test_keys_sort_after_normalisation() -> None:
    # NFD "e\u0301" would sort before "f"; its NFC form "é" (U+00E9) sorts after "z"
    assert canonical_json({NFD_E: 1, "f": 2, "z": 3}) == f'{{"f":2,"z":3,"{NFC_E}":1}}'


def test_duplicate_keys_after_nfc_are_rejected() -> None:
    with pytest.raises(CanonicalJsonError, match="duplicate"):
        canonical_json({NFC_E: 1, NFD_E: 2})
    with pytest.raises(CanonicalJsonError):
        args_digest({"outer": [{f"x{NFC_E}": 1, f"x{NFD_E}": 1}]})


def test_non_ascii_is_written_as_itself_in_utf8() -> None:
    value = {"greeting": "Grüße, 世界 🌍"}
    assert canonical_json(value) == '{"greeting":"Grüße, 世界 🌍"}'
    assert canonical_bytes(value) == '{"greeting":"Grüße, 世界 🌍"}'.encode()


def test_lone_surrogates_have_no_canonical_form() -> None:
    """A lone surrogate (JSON allows the escape ``"\\ud800"``) cannot be written as UTF-8.

    The module's contract is that values without a canonical form raise CanonicalJsonError
    (as NaN does); the digest must not fail with an unrelated UnicodeEncodeError.
    """
    value = json.loads('{"title": "\\ud800"}')
    with pytest.raises(CanonicalJsonError):
        args_digest(value)


# ------------------------------------------------------------------------------ numbers


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (1, "1"),
        (1.0, "1"),
        (-0.0, "0"),
        (0.0, "0"),
        (-1.0, "-1"),
        (0, "0"),
        (1e20, "100000000000000000000"),
        (10**20, "100000000000000000000"),
        (2.5, "2.5"),
        (0.1, "0.1"),
        (-1.5e-7, "-1.5e-07"),
        (2**64, "18446744073709551616"),
    ],
)
def test_numbers_are_normalised(value: float, expected: str) -> None:
    assert canonical_json(value) == expected


def test_one_and_one_point_zero_are_the_same_argument() -> None:
    assert args_digest({"n": 1}) == args_digest({"n": 1.0}) == args_digest(json.loads('{"n":1.0}'))
    assert (
        args_digest({"n": 0}) == args_digest({"n": -0.0}) == args_digest(json.loads('{"n": -0.0}'))
    )
    assert args_digest(json.loads('{"n": 1e20}')) == args_digest(
        json.loads('{"n": 100000000000000000000}')
    )
    assert args_digest({"n": 1}) != args_digest({"n": 1.5})


def test_booleans_stay_booleans() -> None:
    assert canonical_json([True, False, None]) == "[true,false,null]"
    assert args_digest({"a": True}) != args_digest({"a": 1})
    assert args_digest({"a": False}) != args_digest({"a": 0})
    assert normalise(True) is True


@pytest.mark.parametrize(
    "bad", [float("nan"), float("inf"), float("-inf")], ids=["NaN", "Infinity", "-Infinity"]
)
def test_nan_and_infinity_are_rejected(bad: float) -> None:
    for value in (bad, [1, bad], {"a": {"b": bad}}):
        with pytest.raises(CanonicalJsonError):
            canonical_json(value)
        with pytest.raises(CanonicalJsonError):
            args_digest(value)


@pytest.mark.parametrize("text", ["NaN", "Infinity", "-Infinity"])
def test_nan_and_infinity_parsed_by_python_json_are_rejected(text: str) -> None:
    # Python's json module accepts these non-standard tokens; canonical JSON must not.
    with pytest.raises(CanonicalJsonError):
        args_digest(json.loads(f'{{"x": {text}}}'))


# ------------------------------------------------------------------------------ escapes, whitespace


def test_string_escapes_do_not_matter() -> None:
    escaped = json.loads('{"name": "Ren\\u00e9e", "tab": "a\\tb", "slash": "a\\/b"}')
    literal = json.loads('{"name": "Renée", "tab": "a\\u0009b", "slash": "a/b"}')
    assert canonical_json(escaped) == canonical_json(literal)
    assert canonical_json(escaped) == '{"name":"Renée","slash":"a/b","tab":"a\\tb"}'
    # an escaped NFD sequence equals a literal NFC character
    assert args_digest(json.loads('"e\\u0301"')) == args_digest(json.loads(f'"{NFC_E}"'))


def test_formatting_does_not_matter() -> None:
    compact = '{"a":[1,2,{"c":"d"}],"b":{"x":null,"y":true}}'
    pretty = """
    {
        "b" : { "y" : true ,
                "x" : null },
        "a" : [ 1 ,
                2.0 , { "c" : "d" } ]
    }
    """
    assert canonical_json(json.loads(pretty)) == canonical_json(json.loads(compact)) == compact
    assert args_digest(json.loads(pretty)) == args_digest(json.loads(compact))


# ------------------------------------------------------------------------------ non-JSON values


@pytest.mark.parametrize(
    "value",
    [{1: "a"}, {None: 1}, {(1, 2): 3}, {True: 1}, {1.5: 2}],
    ids=["int", "None", "tuple", "bool", "float"],
)
def test_non_string_keys_are_rejected(value: dict[Any, Any]) -> None:
    with pytest.raises(CanonicalJsonError, match="keys"):
        canonical_json(value)
    with pytest.raises(CanonicalJsonError):
        canonical_json({"nested": [value]})


@pytest.mark.parametrize(
    "value", [{1, 2}, b"bytes", object(), 1j], ids=["set", "bytes", "object", "complex"]
)
def test_non_json_values_are_rejected(value: object) -> None:
    with pytest.raises(CanonicalJsonError):
        canonical_json({"a": value})


# ------------------------------------------------------------------------------ digest


def test_digest_format() -> None:
    digest = args_digest({"title": "Printer on fire", "priority": "high"})
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", digest)
    expected = hashlib.sha256(b'{"priority":"high","title":"Printer on fire"}').hexdigest()
    assert digest == "sha256:" + expected
    assert args_digest({}) == "sha256:" + hashlib.sha256(b"{}").hexdigest()


def test_digest_is_pinned() -> None:
    """The digest of a fixed value must never change between releases: stored keys rely on it."""
    assert args_digest({"b": [1.0, NFD_E], "a": None}) == (
        "sha256:" + hashlib.sha256('{"a":null,"b":[1,"é"]}'.encode()).hexdigest()
    )


# ------------------------------------------------------------------------------ properties

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text()
)
nfc_keys = st.text().map(lambda s: unicodedata.normalize("NFC", s))
json_values = st.recursive(
    json_scalars,
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(nfc_keys, children, max_size=5)
    ),
    max_leaves=25,
)


def _nfd(value: Any) -> Any:
    if isinstance(value, str):
        return unicodedata.normalize("NFD", value)
    if isinstance(value, list):
        return [_nfd(v) for v in value]
    if isinstance(value, dict):
        return {_nfd(k): _nfd(v) for k, v in value.items()}
    return value


@settings(max_examples=300)
@given(json_values)
def test_canonical_json_is_a_fixed_point(value: Any) -> None:
    once = canonical_json(value)
    assert canonical_json(json.loads(once)) == once


@settings(max_examples=200)
@given(json_values)
def test_reformatting_and_escaping_do_not_change_the_digest(value: Any) -> None:
    digest = args_digest(value)
    for text in (
        json.dumps(value),
        json.dumps(value, indent=3, ensure_ascii=True),
        json.dumps(value, separators=(" , ", " : "), ensure_ascii=False),
    ):
        assert args_digest(json.loads(text)) == digest


@settings(max_examples=200)
@given(json_values)
def test_nfd_input_has_the_same_digest(value: Any) -> None:
    assert args_digest(_nfd(value)) == args_digest(value)
