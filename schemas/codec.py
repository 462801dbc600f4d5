"""Events on the wire: Avro binary in the Avro single-object encoding
(docs/architecture.md#events-and-the-wire-format).

One encoded event is::

    C3 01 | CRC-64-AVRO fingerprint of the writer schema (8 bytes, little-endian) | Avro body

The fingerprint is taken over the Parsing Canonical Form of the *self-contained* record schema
(shared named types such as ``Envelope`` inlined at their first use), which is what the Avro
libraries of other languages compute for the same schema, so any consumer can decode the bytes.

Schemas live in ``schemas/avro/v<N>/<Name>.avsc`` (namespace ``toolledger.events``). Each
version directory is an overlay on the ones below it: ``v2/`` only needs the files that
changed, and a name it does not define resolves to the newest older definition. Everything is
parsed once, at import time. Every committed version stays decodable: the fingerprint picks
the writer schema of whichever version wrote the bytes, and the newest version of that record
is the reader schema (Avro schema resolution fills new fields from their defaults).

All failures on the decoding edge are :class:`CodecError` subclasses carrying data; the
fastavro, struct, EOF and pydantic exceptions underneath are chained, never leaked.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import Enum
from io import BytesIO
from pathlib import Path
from types import MappingProxyType
from typing import Any, Final

from fastavro import parse_schema, schemaless_reader, schemaless_writer
from fastavro.read import SchemaResolutionError
from fastavro.schema import fingerprint as _avro_fingerprint
from fastavro.schema import to_parsing_canonical_form
from pydantic import ValidationError

from toolledger.schemas.events import EVENTS_BY_TYPE, Event

__all__ = [
    "AVRO_ROOT",
    "FINGERPRINT_ALGORITHM",
    "MARKER",
    "PRIMITIVES",
    "SCHEMAS",
    "VERSIONS",
    "BadMarker",
    "Codec",
    "CodecError",
    "IncompatibleSchema",
    "InvalidEvent",
    "SchemaLoadError",
    "TruncatedOrCorrupt",
    "UnknownFingerprint",
    "decode",
    "encode",
    "event_to_json",
    "fingerprint_of",
    "named_types",
]

MARKER: Final = b"\xc3\x01"
"""The two bytes that open every single-object encoded datum."""
FINGERPRINT_ALGORITHM: Final = "CRC-64-AVRO"
HEADER_SIZE: Final = len(MARKER) + 8
AVRO_ROOT: Final = Path(__file__).resolve().parent / "avro"
"""Holds one ``v<N>`` directory per committed schema version."""

Schema = dict[str, Any]
"""A parsed (fastavro) record schema."""

PRIMITIVES: Final = frozenset(
    {"null", "boolean", "int", "long", "float", "double", "bytes", "string"}
)
_NAMED: Final = frozenset({"record", "error", "enum", "fixed"})
_VERSION_DIR: Final = re.compile(r"v(\d+)")
_TIMESTAMP_LOGICAL_TYPES: Final = frozenset({"timestamp-micros", "timestamp-millis"})


# --------------------------------------------------------------------------------------- errors


class CodecError(ValueError):
    """Bytes that are not an event of ours, or an event that cannot be put on the wire."""


class BadMarker(CodecError):
    """The data does not start with the single-object marker ``C3 01``."""

    def __init__(self, marker: bytes) -> None:
        self.marker = marker
        super().__init__(
            f"not Avro single-object encoded: expected marker c301, got {marker.hex() or 'nothing'}"
        )


class UnknownFingerprint(CodecError):
    """The schema fingerprint matches no committed schema version."""

    def __init__(self, fingerprint: str) -> None:
        self.fingerprint = fingerprint
        super().__init__(
            f"unknown schema fingerprint {fingerprint}: written with a schema that is not "
            f"committed under schemas/avro/v*/"
        )


class TruncatedOrCorrupt(CodecError):
    """The header is known but the body is cut short, malformed or followed by extra bytes."""

    def __init__(self, event_type: str | None, detail: str) -> None:
        self.event_type = event_type
        self.detail = detail
        what = f"{event_type} event" if event_type else "event"
        super().__init__(f"truncated or corrupt {what}: {detail}")


class InvalidEvent(CodecError):
    """The event's values cannot be encoded, or decoded values do not fit the model."""

    def __init__(self, event_type: str, detail: str) -> None:
        self.event_type = event_type
        self.detail = detail
        super().__init__(f"invalid {event_type} event: {detail}")


