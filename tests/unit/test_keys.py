"""Call keys, idempotency-key syntax and Kafka-compatible partitioning (schemas/keys.py)."""

from __future__ import annotations

import hashlib
import re

import pytest
from aiokafka.partitioner import DefaultPartitioner
from aiokafka.partitioner import murmur2 as aiokafka_murmur2
from hypothesis import example, given, settings
from hypothesis import strategies as st

from toolledger.schemas.keys import (
    MAX_KEY_LENGTH,
    CallKey,
    InvalidIdempotencyKey,
    KeyScope,
    call_key_of,
    check_idempotency_key,
    derive_idempotency_key,
    murmur2,
    partition_for,
)

# ------------------------------------------------------------------------------ murmur2

# org.apache.kafka.common.utils.UtilsTest#testMurmur2 (Java signed ints)
KAFKA_VECTORS: list[tuple[bytes, int]] = [
    (b"21", -973932308),
    (b"foobar", -790332482),
    (b"a-little-bit-long-string", -985981536),
    (b"a-little-bit-longer-string", -1486304829),
    (b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971),
    (bytes([97, 98, 99]), 479470107),
]


def _unsigned(signed: int) -> int:
    return signed & 0xFFFFFFFF


@pytest.mark.parametrize(
    ("data", "expected"), KAFKA_VECTORS, ids=[d.decode() for d, _ in KAFKA_VECTORS]
)
def test_murmur2_matches_kafka_utils_test(data: bytes, expected: int) -> None:
    assert murmur2(data) == expected


@pytest.mark.parametrize(
    ("data", "expected"), KAFKA_VECTORS, ids=[d.decode() for d, _ in KAFKA_VECTORS]
)
def test_the_vectors_hold_for_aiokafka_too(data: bytes, expected: int) -> None:
    # aiokafka returns the same 32 bits as an unsigned int
    assert aiokafka_murmur2(data) == _unsigned(expected)


@settings(max_examples=500)
@given(st.binary(max_size=300))
@example(b"")
@example(b"\xff\xff\xff\xff\xff\xff\xff")
def test_murmur2_equals_aiokafka(data: bytes) -> None:
    ours = murmur2(data)
    assert -(2**31) <= ours < 2**31
    assert _unsigned(ours) == aiokafka_murmur2(data)


@settings(max_examples=500)
@given(st.binary(max_size=200), st.integers(1, 500))
def test_partition_for_equals_aiokafka_default_partitioner(key: bytes, partitions: int) -> None:
    all_partitions = list(range(partitions))
    expected = DefaultPartitioner()(key, all_partitions, all_partitions)
    assert partition_for(key, partitions) == expected


@settings(max_examples=200)
@given(st.text(), st.text(), st.text(), st.integers(1, 64))
def test_call_keys_partition_like_aiokafka(
    tenant: str, tool: str, key: str, partitions: int
) -> None:
    encoded = CallKey(tenant, tool, key).encode()
    all_partitions = list(range(partitions))
    assert partition_for(encoded, partitions) == DefaultPartitioner()(
        encoded, all_partitions, all_partitions
    )


def test_partition_for_known_value_and_range() -> None:
    # toPositive(-790332482) % 50 == 16 (Kafka's Utils.toPositive is `& 0x7fffffff`)
    assert partition_for(b"foobar", 50) == (-790332482 & 0x7FFFFFFF) % 50 == 16
    assert partition_for(b"anything", 1) == 0
    with pytest.raises(ValueError):
        partition_for(b"foobar", 0)


# ------------------------------------------------------------------------------ key syntax

PRINTABLE_ASCII = "".join(chr(c) for c in range(0x20, 0x7F))


@pytest.mark.parametrize(
    "key",
    [
        "k",
        "a" * MAX_KEY_LENGTH,
        "run-1:step-7",
        "inner spaces, and commas",
        PRINTABLE_ASCII,
        '"quoted"',
        " leading and trailing ",
    ],
    ids=["one-char", "255", "run-step", "spaces-commas", "all-printable", "quotes", "outer-space"],
)
def test_valid_idempotency_keys(key: str) -> None:
    assert MAX_KEY_LENGTH == 255
    assert check_idempotency_key(key) == key


@pytest.mark.parametrize(
    "key",
    [
        "",
        "a" * 256,
        "a" * 1000,
        "tab\there",
        "new\nline",
        "nul\x00",
        "del\x7f",
        "esc\x1b",
        "café",
        "ключ",
        "nbsp\u00a0",
        "emoji🔑",
        "\u200b",
    ],
    ids=[
        "empty",
        "256",
        "1000",
        "tab",
        "newline",
        "nul",
        "del",
        "esc",
        "accent",
        "cyrillic",
        "nbsp",
        "emoji",
        "zero-width-space",
    ],
)
def test_invalid_idempotency_keys(key: str) -> None:
    with pytest.raises(InvalidIdempotencyKey):
        check_idempotency_key(key)


