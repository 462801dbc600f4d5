"""Call keys, their scope, idempotency-key syntax and Kafka-compatible partitioning.

A call key is the unit of at-most-once: ``(tenant_id, tool, idempotency_key)``, and the
principal too where the key's scope is ``tenant+principal`` (:class:`KeyScope`). Its bytes are
the canonical JSON array of its parts (three, or four with the principal: unambiguous whatever
characters the parts hold), and they are both the Kafka message key and the input of the
partitioner, so one call key lives in one partition number of every co-partitioned topic, in
Kafka and in the embedded log.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import struct
from dataclasses import dataclass
from enum import StrEnum
from functools import lru_cache

MAX_KEY_LENGTH = 255


class InvalidIdempotencyKey(ValueError):
    pass


_PRINTABLE_KEY = re.compile(r"[\x20-\x7e]{1,255}")
_JSON_PLAIN = re.compile(r'[^"\\\x00-\x1f\x7f-\U0010ffff]*')  # written by JSON as it is


def check_idempotency_key(key: str) -> str:
    """Return ``key`` if it is 1..255 printable ASCII characters (0x20-0x7E), else raise."""
    if _PRINTABLE_KEY.fullmatch(key):
        return key
    if not key:
        raise InvalidIdempotencyKey("the idempotency key is empty")
    if len(key) > MAX_KEY_LENGTH:
        raise InvalidIdempotencyKey(
            f"the idempotency key has {len(key)} characters; at most {MAX_KEY_LENGTH} are allowed"
        )
    for index, char in enumerate(key):
        if not 0x20 <= ord(char) <= 0x7E:
            raise InvalidIdempotencyKey(
                "the idempotency key has a non-printable or non-ASCII character "
                f"at position {index}"
            )
    return key


def derive_idempotency_key(run_id: str, step_id: str) -> str:
    """A key that names the *intent* (this step of this run), not the transport attempt.

    Retries of the same step produce the same key; the provider's tool-call id does not enter.
    """
    if not run_id or not step_id:
        raise InvalidIdempotencyKey("run_id and step_id must both be non-empty")
    readable = f"{run_id}:{step_id}"
    # readable only when unambiguous: the run id has no ':' (the first ':' separates the two)
    if ":" not in run_id and len(readable) <= 200 and all(0x21 <= ord(c) <= 0x7E for c in readable):
        return "step:" + readable
    digest = hashlib.sha256(json.dumps([run_id, step_id]).encode("utf-8")).hexdigest()
    return "step-sha256:" + digest


class KeyScope(StrEnum):
    """Whose keys a key names a call among: the tenant's (any of its principals sending the
    key and arguments gets the one call's outcome) or each principal's own (the same key from
    another principal of the tenant is another call)."""

    TENANT = "tenant"
    TENANT_PRINCIPAL = "tenant+principal"

    @classmethod
    def parse(cls, text: str) -> KeyScope:
        """The scope named ``text``; ``ValueError`` naming the two there are."""
        try:
            return cls(text)
        except ValueError:
            names = " or ".join(repr(s.value) for s in cls)
            raise ValueError(f"the key scope {text!r} is not one there is: {names}") from None


DEFAULT_KEY_SCOPE = KeyScope.TENANT_PRINCIPAL  # what a new ledger scopes keys by


@dataclass(frozen=True, slots=True)
class CallKey:
    tenant_id: str
    tool: str
    idempotency_key: str
    principal: str | None = None  # whose key it is, under ``tenant+principal``; None: tenant's

    @classmethod
    def scoped(
        cls, scope: KeyScope, tenant_id: str, principal: str, tool: str, idempotency_key: str
    ) -> CallKey:
        """The call key of ``principal``'s call under ``scope``."""
        mine = principal if scope is KeyScope.TENANT_PRINCIPAL else None
        return cls(tenant_id, tool, idempotency_key, mine)

    @property
    def scope(self) -> KeyScope:
        return KeyScope.TENANT if self.principal is None else KeyScope.TENANT_PRINCIPAL

    def encode(self) -> bytes:
        return str(self).encode("utf-8")

    def __str__(self) -> str:
        parts: tuple[str, ...] = (self.tenant_id, self.tool, self.idempotency_key)
        if self.principal is not None:
            parts += (self.principal,)
        if all(_JSON_PLAIN.fullmatch(part) for part in parts):  # JSON writes them as they are
            return '["' + '","'.join(parts) + '"]'
        return json.dumps(list(parts), ensure_ascii=False, separators=(",", ":"))

    @classmethod
    def parse(cls, text: str) -> CallKey:
        """The call key ``str(key)`` wrote; ``ValueError`` for any other text."""
        try:
            parts = json.loads(text)
        except ValueError:
            parts = None
        if not (
            isinstance(parts, list)
            and len(parts) in (3, 4)
            and all(isinstance(p, str) for p in parts)
        ):
            raise ValueError(f"not a call key: {text!r}")
        return cls(*parts)

    def names(self, tenant_id: str, tool: str, idempotency_key: str) -> bool:
        """Whether this key is of the call ``(tenant_id, tool, idempotency_key)``: in either
        scope, of whichever principal (an operator's decision or a job's report is sent by
        another principal than the call's)."""
        return (self.tenant_id, self.tool, self.idempotency_key) == (
            tenant_id,
            tool,
            idempotency_key,
        )

    def sent_by(
        self, tenant_id: str, tool: str, idempotency_key: str, principal: str | None
    ) -> bool:
        """Whether this is the key of the caller who sent a record of ``(tenant_id, tool,
        idempotency_key)`` as ``principal`` (an intent, a front door's refusal): the same
        parts and, if the key names a principal, the sender's."""
        return self.names(tenant_id, tool, idempotency_key) and self.principal in (
            None,
            principal,
        )

    def visible_to(self, principal: str) -> bool:
        """Whether ``principal`` (of the key's tenant) may read the call: every principal may
        a tenant-scoped call, only its own principal a principal-scoped one."""
        return self.principal is None or self.principal == principal

    @property
    def call_id(self) -> str:
        """Stable public id of the call: the same on every backend and after every replay."""
        return call_id_of(str(self))