class IncompatibleSchema(CodecError):
    """Bytes written with an old schema version that the current schema cannot resolve."""

    def __init__(self, event_type: str, version: int, detail: str) -> None:
        self.event_type = event_type
        self.version = version
        self.detail = detail
        super().__init__(
            f"{event_type} written with schema v{version} cannot be read with the current "
            f"schema: {detail}"
        )


class SchemaLoadError(RuntimeError):
    """The committed ``.avsc`` files are malformed or inconsistent (a bug, found at import)."""


# ------------------------------------------------------------------------------ schema loading

_Path = tuple[str, ...]
"""A path to a value inside a record dict; ``"*"`` steps into every item of a list."""


@dataclass(frozen=True, slots=True)
class _EventCodec:
    """How one event type is encoded: its current schema, its single-object header, and
    where its datetimes are."""

    event_type: str
    schema: Schema
    header: bytes
    datetime_paths: tuple[_Path, ...]


@dataclass(frozen=True, slots=True)
class _Reader:
    event_type: str
    version: int
    model: type[Event]
    writer_schema: Schema
    reader_schema: Schema | None  # None when the writer schema is the current one


def _fullname(name: str, namespace: str) -> str:
    return name if "." in name or not namespace else f"{namespace}.{name}"


def _inline(node: Any, namespace: str, library: Mapping[str, Any], defined: set[str]) -> Any:
    """Return ``node`` with named types from ``library`` inlined at their first use.

    The result is a self-contained schema, as the Avro spec wants for the Parsing Canonical
    Form: each named type is defined once, where it first occurs, and referenced by full name
    after that.
    """
    if isinstance(node, str):
        if node in PRIMITIVES:
            return node
        full = _fullname(node, namespace)
        if full in defined:
            return full
        if full not in library:
            raise SchemaLoadError(f"unknown named type {full!r}")
        return _inline(library[full], "", library, defined)
    if isinstance(node, list):
        return [_inline(branch, namespace, library, defined) for branch in node]
    if not isinstance(node, dict):
        raise SchemaLoadError(f"not a schema: {node!r}")
    out = dict(node)
    kind = node.get("type")
    if kind in _NAMED:
        full = _fullname(node["name"], node.get("namespace", namespace))
        if full in defined:
            raise SchemaLoadError(f"named type {full!r} is defined twice")
        defined.add(full)
        inner_ns = full.rpartition(".")[0]
        out["name"] = full.rpartition(".")[2]
        out["namespace"] = inner_ns
        if kind in ("record", "error"):
            out["fields"] = [
                {**field, "type": _inline(field["type"], inner_ns, library, defined)}
                for field in node.get("fields", [])
            ]
    elif kind == "array":
        out["items"] = _inline(node["items"], namespace, library, defined)
    elif kind == "map":
        out["values"] = _inline(node["values"], namespace, library, defined)
    elif not (isinstance(kind, str) and kind in PRIMITIVES):
        out["type"] = _inline(kind, namespace, library, defined)
    return out


