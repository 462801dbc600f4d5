"""Every committed schema version stays readable (docs/architecture.md#events-and-the-wire-format).

For each ``schemas/avro/v*/`` directory and each event record in it, records written with that
version's schema - samples generated from the schema itself - must decode with
:func:`schemas.codec.decode` into the current model. Adding ``v2/`` is covered automatically.
"""

from __future__ import annotations

import json
import shutil
from datetime import UTC, datetime, timedelta
from io import BytesIO
from pathlib import Path
from typing import Any, ClassVar

import pytest
from fastavro import schemaless_writer
from fastavro.schema import fingerprint, to_parsing_canonical_form

from toolledger.schemas import codec
from toolledger.schemas.events import EVENTS_BY_TYPE, Envelope, Event, ToolCallSucceeded

AVRO_ROOT = Path(codec.__file__).resolve().parent / "avro"
PRIMITIVES = {"null", "boolean", "int", "long", "float", "double", "bytes", "string"}


def committed_versions() -> dict[int, Path]:
    return {int(d.name[1:]): d for d in AVRO_ROOT.glob("v*") if d.is_dir() and d.name[1:].isdigit()}


# ------------------------------------------------------------------------ samples from a schema


class SampleBuilder:
    """Type-appropriate values for a parsed (self-contained) fastavro schema.

    Variant ``k`` takes the ``k``-th union branch and enum symbol (modulo their counts), so
    the variants together write every symbol and both sides of every ``["null", X]``.
    """

    TEXTS: ClassVar[tuple[str, ...]] = ("plain", "Grüße — 世界 🌍", "", '{"json":[1,2]}')

    def __init__(self, variant: int) -> None:
        self.k = variant
        self.named: dict[str, Any] = {}

    def value(self, node: Any, name: str) -> Any:
        k = self.k
        if isinstance(node, list):
            return self.value(node[k % len(node)], name)
        if isinstance(node, str):
            if node not in PRIMITIVES:
                return self.value(self.named[node], name)
            node = {"type": node}
        kind = node["type"]
        if node.get("logicalType") in ("timestamp-micros", "timestamp-millis"):
            base = datetime(2024, 5, 1, 12, 0, tzinfo=UTC) + timedelta(days=k, milliseconds=k)
            if node["logicalType"] == "timestamp-micros":
                base += timedelta(microseconds=k * 7 + 1)
            return base
        if kind in ("record", "error"):
            self.named[node["name"]] = node
            return {f["name"]: self.value(f["type"], f["name"]) for f in node["fields"]}
        if kind == "enum":
            self.named[node["name"]] = node
            return node["symbols"][k % len(node["symbols"])]
        if kind == "fixed":
            self.named[node["name"]] = node
            return bytes(range(node["size"]))
        if kind == "array":
            return [self.value(node["items"], name) for _ in range(k % 3)]
        if kind == "map":
            return {f"key{i}": self.value(node["values"], name) for i in range(k % 3)}
        return {
            "null": None,
            "boolean": k % 2 == 0,
            "int": -(k + 1) if k % 2 else k + 1,
            "long": (-1) ** k * (k * 1_000_003 + 7),
            "float": k + 0.5,
            "double": k + 0.25,
            "bytes": f"{name}-{k}".encode(),
            "string": f"{name}: {self.TEXTS[k % len(self.TEXTS)]}",
        }[kind]


def variants_needed(node: Any) -> int:
    """Enough variants to write every enum symbol and every union branch at least once."""
    if isinstance(node, list):
        return max(len(node), *(variants_needed(n) for n in node))
    if not isinstance(node, dict):
        return 1
    kind = node["type"]
    if kind == "enum":
        return len(node["symbols"])
    if kind in ("record", "error"):
        return max([1, *(variants_needed(f["type"]) for f in node["fields"])])
    if kind == "array":
        return max(3, variants_needed(node["items"]))
    if kind == "map":
        return max(3, variants_needed(node["values"]))
    return 1


def single_object(schema: dict[str, Any], record: dict[str, Any]) -> bytes:
    """Encode like any Avro library would: marker, fingerprint, body - without the codec."""
    header = b"\xc3\x01" + bytes.fromhex(
        fingerprint(to_parsing_canonical_form(schema), "CRC-64-AVRO")
    )
    body = BytesIO()
    schemaless_writer(body, schema, record)
    return header + body.getvalue()