def call_key_of(text: str) -> CallKey | None:
    """The call key ``text`` is written as (``str(key)``, its one written form), else None: a
    key written any other way would name the call's state under another text."""
    try:
        key = CallKey.parse(text)
    except ValueError:
        return None
    return key if str(key) == text else None


def murmur2(data: bytes) -> int:
    """Kafka's ``Utils.murmur2`` (signed 32-bit result, as Java returns it)."""
    length = len(data)
    m = 0x5BD1E995
    h = (0x9747B28C ^ length) & 0xFFFFFFFF
    tail = length & ~3
    for k in struct.unpack_from(f"<{length >> 2}I", data):  # the 4-byte words, little-endian
        k = (k * m) & 0xFFFFFFFF
        k ^= k >> 24
        h = ((h * m) & 0xFFFFFFFF) ^ ((k * m) & 0xFFFFFFFF)
    extra = length & 3
    if extra == 3:
        h ^= data[tail + 2] << 16
    if extra >= 2:
        h ^= data[tail + 1] << 8
    if extra >= 1:
        h ^= data[tail]
        h = (h * m) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * m) & 0xFFFFFFFF
    h ^= h >> 15
    return h - 0x100000000 if h & 0x80000000 else h


def partition_for(key_bytes: bytes, partitions: int) -> int:
    """Kafka's default partitioner for keyed records: ``toPositive(murmur2(key)) % n``."""
    if partitions < 1:
        raise ValueError("partitions must be >= 1")
    return (murmur2(key_bytes) & 0x7FFFFFFF) % partitions


@lru_cache(maxsize=65536)
def call_id_for(call_key: str, idempotency_key: str, intent_id: str) -> str:
    """The public id of a call: a keyed call's names its key (every intent with the key is the
    same call); an unkeyed (read-only) call's names its intent, so each read is a call of its
    own that can be looked up by its id."""
    if idempotency_key:
        return call_id_of(call_key)
    return call_id_of(f"{call_key}#{intent_id}")


def call_id_of(call_key: str) -> str:
    """The call id of an encoded call key (cached: it is asked for several times per call)."""
    return "call_" + hashlib.sha256(call_key.encode("utf-8")).hexdigest()[:32]


_POOL_BYTES = 4096
_pool: list[bytes] = []


def random_id() -> str:
    """128 random bits (from the OS's CSPRNG) as 32 hex digits: an intent's id. Read from the
    OS 256 ids at a time (one system call instead of one per call); a forked process starts
    with an empty pool, so parent and child never share an id."""
    if not _pool:
        raw = os.urandom(_POOL_BYTES)
        _pool.extend(raw[i : i + 16] for i in range(0, _POOL_BYTES, 16))
    return _pool.pop().hex()


os.register_at_fork(after_in_child=_pool.clear)