def _datetime_paths(node: Any) -> Iterator[_Path]:
    """Paths of the timestamp values in records of this (parsed, self-contained) schema."""
    named: dict[str, Any] = {}
    walking: set[str] = set()  # records being walked: a recursive reference stops there

    def walk(node: Any, prefix: _Path) -> Iterator[_Path]:
        if isinstance(node, list):
            for branch in node:
                yield from walk(branch, prefix)
        elif isinstance(node, str):
            if node in named and node not in walking:  # a named type used again
                yield from walk(named[node], prefix)
        elif isinstance(node, dict):
            kind = node.get("type")
            if node.get("logicalType") in _TIMESTAMP_LOGICAL_TYPES:
                yield prefix
            elif kind in ("record", "error"):
                named[node["name"]] = node
                walking.add(node["name"])
                for field in node["fields"]:
                    yield from walk(field["type"], (*prefix, field["name"]))
                walking.discard(node["name"])
            elif kind == "array":
                yield from walk(node["items"], (*prefix, "*"))
            elif kind == "map" and any(walk(node["values"], ())):
                raise SchemaLoadError("timestamps inside maps are not supported by the codec")

    return walk(node, ())


def _fingerprint(schema: Schema) -> bytes:
    # fastavro gives the hex of the little-endian bytes, as Java does and the spec requires.
    return bytes.fromhex(
        _avro_fingerprint(to_parsing_canonical_form(schema), FINGERPRINT_ALGORITHM)
    )


def _load_version_dir(directory: Path, library: dict[str, Any]) -> None:
    """Add the files of ``directory`` to ``library`` (full name -> raw JSON), overriding."""
    for path in sorted(directory.glob("*.avsc")):
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise SchemaLoadError(f"{path}: cannot read the schema: {exc}") from exc
        if not isinstance(raw, dict) or raw.get("type") not in _NAMED:
            raise SchemaLoadError(f"{path}: a file must hold one named type (record or enum)")
        full = _fullname(raw["name"], raw.get("namespace", ""))
        if full.rpartition(".")[2] != path.stem:
            raise SchemaLoadError(f"{path}: the file defines {full!r}; name files <Name>.avsc")
        library[full] = raw


def _version_dirs(root: Path) -> list[tuple[int, Path]]:
    dirs = sorted(
        (int(match.group(1)), path)
        for path in root.iterdir()
        if path.is_dir() and (match := _VERSION_DIR.fullmatch(path.name))
    )
    if not dirs:
        raise SchemaLoadError(f"no schema version directories (v1, v2, ...) under {root}")
    return dirs


def named_types(version: int, root: Path = AVRO_ROOT) -> dict[str, Any]:
    """Full name -> the committed JSON of every named type of ``version`` (records and
    enums, each as its file holds it: other named types referenced by full name), the
    overlays of the versions below it resolved."""
    library: dict[str, Any] = {}
    for number, directory in _version_dirs(root):
        if number <= version:
            _load_version_dir(directory, library)
    return library


def _load(root: Path) -> dict[int, dict[str, Schema]]:
    """Every version under ``root``: version -> short record name -> self-contained schema."""
    versions: dict[int, dict[str, Schema]] = {}
    library: dict[str, Any] = {}  # the overlay: the newest definition of each name so far
    for version, directory in _version_dirs(root):
        _load_version_dir(directory, library)
        records: dict[str, Schema] = {}
        for full, raw in library.items():
            try:
                standalone = _inline(copy.deepcopy(raw), "", library, set())
                parsed = parse_schema(standalone, {})
            except SchemaLoadError as exc:
                raise SchemaLoadError(f"v{version} {full}: {exc}") from exc
            except Exception as exc:  # fastavro's SchemaParseException, UnknownType, ...
                raise SchemaLoadError(f"v{version} {full}: invalid Avro schema: {exc}") from exc
            if not isinstance(parsed, dict):  # cannot happen: _load_version_dir checked the type
                raise SchemaLoadError(f"v{version} {full}: not a named type")
            name = full.rpartition(".")[2]
            if name in records:
                raise SchemaLoadError(f"v{version}: two records are named {name!r}")
            records[name] = parsed
        versions[version] = records
    return versions