def common_part(decoded: Any, written: Any) -> tuple[Any, Any]:
    """The parts of both values that both schemas know (fields may be added or removed)."""
    if isinstance(decoded, dict) and isinstance(written, dict):
        keys = [k for k in written if k in decoded]
        pairs = [common_part(decoded[k], written[k]) for k in keys]
        return dict(zip(keys, (p[0] for p in pairs), strict=True)), dict(
            zip(keys, (p[1] for p in pairs), strict=True)
        )
    if isinstance(decoded, list) and isinstance(written, list) and len(decoded) == len(written):
        pairs = [common_part(d, w) for d, w in zip(decoded, written, strict=True)]
        return [p[0] for p in pairs], [p[1] for p in pairs]
    return decoded, written


# ------------------------------------------------------------------------------- the committed


CASES = [
    pytest.param(version, name, id=f"v{version}-{name}")
    for version, records in sorted(codec.VERSIONS.items())
    for name in sorted(records)
]


def test_codec_loaded_every_committed_version() -> None:
    on_disk = committed_versions()
    assert on_disk, "no schemas/avro/v*/ directory"
    assert set(codec.VERSIONS) == set(on_disk)


def test_every_file_is_an_event_or_used_by_one() -> None:
    """So the per-record cases below exercise every committed record, shared types included."""
    for version, directory in committed_versions().items():
        canonical = " ".join(to_parsing_canonical_form(s) for s in codec.VERSIONS[version].values())
        for path in directory.glob("*.avsc"):
            raw = json.loads(path.read_text(encoding="utf-8"))
            if raw["name"] in EVENTS_BY_TYPE:
                assert raw["name"] in codec.VERSIONS[version]
            else:
                full = f"{raw.get('namespace', '')}.{raw['name']}".lstrip(".")
                assert f'"name":"{full}"' in canonical, f"v{version}: {full} is used by no event"


@pytest.mark.parametrize(("version", "event_type"), CASES)
def test_old_records_decode_into_the_current_model(version: int, event_type: str) -> None:
    writer_schema = dict(codec.VERSIONS[version][event_type])
    model = EVENTS_BY_TYPE[event_type]
    for k in range(max(2, variants_needed(writer_schema))):
        written = SampleBuilder(k).value(writer_schema, event_type)
        decoded = codec.decode(single_object(writer_schema, written))
        assert type(decoded) is model
        got, want = common_part(decoded.model_dump(), written)
        assert got == want, f"variant {k}"


# ------------------------------------------------- evolution, proven with synthetic versions