def test_invalid_key_is_a_value_error_with_a_reason() -> None:
    with pytest.raises(ValueError, match="256 characters"):
        check_idempotency_key("a" * 256)
    with pytest.raises(ValueError, match="position 3"):
        check_idempotency_key("abc\x01")


@given(
    st.text(
        alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E),
        min_size=1,
        max_size=MAX_KEY_LENGTH,
    )
)
def test_every_printable_ascii_key_is_valid(key: str) -> None:
    assert check_idempotency_key(key) == key


@given(
    st.text(min_size=1, max_size=20).filter(lambda s: any(not 0x20 <= ord(c) <= 0x7E for c in s))
)
def test_every_key_with_a_non_printable_or_non_ascii_character_is_invalid(key: str) -> None:
    with pytest.raises(InvalidIdempotencyKey):
        check_idempotency_key(key)


# ------------------------------------------------------------------------------ CallKey

HOSTILE = [
    '"',
    "'",
    ",",
    "/",
    "\\",
    '","',
    '["a","b","c"]',
    "\u00e9",
    "e\u0301",
    "🔑",
    "\x00",
    "\n",
    " ",
    "",
    "null",
    "]",
    "[",
    "a/b/c",
    "a,b,c",
]


@pytest.mark.parametrize("part", HOSTILE)
def test_call_key_round_trip_with_hostile_characters(part: str) -> None:
    for triple in (
        (part, "tool", "key"),
        ("tenant", part, "key"),
        ("tenant", "tool", part),
        (part, part, part),
    ):
        key = CallKey(*triple)
        assert CallKey.parse(str(key)) == key
        assert CallKey.parse(key.encode().decode("utf-8")) == key


@given(st.text(), st.text(), st.text())
def test_call_key_round_trip(tenant: str, tool: str, idem: str) -> None:
    key = CallKey(tenant, tool, idem)
    assert CallKey.parse(str(key)) == key
    assert str(key) == key.encode().decode("utf-8")


def test_call_keys_that_naive_joins_would_confuse_are_distinct() -> None:
    confusable = [
        CallKey("a,b", "c", "d"),
        CallKey("a", "b,c", "d"),
        CallKey("a", "b", "c,d"),
        CallKey("a/b", "c", "d"),
        CallKey("a", "b/c", "d"),
        CallKey('a"', "b", "c"),
        CallKey("a", '"b', "c"),
        CallKey('a","b', "c", "d"),
        CallKey("a", "b", '"c","d'),
        CallKey("\u00e9", "t", "k"),
        CallKey("e\u0301", "t", "k"),
    ]
    assert len({k.encode() for k in confusable}) == len(confusable)
    assert len({k.call_id for k in confusable}) == len(confusable)


triples = st.tuples(st.text(max_size=8), st.text(max_size=8), st.text(max_size=8))


@settings(max_examples=300)
@given(triples, triples)
@example(("a,b", "c", "d"), ("a", "b,c", "d"))
@example(('a","b', "c", "d"), ("a", "b", "c"))
def test_different_triples_never_collide(a: tuple[str, str, str], b: tuple[str, str, str]) -> None:
    ka, kb = CallKey(*a), CallKey(*b)
    if a == b:
        assert ka.encode() == kb.encode() and ka.call_id == kb.call_id
    else:
        assert ka.encode() != kb.encode()
        assert ka.call_id != kb.call_id


@pytest.mark.parametrize(
    "text",
    [
        '["a","b"]',
        '["a","b","c","d","e"]',
        '["a","b",1]',
        "{}",
        '"abc"',
        "null",
        '[null,"b","c"]',
        '["a","b","c",null]',
        "[",
        "",
    ],
)
def test_parse_refuses_what_is_not_a_call_key(text: str) -> None:
    with pytest.raises(ValueError):
        CallKey.parse(text)
    assert call_key_of(text) is None


def test_a_principal_scoped_key_is_the_tenant_key_with_the_principal_after_it() -> None:
    alice = CallKey.scoped(KeyScope.TENANT_PRINCIPAL, "acme", "alice", "charge_card", "k")
    tenant = CallKey.scoped(KeyScope.TENANT, "acme", "alice", "charge_card", "k")
    assert str(alice) == '["acme","charge_card","k","alice"]'
    assert alice.scope is KeyScope.TENANT_PRINCIPAL
    assert str(tenant) == '["acme","charge_card","k"]' and tenant.scope is KeyScope.TENANT
    assert CallKey.parse(str(alice)) == alice and call_key_of(str(alice)) == alice
    bob = CallKey.scoped(KeyScope.TENANT_PRINCIPAL, "acme", "bob", "charge_card", "k")
    # three calls: alice's, bob's and the tenant's key are apart, in every written form
    assert len({alice.call_id, bob.call_id, tenant.call_id}) == 3
    assert alice.names("acme", "charge_card", "k") and tenant.names("acme", "charge_card", "k")
    assert not alice.names("acme", "charge_card", "k2")
    # whose records may carry it: alice's only; the tenant's key any principal's
    assert alice.sent_by("acme", "charge_card", "k", "alice")
    assert not alice.sent_by("acme", "charge_card", "k", "bob")
    assert not alice.sent_by("acme", "charge_card", "k", None)
    assert tenant.sent_by("acme", "charge_card", "k", "bob")
    assert alice.visible_to("alice") and not alice.visible_to("bob") and tenant.visible_to("bob")