# ------------------------------------------------------------------------------------ the codec


class Codec:
    """Encoder and decoder for the events, over the schema versions under one root directory.

    The module-level functions use the instance for ``schemas/avro``; tests build others.
    """

    def __init__(
        self, root: Path = AVRO_ROOT, models: Mapping[str, type[Event]] = EVENTS_BY_TYPE
    ) -> None:
        versions = _load(root)
        newest = max(versions)
        current = {name: s for name, s in versions[newest].items() if name in models}
        self.versions: Mapping[int, Mapping[str, Schema]] = MappingProxyType(
            {
                v: MappingProxyType({n: s for n, s in recs.items() if n in models})
                for v, recs in versions.items()
            }
        )
        """Version -> event type -> that version's parsed schema (overlays resolved)."""
        self.schemas: Mapping[str, Schema] = MappingProxyType(current)
        """Event type -> current parsed schema (the newest version)."""

        self._writers: dict[str, _EventCodec] = {
            name: _EventCodec(
                event_type=name,
                schema=schema,
                header=MARKER + _fingerprint(schema),
                datetime_paths=tuple(_datetime_paths(schema)),
            )
            for name, schema in current.items()
        }
        self._readers: dict[bytes, _Reader] = {}
        for version in sorted(versions, reverse=True):  # newest first: it wins a tie
            for name, schema in self.versions[version].items():
                fingerprint = _fingerprint(schema)
                if fingerprint in self._readers:
                    continue
                reader_schema = current[name]
                self._readers[fingerprint] = _Reader(
                    event_type=name,
                    version=version,
                    model=models[name],
                    writer_schema=schema,
                    reader_schema=None if schema is reader_schema else reader_schema,
                )

    def fingerprint_of(self, event_type: str) -> bytes:
        """The 8-byte fingerprint of ``event_type``'s current schema, as in the header."""
        writer = self._writers.get(event_type)
        if writer is None:
            raise CodecError(f"no Avro schema for event type {event_type!r}")
        return writer.header[len(MARKER) :]

    def encode(self, event: Event) -> bytes:
        """The single-object encoding of ``event`` with its current schema."""
        event_type = type(event).TYPE
        writer = self._writers.get(event_type)
        if writer is None:
            raise CodecError(f"no Avro schema for event type {event_type!r}")
        record = event.model_dump()
        for path in writer.datetime_paths:
            _check_aware(record, path, event_type)
        out = BytesIO()
        out.write(writer.header)
        try:
            schemaless_writer(out, writer.schema, record)
        except (ValueError, TypeError, OverflowError, KeyError, AttributeError) as exc:
            # e.g. an int outside the 64-bit range, a lone surrogate in a string
            raise InvalidEvent(event_type, f"{type(exc).__name__}: {exc}") from exc
        return out.getvalue()

    def decode(self, data: bytes | bytearray | memoryview) -> Event:
        """The event encoded in ``data``, as its current model (old schema versions resolved)."""
        if not isinstance(data, bytes | bytearray | memoryview):
            raise TypeError(f"decode() wants bytes, got {type(data).__name__}")
        size = len(data)
        if data[:2] != MARKER:
            raise BadMarker(bytes(data[:2]))
        if size < HEADER_SIZE:
            raise TruncatedOrCorrupt(
                None, f"the header is {size} bytes, a single-object header has {HEADER_SIZE}"
            )
        fingerprint = bytes(data[2:HEADER_SIZE])
        reader = self._readers.get(fingerprint)
        if reader is None:
            raise UnknownFingerprint(fingerprint.hex())
        buf = BytesIO(data)
        buf.seek(HEADER_SIZE)
        try:
            record = schemaless_reader(buf, reader.writer_schema, reader.reader_schema)
        except SchemaResolutionError as exc:
            raise IncompatibleSchema(reader.event_type, reader.version, str(exc)) from exc
        except Exception as exc:  # EOFError, UnicodeDecodeError, IndexError, OverflowError, ...
            detail = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            raise TruncatedOrCorrupt(reader.event_type, detail) from exc
        end = buf.tell()
        if end != size:
            raise TruncatedOrCorrupt(
                reader.event_type, f"{size - end} trailing bytes after the Avro body"
            )
        try:
            return reader.model.model_validate(record)
        except ValidationError as exc:
            raise InvalidEvent(reader.event_type, str(exc)) from exc


