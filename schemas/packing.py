"""Small records packed with a preset dictionary: DEFLATE (RFC 1951) with zlib's ``zdict``.

A call state or an event is a few hundred bytes, too few for a compressor to learn from: on
its own DEFLATE saves a fifth of one. Most of a record is what every record repeats (field
names, schema fingerprints, ``sha256:``, event id suffixes, timestamps' leading digits), so a
preset dictionary holding one record of each kind gives that to the compressor up front: at
200-byte arguments an event keeps about two thirds of its bytes and a call state a quarter.

A packed value is :data:`MARK`, a dictionary id, then raw DEFLATE. No stored value starts
with ``MARK``: a JSON text starts with ``{`` and an Avro single-object record with
``0xC3 0x01``, so a value stored before packing reads as it was. A dictionary never changes
once values were packed with it (they could not be read back): a new dictionary gets a new id
and the old one stays, to read what it packed.

The dictionaries are neutral records (tenant ``acme``, tool ``create_ticket``), not those of
any benchmark, so a benchmark's own names are never given to it for free.
"""

from __future__ import annotations

import base64
import zlib
from typing import Final

__all__ = ["EVENTS", "MARK", "STATES", "Packer", "unpack"]

MARK: Final = 0x00
_WBITS: Final = -12  # raw DEFLATE, a 4 KiB window: a dictionary and a record fit in it
_MEM_LEVEL: Final = 4
_LEVEL: Final = 1  # the fastest: the dictionary does most of the work


class Packer:
    """Packs values with one dictionary (``ident``: its id byte, never reused)."""

    def __init__(self, ident: int, dictionary: bytes) -> None:
        self.ident = ident
        self.dictionary = dictionary
        self._header = bytes((MARK, ident))

    def pack(self, raw: bytes) -> bytes:
        packer = zlib.compressobj(
            _LEVEL, zlib.DEFLATED, _WBITS, _MEM_LEVEL, zlib.Z_DEFAULT_STRATEGY, self.dictionary
        )
        return self._header + packer.compress(raw) + packer.flush()

    def unpack(self, packed: bytes) -> bytes:
        unpacker = zlib.decompressobj(_WBITS, self.dictionary)
        raw = unpacker.decompress(packed[2:]) + unpacker.flush()
        if not unpacker.eof:
            raise ValueError("a packed value is truncated")
        return raw