@pytest.mark.parametrize("text", ['["a", "b", "c"]', '[ "a","b","c","d"]', '["\\u0061","b","c"]'])
def test_a_call_key_written_another_way_is_not_one(text: str) -> None:
    """The same parts written otherwise would be another state's key: refused."""
    assert CallKey.parse(text) is not None
    assert call_key_of(text) is None


def test_key_scopes_parse_by_their_names_only() -> None:
    assert KeyScope.parse("tenant") is KeyScope.TENANT
    assert KeyScope.parse("tenant+principal") is KeyScope.TENANT_PRINCIPAL
    with pytest.raises(ValueError, match="'tenant' or 'tenant\\+principal'"):
        KeyScope.parse("principal")


def test_call_id_is_stable() -> None:
    key = CallKey("t1", "create_ticket", "k1")
    assert key.encode() == b'["t1","create_ticket","k1"]'
    # pinned: the public call id must be the same on every backend, release and replay
    assert key.call_id == "call_0ed203c63105fb217e275aaa6ab86aac"
    assert key.call_id == CallKey("t1", "create_ticket", "k1").call_id
    assert key.call_id == CallKey.parse(str(key)).call_id
    assert key.call_id == "call_" + hashlib.sha256(key.encode()).hexdigest()[:32]
    assert re.fullmatch(r"call_[0-9a-f]{32}", CallKey("x", "y", "z").call_id)
    # scoped by tenant and by tool
    assert key.call_id != CallKey("t2", "create_ticket", "k1").call_id
    assert key.call_id != CallKey("t1", "close_ticket", "k1").call_id


def test_non_ascii_parts_are_encoded_as_utf8_not_escaped() -> None:
    assert CallKey("zoë", "t", "k").encode() == '["zoë","t","k"]'.encode()


# ------------------------------------------------------------------------------ derived keys


def test_derived_key_is_stable_for_the_same_run_and_step() -> None:
    assert derive_idempotency_key("run-1", "step-1") == derive_idempotency_key("run-1", "step-1")
    assert derive_idempotency_key("run-1", "step-1") == "step:run-1:step-1"


def test_derived_key_differs_across_steps_and_runs() -> None:
    keys = {
        derive_idempotency_key(run, step)
        for run in ("run-1", "run-2")
        for step in ("step-1", "step-2", "step-10")
    }
    assert len(keys) == 6


@pytest.mark.parametrize(
    ("run_id", "step_id"),
    [
        ("run 1", "step 1"),
        ("rün", "schritt"),
        ("r" * 300, "s"),
        ("r", "s" * 300),
        ("run\n", "step"),
        ("🏃", "👣"),
        ("a" * 150, "b" * 50),
        ("a" * 150, "b" * 49),
    ],
)
def test_derived_key_always_passes_the_key_check(run_id: str, step_id: str) -> None:
    key = derive_idempotency_key(run_id, step_id)
    assert check_idempotency_key(key) == key
    assert key == derive_idempotency_key(run_id, step_id)


@pytest.mark.parametrize(("run_id", "step_id"), [("", "s"), ("r", ""), ("", "")])
def test_derived_key_needs_both_ids(run_id: str, step_id: str) -> None:
    with pytest.raises(InvalidIdempotencyKey):
        derive_idempotency_key(run_id, step_id)


@settings(max_examples=300)
@given(st.text(min_size=1), st.text(min_size=1))
def test_derived_key_is_always_valid(run_id: str, step_id: str) -> None:
    key = derive_idempotency_key(run_id, step_id)
    assert check_idempotency_key(key) == key
    assert derive_idempotency_key(run_id, step_id) == key


def test_derived_keys_of_different_run_step_pairs_are_different() -> None:
    """Two different (run, step) pairs are two intents, so they must never share a key.

    The readable form ``step:<run>:<step>`` is ambiguous when an id contains ``:``.
    """
    assert derive_idempotency_key("a:b", "c") != derive_idempotency_key("a", "b:c")


id_parts = st.text(
    alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1, max_size=6
)


@settings(max_examples=300)
@given(st.tuples(id_parts, id_parts), st.tuples(id_parts, id_parts))
@example(("run:1", "s"), ("run", "1:s"))
def test_derived_key_is_injective(a: tuple[str, str], b: tuple[str, str]) -> None:
    if a != b:
        assert derive_idempotency_key(*a) != derive_idempotency_key(*b)