def _check_aware(record: Any, path: _Path, event_type: str, done: _Path = ()) -> None:
    """Raise :class:`InvalidEvent` if the datetime at ``path`` is naive."""
    value = record
    for i, step in enumerate(path):
        if value is None:
            return
        if step == "*":
            for item in value:
                _check_aware(item, path[i + 1 :], event_type, (*done, *path[:i], "*"))
            return
        value = value[step]
    if not isinstance(value, datetime):
        return
    where = ".".join((*done, *path))
    if value.utcoffset() is None:
        raise InvalidEvent(
            event_type,
            f"{where} is a naive datetime ({value.isoformat()}); "
            f"event times must be timezone-aware, in UTC",
        )
    if value.year in (1, 9999):  # the only years where the UTC instant may not be a datetime
        try:
            value.astimezone(UTC)
        except OverflowError as exc:
            raise InvalidEvent(event_type, f"{where} is out of range in UTC") from exc


# ------------------------------------------------------------------------------------ JSON view


def _jsonable(value: Any, where: str) -> Any:
    if isinstance(value, datetime):
        if value.utcoffset() is None:
            raise InvalidEvent(where.partition(".")[0], f"{where} is a naive datetime")
        text = value.astimezone(UTC).replace(tzinfo=None).isoformat(timespec="microseconds")
        return text + "Z"
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, dict):
        return {k: _jsonable(v, f"{where}.{k}") for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v, f"{where}[{i}]") for i, v in enumerate(value)]
    return value


def event_to_json(event: Event) -> dict[str, Any]:
    """A JSON-ready dict of ``event``: ``{"type": TYPE, "envelope": {...}, <payload>}``.

    Datetimes become ISO 8601 in UTC with microseconds and a ``Z`` suffix
    (``2024-05-01T12:00:00.000000Z``), enums their string values.
    """
    event_type = type(event).TYPE
    body = _jsonable(event.model_dump(), event_type)
    return {"type": event_type, **body}


# ---------------------------------------------------------------------- the committed schemas

_CODEC: Final = Codec()

SCHEMAS: Final[Mapping[str, Schema]] = _CODEC.schemas
"""Event type -> its current parsed fastavro schema (self-contained)."""
VERSIONS: Final[Mapping[int, Mapping[str, Schema]]] = _CODEC.versions
"""Committed version -> event type -> that version's parsed schema."""


def encode(event: Event) -> bytes:
    """``C3 01`` + 8-byte CRC-64-AVRO fingerprint (little-endian) + Avro binary body.

    Raises :class:`InvalidEvent` for values Avro cannot carry (naive datetimes, ints beyond
    64 bits, lone surrogates) and :class:`CodecError` for an event type without a schema.
    """
    return _CODEC.encode(event)


def decode(data: bytes | bytearray | memoryview) -> Event:
    """The event in ``data`` (any committed schema version) as its current pydantic model.

    Raises :class:`BadMarker`, :class:`UnknownFingerprint`, :class:`TruncatedOrCorrupt`
    (also for trailing bytes), :class:`IncompatibleSchema` or :class:`InvalidEvent`, all
    :class:`CodecError` (a ``ValueError``).
    """
    return _CODEC.decode(data)


def fingerprint_of(event_type: str) -> bytes:
    """The 8-byte (little-endian) fingerprint of ``event_type``'s current schema."""
    return _CODEC.fingerprint_of(event_type)