# A Requested, a Started, a Failed and a Succeeded event of one call, as schemas.codec encoded
# them (schema version 1). Frozen: see the module's docstring.
_EVENT_DICTIONARY: Final = base64.b64decode(
    "wwFDqj7urlg+4lg1YTFjM2U3ZjliMmQ0ZjZhOGMwZTJhNGM2ZThmMGIxZC9yZXF1ZXN0ZWQvMXZbImFjbWUiLCJj"
    "cmVhdGVfdGlja2V0IiwiMGY4ZTRjMmE5YjdkNGUxZjhhNmMzYjVkN2U5ZjFhMmIiXQhhY21lGmNyZWF0ZV90aWNr"
    "ZXQCMUAwZjhlNGMyYTliN2Q0ZTFmOGE2YzNiNWQ3ZTlmMWEyYo4Bc2hhMjU2OjlmODZkMDgxODg0YzdkNjU5YTJm"
    "ZWFhMGM1NWFkMDE1YTNiZjRmMWIyYjBiODIyY2QxNWQ2YzE1YjBmMDBhMDhANWExYzNlN2Y5YjJkNGY2YThjMGUy"
    "YTRjNmU4ZjBiMWQAAAIgdXNlckBleGFtcGxlLmNvbYDJ7tDK1KMGAgByeyJ0aXRsZSI6IlByaW50ZXIgb24gZmly"
    "ZSIsImJvZHkiOiIiLCJwcmlvcml0eSI6Im5vcm1hbCJ9AhR0b29sczpjYWxsAADDAdFTKHXL7nG7VDVhMWMzZTdm"
    "OWIyZDRmNmE4YzBlMmE0YzZlOGYwYjFkL3N0YXJ0ZWQvMXZbImFjbWUiLCJjcmVhdGVfdGlja2V0IiwiMGY4ZTRj"
    "MmE5YjdkNGUxZjhhNmMzYjVkN2U5ZjFhMmIiXQhhY21lGmNyZWF0ZV90aWNrZXQCMUAwZjhlNGMyYTliN2Q0ZTFm"
    "OGE2YzNiNWQ3ZTlmMWEyYo4Bc2hhMjU2OjlmODZkMDgxODg0YzdkNjU5YTJmZWFhMGM1NWFkMDE1YTNiZjRmMWIy"
    "YjBiODIyY2QxNWQ2YzE1YjBmMDBhMDhANWExYzNlN2Y5YjJkNGY2YThjMGUyYTRjNmU4ZjBiMWQAAAIgdXNlckBl"
    "eGFtcGxlLmNvbYDJ7tDK1KMGAgACAgJyeyJ0aXRsZSI6IlByaW50ZXIgb24gZmlyZSIsImJvZHkiOiIiLCJwcmlv"
    "cml0eSI6Im5vcm1hbCJ9wwFydsHfplp1AlI1YTFjM2U3ZjliMmQ0ZjZhOGMwZTJhNGM2ZThmMGIxZC9mYWlsZWQv"
    "MXZbImFjbWUiLCJjcmVhdGVfdGlja2V0IiwiMGY4ZTRjMmE5YjdkNGUxZjhhNmMzYjVkN2U5ZjFhMmIiXQhhY21l"
    "GmNyZWF0ZV90aWNrZXQCMUAwZjhlNGMyYTliN2Q0ZTFmOGE2YzNiNWQ3ZTlmMWEyYo4Bc2hhMjU2OjlmODZkMDgx"
    "ODg0YzdkNjU5YTJmZWFhMGM1NWFkMDE1YTNiZjRmMWIyYjBiODIyY2QxNWQ2YzE1YjBmMDBhMDhANWExYzNlN2Y5"
    "YjJkNGY2YThjMGUyYTRjNmU4ZjBiMWQAAAIgdXNlckBleGFtcGxlLmNvbYDJ7tDK1KMGAgACLERPV05TVFJFQU1f"
    "VU5BVkFJTEFCTEU6dGhlIGRvd25zdHJlYW0gZGlkIG5vdCBhbnN3ZXIBLnJldHJ5IHdpdGggdGhlIHNhbWUga2V5"
    "AI4Bc2hhMjU2OjRiMjI3Nzc3ZDRkZDFmYzYxYzZmODg0ZjQ4NjQxZDAyYjRkMTIxZDNmZDMyOGNiMDhiNTUzMWZj"
    "YWNkYWJmOGEYwwEVJNUwb4AQtlg1YTFjM2U3ZjliMmQ0ZjZhOGMwZTJhNGM2ZThmMGIxZC9zdWNjZWVkZWQvMnZb"
    "ImFjbWUiLCJjcmVhdGVfdGlja2V0IiwiMGY4ZTRjMmE5YjdkNGUxZjhhNmMzYjVkN2U5ZjFhMmIiXQhhY21lGmNy"
    "ZWF0ZV90aWNrZXQCMUAwZjhlNGMyYTliN2Q0ZTFmOGE2YzNiNWQ3ZTlmMWEyYo4Bc2hhMjU2OjlmODZkMDgxODg0"
    "YzdkNjU5YTJmZWFhMGM1NWFkMDE1YTNiZjRmMWIyYjBiODIyY2QxNWQ2YzE1YjBmMDBhMDhANWExYzNlN2Y5YjJk"
    "NGY2YThjMGUyYTRjNmU4ZjBiMWQAAAIgdXNlckBleGFtcGxlLmNvbYDJ7tDK1KMGAgAEMnsib2siOnRydWUsImlk"
    "IjoiVC0xMDQyIn0ADg=="
)
# A call state's JSON (processors.ledger.CallState). Frozen: see the module's docstring.
_STATE_DICTIONARY: Final = (
    b'{"status":"SUCCEEDED","context":{"call_key":"[\\"acme\\",\\"create_ticket\\",\\"0f8e4'
    b'c2a9b7d4e1f8a6c3b5d7e9f1a2b\\"]","tenant_id":"acme","tool":"create_ticket","tool_'
    b'version":"1","idempotency_key":"0f8e4c2a9b7d4e1f8a6c3b5d7e9f1a2b","args_digest":'
    b'"sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08","inten'
    b't_id":"5a1c3e7f9b2d4f6a8c0e2a4c6e8f0b1d","run_id":null,"step_id":null,"principal'
    b'":"user@example.com","trace_id":null},"first_intent_id":"5a1c3e7f9b2d4f6a8c0e2a4'
    b'c6e8f0b1d","attempts":2,"rounds":1,"round_attempts":2,"reconcile_attempts":0,"re'
    b'sult_json":"{\\"ok\\":true,\\"id\\":\\"T-'
    b'1042\\"}","error":null,"job":null,"job_updates":0,"created_at":"2026-01-'
    b'01T12:00:00.123456Z","updated_at":"2026-01-'
    b'01T12:00:00.123456Z","last_event_id":"5a1c3e7f9b2d4f6a8c0e2a4c6e8f0b1d/succeeded'
    b'/2"}'
)

EVENTS: Final = Packer(1, _EVENT_DICTIONARY)
STATES: Final = Packer(2, _STATE_DICTIONARY)
_BY_ID: Final = {p.ident: p for p in (EVENTS, STATES)}


def unpack(value: bytes) -> bytes:
    """The raw bytes of a stored value: unpacked if it was packed, else as it is."""
    if not value or value[0] != MARK:
        return value
    packer = _BY_ID.get(value[1]) if len(value) > 1 else None
    if packer is None:
        raise ValueError(f"a packed value names dictionary {value[1:2].hex()}, not known here")
    return packer.unpack(value)
