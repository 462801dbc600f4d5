"""The published schemas (schemas/bundle.py, docs/consuming.md#schemas): one bundle file per
committed version, each named type declared once, in dependency order; and the wire
fingerprints, pinned."""

from __future__ import annotations

import json
from typing import Any

import pytest
from fastavro import parse_schema
from fastavro.schema import expand_schema, fingerprint, to_parsing_canonical_form

from toolledger.schemas import codec
from toolledger.schemas.bundle import BUNDLE_DIR, bundle, bundle_text

# The CRC-64-AVRO fingerprint of every committed record schema, as the single-object header
# carries it. Bytes already written must stay decodable: a change here is a change of the wire
# format. (Declaring the enums once, in files of their own, changed none of them: the Parsing
# Canonical Form inlines a named type at its first use, with its full name, and drops docs.)
PINNED: dict[tuple[int, str], str] = {
    (1, "ApprovalConsumed"): "2609aa17523ffcae",
    (1, "ApprovalDenied"): "824da0a37129320e",
    (1, "ApprovalGranted"): "6985201c8908993b",
    (1, "ApprovalRequested"): "cdda89e9ea7820ed",
    (1, "ToolCallFailed"): "7276c1dfa65a7502",
    (1, "ToolCallJobCancelRequested"): "a2dce0f631b49e0f",
    (1, "ToolCallJobProgressed"): "5ff21b43bb81cf30",
    (1, "ToolCallJobReplayed"): "6c65b489634c0189",
    (1, "ToolCallJobReported"): "b9786c99cef8b3a4",
    (1, "ToolCallJobStarted"): "fc8c50626de3951e",
    (1, "ToolCallKeyExpired"): "4ae04e95cbc31648",
    (1, "ToolCallOutcomeUnknown"): "c55ca2990161be0d",
    (1, "ToolCallReconciled"): "eff82e6c112b7373",
    (1, "ToolCallRejected"): "5950979ee150604e",
    (1, "ToolCallReplayed"): "430b13734d7ba055",
    (1, "ToolCallRequested"): "43aa3eeeae583ee2",
    (1, "ToolCallStarted"): "d1532875cbee71bb",
    (1, "ToolCallSucceeded"): "1524d5306f8010b6",
    (1, "ToolDisabled"): "5383a5c16eca0b15",
    (1, "ToolEnabled"): "78df111f9430d0fc",
    (2, "ApprovalConsumed"): "2609aa17523ffcae",
    (2, "ApprovalDenied"): "824da0a37129320e",
    (2, "ApprovalGranted"): "6985201c8908993b",
    (2, "ApprovalRequested"): "cdda89e9ea7820ed",
    (2, "ToolCallFailed"): "7276c1dfa65a7502",
    (2, "ToolCallJobCancelRequested"): "a2dce0f631b49e0f",
    (2, "ToolCallJobProgressed"): "5ff21b43bb81cf30",
    (2, "ToolCallJobReplayed"): "6c65b489634c0189",
    (2, "ToolCallJobReported"): "b9786c99cef8b3a4",
    (2, "ToolCallJobStarted"): "fc8c50626de3951e",
    (2, "ToolCallKeyExpired"): "6d1fa5bc52529637",
    (2, "ToolCallOutcomeUnknown"): "c55ca2990161be0d",
    (2, "ToolCallReconciled"): "eff82e6c112b7373",
    (2, "ToolCallRejected"): "5950979ee150604e",
    (2, "ToolCallReplayed"): "430b13734d7ba055",
    (2, "ToolCallRequested"): "43aa3eeeae583ee2",
    (2, "ToolCallStarted"): "d1532875cbee71bb",
    (2, "ToolCallSucceeded"): "1524d5306f8010b6",
    (2, "ToolDisabled"): "5383a5c16eca0b15",
    (2, "ToolEnabled"): "78df111f9430d0fc",
    # v3: duration_ms became a double in ToolCallSucceeded, ToolCallFailed, ToolCallJobStarted
    (3, "ApprovalConsumed"): "2609aa17523ffcae",
    (3, "ApprovalDenied"): "824da0a37129320e",
    (3, "ApprovalGranted"): "6985201c8908993b",
    (3, "ApprovalRequested"): "cdda89e9ea7820ed",
    (3, "ToolCallFailed"): "017fa24e8739ea7a",
    (3, "ToolCallJobCancelRequested"): "a2dce0f631b49e0f",
    (3, "ToolCallJobProgressed"): "5ff21b43bb81cf30",
    (3, "ToolCallJobReplayed"): "6c65b489634c0189",
    (3, "ToolCallJobReported"): "b9786c99cef8b3a4",
    (3, "ToolCallJobStarted"): "7dac6f0d9a564d5e",
    (3, "ToolCallKeyExpired"): "6d1fa5bc52529637",
    (3, "ToolCallOutcomeUnknown"): "c55ca2990161be0d",
    (3, "ToolCallReconciled"): "eff82e6c112b7373",
    (3, "ToolCallRejected"): "5950979ee150604e",
    (3, "ToolCallReplayed"): "430b13734d7ba055",
    (3, "ToolCallRequested"): "43aa3eeeae583ee2",
    (3, "ToolCallStarted"): "d1532875cbee71bb",
    (3, "ToolCallSucceeded"): "31f6ed452d09ccbf",
    (3, "ToolDisabled"): "5383a5c16eca0b15",
    (3, "ToolEnabled"): "78df111f9430d0fc",
}


def test_every_committed_fingerprint_is_pinned() -> None:
    found = {
        (version, name): fingerprint(to_parsing_canonical_form(schema), "CRC-64-AVRO")
        for version, records in codec.VERSIONS.items()
        for name, schema in records.items()
    }
    assert found == PINNED


@pytest.mark.parametrize("version", sorted(codec.VERSIONS))
def test_the_committed_bundle_is_the_one_made_from_the_files(version: int) -> None:
    path = BUNDLE_DIR / f"v{version}.avsc"
    assert path.read_text(encoding="utf-8") == bundle_text(version), (
        f"{path} is stale: run python -m toolledger.schemas.bundle"
    )


@pytest.mark.parametrize("version", sorted(codec.VERSIONS))
def test_a_bundle_declares_each_type_once_after_what_it_uses(version: int) -> None:
    types = bundle(version)
    names = [f"{t['namespace']}.{t['name']}" for t in types]
    assert len(names) == len(set(names))
    parsed: dict[str, Any] = {}
    for declared in types:  # alone, in order: a reference to a later type would fail here
        parse_schema(declared, named_schemas=parsed)
    records = {t["name"] for t in types if t["type"] == "record"}
    assert set(codec.VERSIONS[version]) <= records


@pytest.mark.parametrize("version", sorted(codec.VERSIONS))
def test_a_record_of_the_bundle_has_the_wire_fingerprint(version: int) -> None:
    """What a reader of the bundle computes for a record (with the types it uses inlined, as
    Java's ``SchemaNormalization`` does for a parsed schema) is what the header carries."""
    expanded = expand_schema(json.loads((BUNDLE_DIR / f"v{version}.avsc").read_text("utf-8")))
    assert isinstance(expanded, list)
    by_name = {branch["name"].rpartition(".")[2]: branch for branch in expanded}
    for name in codec.VERSIONS[version]:
        canonical = to_parsing_canonical_form(by_name[name])
        assert fingerprint(canonical, "CRC-64-AVRO") == PINNED[(version, name)], name