def _avsc(root: Path, version: int, name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((root / f"v{version}" / f"{name}.avsc").read_text())
    return data


def _write_avsc(root: Path, version: int, name: str, schema: dict[str, Any]) -> None:
    directory = root / f"v{version}"
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{name}.avsc").write_text(json.dumps(schema, indent=2))


@pytest.fixture
def root(tmp_path: Path) -> Path:
    shutil.copytree(AVRO_ROOT / "v1", tmp_path / "v1")
    return tmp_path


def test_v0_without_optional_fields_decodes_with_defaults(root: Path) -> None:
    """An older writer that lacked the optional fields: the current reader fills the defaults."""
    shutil.copytree(root / "v1", root / "v0")
    envelope = _avsc(root, 0, "Envelope")
    envelope["fields"] = [f for f in envelope["fields"] if f["name"] != "trace_id"]
    _write_avsc(root, 0, "Envelope", envelope)
    succeeded = _avsc(root, 0, "ToolCallSucceeded")
    succeeded["fields"] = [f for f in succeeded["fields"] if f["name"] != "downstream_request_id"]
    _write_avsc(root, 0, "ToolCallSucceeded", succeeded)

    c = codec.Codec(root)
    assert sorted(c.versions) == [0, 1]
    writer_schema = dict(c.versions[0]["ToolCallSucceeded"])
    assert c.fingerprint_of("ToolCallSucceeded") != bytes.fromhex(
        fingerprint(to_parsing_canonical_form(writer_schema), "CRC-64-AVRO")
    )
    written = SampleBuilder(1).value(writer_schema, "ToolCallSucceeded")
    decoded = c.decode(single_object(writer_schema, written))
    assert isinstance(decoded, ToolCallSucceeded)
    assert decoded.downstream_request_id is None
    assert decoded.envelope.trace_id is None
    assert decoded.result_json == written["result_json"]
    assert decoded.envelope.occurred_at == written["envelope"]["occurred_at"]
    # new bytes are written with the current (v1) schema
    assert c.encode(decoded)[2:10] == c.fingerprint_of("ToolCallSucceeded")
    assert c.decode(c.encode(decoded)) == decoded


class ToolCallSucceededV2(ToolCallSucceeded):
    """A stand-in for a future model with one more field."""

    retries_left: int = 3


def test_v2_overlay_adds_a_field_with_a_default(root: Path) -> None:
    """v2/ holds only the changed file; v1 bytes still decode, with the new field defaulted."""
    v1 = codec.Codec(root)  # the committed v1 alone
    succeeded = _avsc(root, 1, "ToolCallSucceeded")
    succeeded["fields"].append({"name": "retries_left", "type": "long", "default": 3})
    _write_avsc(root, 2, "ToolCallSucceeded", succeeded)

    models: dict[str, type[Event]] = {**EVENTS_BY_TYPE, "ToolCallSucceeded": ToolCallSucceededV2}
    c = codec.Codec(root, models)
    assert sorted(c.versions) == [1, 2]
    assert set(c.versions[2]) == set(EVENTS_BY_TYPE)  # the overlay keeps the unchanged records
    assert c.versions[2]["ToolCallRejected"] == c.versions[1]["ToolCallRejected"]

    v1_bytes = v1.encode(_sample_succeeded())  # written by a v1 codec
    decoded = c.decode(v1_bytes)
    assert isinstance(decoded, ToolCallSucceededV2)
    assert decoded.retries_left == 3
    assert decoded.result_json == _sample_succeeded().result_json

    v2_bytes = c.encode(decoded.model_copy(update={"retries_left": 1}))
    assert v2_bytes[2:10] != v1_bytes[2:10]
    again = c.decode(v2_bytes)
    assert isinstance(again, ToolCallSucceededV2)
    assert again.retries_left == 1
    with pytest.raises(codec.UnknownFingerprint):
        codec.decode(v2_bytes)  # today's codec has never seen v2


def test_incompatible_old_version_is_reported(root: Path) -> None:
    """A current field without a default that an old writer lacks cannot be resolved."""
    shutil.copytree(root / "v1", root / "v0")
    outcome = _avsc(root, 0, "ToolCallOutcomeUnknown")
    outcome["fields"] = [f for f in outcome["fields"] if f["name"] != "reason"]
    _write_avsc(root, 0, "ToolCallOutcomeUnknown", outcome)

    c = codec.Codec(root)
    writer_schema = dict(c.versions[0]["ToolCallOutcomeUnknown"])
    written = SampleBuilder(0).value(writer_schema, "ToolCallOutcomeUnknown")
    with pytest.raises(codec.IncompatibleSchema) as info:
        c.decode(single_object(writer_schema, written))
    assert info.value.version == 0
    assert info.value.event_type == "ToolCallOutcomeUnknown"


def test_malformed_schema_directory_fails_loudly(tmp_path: Path) -> None:
    with pytest.raises(codec.SchemaLoadError, match="no schema version"):
        codec.Codec(tmp_path)
    _write_avsc(tmp_path, 1, "Broken", {"type": "record", "name": "Other", "fields": []})
    with pytest.raises(codec.SchemaLoadError, match="name files"):
        codec.Codec(tmp_path)


def _sample_succeeded() -> ToolCallSucceeded:
    return ToolCallSucceeded(
        envelope=Envelope(
            event_id="e",
            call_key="c",
            tenant_id="t",
            tool="x",
            tool_version="1",
            idempotency_key="k",
            args_digest="sha256:00",
            intent_id="i",
            occurred_at=datetime(2024, 1, 1, tzinfo=UTC),
        ),
        attempt=1,
        result_json='{"ok":true}',
        duration_ms=5,
    )
