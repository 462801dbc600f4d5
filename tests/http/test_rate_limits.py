"""Rate limits over real HTTP: token buckets per (tenant, tool) and per tenant, from a policy
file; ``429 RATE_LIMITED`` with ``Retry-After`` and ``retryable: true``, never stored (the key
stays unused and the same call executes once the bucket has refilled). Every request that
reaches the limiter takes a token, replays included; requests refused before it take none.

The bucket arithmetic (refill, rounding of ``Retry-After``, all-or-none across buckets, the
policy's precedence and errors) is tested in-process with an injected clock.
"""

from __future__ import annotations

import asyncio
import json
import math
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.http.helpers import assert_call, assert_problem, post_call
from tests.http.servers import Server
from tests.http.test_jwt import (
    AUDIENCE,
    ISSUER,
    Keys,
    bearer,
    claims_for,
    full_log,
    log_entries,
    metric,
    new_keys,
    sign,
    start_guarded,
)
from toolledger.config import ToolSource
from toolledger.producers.http.ratelimit import (
    PRUNE_EVERY,
    PolicyError,
    RateLimiter,
    RatePolicy,
    Refusal,
)
from toolledger.serve import rate_limiter

TOOL_RATE = 0.5  # create_ticket: 2 calls, then one every 2 s, per tenant
TENANT_RATE = 0.5  # every tool together: 4 calls, then one every 2 s, per tenant
POLICY = {
    "rate_limits": {
        "tenant": {"rate": TENANT_RATE, "burst": 4},
        "tools": {"create_ticket": {"per_tenant": {"rate": TOOL_RATE, "burst": 2}}},
    },
    "approvals": {"ignored": "other sections belong to other parts of the policy"},
}


@pytest.fixture(scope="module")
def keys() -> Keys:
    return new_keys()


@pytest.fixture(scope="module")
def limited_server(keys: Keys, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    workdir = tmp_path_factory.mktemp("http-rate")
    jwks = workdir / "jwks.json"
    jwks.write_text(json.dumps(keys.jwks()))
    policy = workdir / "policy.json"
    policy.write_text(json.dumps(POLICY))
    running = start_guarded(workdir, jwks=jwks, issuer=ISSUER, audience=AUDIENCE, policy=policy)
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture
def tenant() -> str:
    """A tenant of its own per test: its buckets start full."""
    return f"rl-{uuid.uuid4().hex[:10]}"


@pytest.fixture
async def client(
    limited_server: Server, keys: Keys, tenant: str
) -> AsyncIterator[httpx.AsyncClient]:
    headers = bearer(sign(keys, claims_for(tenant)))
    async with httpx.AsyncClient(
        base_url=limited_server.base_url, headers=headers, timeout=60
    ) as http:
        yield http


def new_key() -> str:
    return f"rl-{uuid.uuid4().hex}"


def assert_rate_limited(response: httpx.Response) -> int:
    """A 429 problem with an integer Retry-After; returns it."""
    problem = assert_problem(response, 429, "RATE_LIMITED")
    assert problem["retryable"] is True
    retry_after = response.headers["retry-after"]
    assert retry_after.isdigit(), retry_after
    seconds = int(retry_after)
    assert 1 <= seconds <= math.ceil(1 / min(TOOL_RATE, TENANT_RATE))
    assert f"Retry in {seconds} s" in problem["detail"]
    return seconds


async def create(client: httpx.AsyncClient, key: str) -> httpx.Response:
    return await post_call(client, "create_ticket", {"title": "limited"}, key=key)


async def test_a_burst_past_the_limit_is_429_and_the_key_stays_unused(
    limited_server: Server, client: httpx.AsyncClient, tenant: str
) -> None:
    first, second, refused = new_key(), new_key(), new_key()
    assert_call(await create(client, first), "SUCCEEDED", replayed=False)
    assert_call(await create(client, second), "SUCCEEDED", replayed=False)
    response = await create(client, refused)
    retry_after = assert_rate_limited(response)
    assert "create_ticket" in response.json()["detail"]
    # never stored: no effect, no call, no event
    assert limited_server.effects_with_key(refused) == 0
    found = await client.get("/v1/calls", params={"idempotency_key": refused})
    assert found.status_code == 200 and found.json()["items"] == []
    # the same call after the window executes (it is not a replay of a stored 429)
    await asyncio.sleep(retry_after)
    assert_call(await create(client, refused), "SUCCEEDED", replayed=False)
    assert limited_server.effects(tenant, "create_ticket", refused) == 1


async def test_other_tenants_have_their_own_buckets(
    limited_server: Server, client: httpx.AsyncClient, keys: Keys
) -> None:
    for _ in range(2):
        assert_call(await create(client, new_key()), "SUCCEEDED", replayed=False)
    assert_rate_limited(await create(client, new_key()))
    other = bearer(sign(keys, claims_for(f"rl-{uuid.uuid4().hex[:10]}")))
    response = await post_call(
        client, "create_ticket", {"title": "limited"}, key=new_key(), headers=other
    )
    assert_call(response, "SUCCEEDED", replayed=False)


async def test_replays_take_a_token_too(
    limited_server: Server, client: httpx.AsyncClient, tenant: str
) -> None:
    """The door cannot know a call is a replay before it is appended, so every request
    counts: a replay executes nothing but still takes a token."""
    key, later = new_key(), new_key()
    assert_call(await create(client, key), "SUCCEEDED", replayed=False)
    assert_call(await create(client, key), "SUCCEEDED", replayed=True)
    retry_after = assert_rate_limited(await create(client, later))
    assert_rate_limited(await create(client, key))  # a replay is limited as well
    assert limited_server.effects(tenant, "create_ticket", key) == 1
    await asyncio.sleep(retry_after)
    assert_call(await create(client, later), "SUCCEEDED", replayed=False)


async def test_the_tenant_bucket_spans_all_tools(
    limited_server: Server, client: httpx.AsyncClient, tenant: str
) -> None:
    """list_tickets has no limit of its own: only the tenant's bucket (4) applies, and it is
    shared with create_ticket."""
    assert_call(await create(client, new_key()), "SUCCEEDED", replayed=False)
    for _ in range(3):
        listed = await post_call(client, "list_tickets", {})
        assert listed.status_code == 200, listed.text
    refused = await post_call(client, "list_tickets", {})
    assert_rate_limited(refused)
    assert "tenant" in refused.json()["detail"]
    # create_ticket still has a token in its own bucket, but the tenant's bucket is empty
    key = new_key()
    assert_rate_limited(await create(client, key))
    assert limited_server.effects_with_key(key) == 0


async def test_requests_refused_before_the_limiter_take_no_token(
    limited_server: Server, client: httpx.AsyncClient, keys: Keys, tenant: str
) -> None:
    for _ in range(3):  # invalid key, unknown tool, invalid body: refused before the limiter
        bad_key = await post_call(client, "create_ticket", {"title": "x"}, key="k" * 256)
        assert bad_key.status_code == 400
        assert (await post_call(client, "no_such_tool", {}, key=new_key())).status_code == 404
        no_args = await client.post(
            "/v1/tools/create_ticket/calls", json={}, headers={"Idempotency-Key": new_key()}
        )
        assert no_args.status_code == 400
    expired = bearer(sign(keys, claims_for(tenant, exp=1)))
    for _ in range(3):
        response = await post_call(
            client, "create_ticket", {"title": "x"}, key=new_key(), headers=expired
        )
        assert_problem(response, 401, "UNAUTHENTICATED")
    assert_call(await create(client, new_key()), "SUCCEEDED", replayed=False)
    assert_call(await create(client, new_key()), "SUCCEEDED", replayed=False)


async def test_429_is_counted_and_logged(
    limited_server: Server, client: httpx.AsyncClient, tenant: str
) -> None:
    name = "toolledger_http_rejections_total"
    before = await metric(client, name, tool="create_ticket", code="RATE_LIMITED")
    for _ in range(2):
        assert_call(await create(client, new_key()), "SUCCEEDED", replayed=False)
    assert_rate_limited(await create(client, new_key()))
    after = await metric(client, name, tool="create_ticket", code="RATE_LIMITED")
    assert after == before + 1
    entries = [e for e in log_entries(limited_server, "rate limited") if e["tenant"] == tenant]
    assert len(entries) == 1, full_log(limited_server)[-2000:]
    assert entries[0]["tool"] == "create_ticket" and entries[0]["bucket"] == "tool"
    assert isinstance(entries[0]["retry_after_s"], int)


# -- the limiter in-process, with an injected clock -------------------------------------------

TOOLS: dict[str, dict[str, Any]] = {"a": {}, "b": {}, "c": {}}


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def limiter(
    limits: dict[str, Any], tools: dict[str, dict[str, Any]] | None = None
) -> tuple[RateLimiter, Clock]:
    clock = Clock()
    policy = RatePolicy.from_dict({"rate_limits": limits})
    return RateLimiter(policy, TOOLS if tools is None else tools, clock=clock), clock


def test_refill_and_retry_after_rounding() -> None:
    limits, clock = limiter({"tools": {"a": {"per_tenant": {"rate": 1, "burst": 2}}}})
    assert limits.acquire("t", "a") is None
    assert limits.acquire("t", "a") is None
    third = limits.acquire("t", "a")
    assert isinstance(third, Refusal) and third.retry_after_s == 1 and third.scope == "tool"
    assert "a for this tenant" in third.detail
    clock.now += 0.25
    refusal = limits.acquire("t", "a")
    assert refusal is not None and refusal.retry_after_s == 1  # 0.75 s rounded up
    clock.now += 0.75
    assert limits.acquire("t", "a") is None  # exactly one token again
    assert limits.acquire("t", "a") is not None
    clock.now += 1000
    assert limits.acquire("t", "a") is None
    assert limits.acquire("t", "a") is None  # refilled to the burst, not beyond
    assert limits.acquire("t", "a") is not None
    assert limits.acquire("t", "b") is None  # b has no limit
    slow, slow_clock = limiter({"tools": {"a": {"per_tenant": {"rate": 0.4, "burst": 1}}}})
    assert slow.acquire("t", "a") is None
    refusal = slow.acquire("t", "a")
    assert refusal is not None and refusal.retry_after_s == 3  # 2.5 s rounded up
    slow_clock.now -= 50  # a clock going backwards adds nothing
    assert slow.acquire("t", "a") is not None


def test_all_buckets_or_none() -> None:
    limits, clock = limiter(
        {
            "tenant": {"rate": 1, "burst": 3},
            "tools": {"a": {"per_tenant": {"rate": 0.25, "burst": 1}}},
        }
    )
    assert limits.acquire("t", "a") is None
    refused = limits.acquire("t", "a")
    assert refused is not None and refused.scope == "tool" and refused.retry_after_s == 4
    # the refusal took nothing from the tenant's bucket: two calls of b still fit
    assert limits.acquire("t", "b") is None
    assert limits.acquire("t", "b") is None
    tenant_empty = limits.acquire("t", "b")
    assert tenant_empty is not None and tenant_empty.scope == "tenant"
    assert "tenant" in tenant_empty.detail
    # both empty: Retry-After is the longer wait
    both = limits.acquire("t", "a")
    assert both is not None and both.scope == "tool" and both.retry_after_s == 4
    clock.now += 1
    assert limits.acquire("t", "b") is None
    assert limits.acquire("u", "a") is None  # another tenant


def test_precedence_policy_manifest_default() -> None:
    tools: dict[str, dict[str, Any]] = {
        "a": {"rate_limit": {"per_tenant": {"rate": 1, "burst": 5}}},
        "b": {"rate_limit": {"rate": 1, "burst": 3}},  # a bare bucket: per tenant
        "c": {"rate_limit": {"rate": 1, "burst": 4}},
        "d": {},
    }
    limits, _ = limiter(
        {
            "default": {"per_tenant": {"rate": 1, "burst": 2}},
            "tools": {"a": {"per_tenant": {"rate": 1, "burst": 1}}, "c": None},
        },
        tools,
    )
    assert {t: b.burst for t, b in limits.tool_buckets.items()} == {"a": 1, "b": 3, "d": 2}


def test_nothing_is_limited_unless_configured(tmp_path: Path) -> None:
    registry = ToolSource(demo=True, helpdesk_db=tmp_path / "helpdesk.db").load()
    assert rate_limiter(registry) is None
    empty, _ = limiter({})
    assert not empty.active and empty.acquire("t", "a") is None
    policy = tmp_path / "policy.json"
    policy.write_text(json.dumps(POLICY))
    configured = rate_limiter(registry, policy)
    assert configured is not None and set(configured.tool_buckets) == {"create_ticket"}


@pytest.mark.parametrize(
    "limits",
    [
        {"tools": {"nope": {"per_tenant": {"rate": 1, "burst": 1}}}},
        {"tenant": {"rate": 0, "burst": 1}},
        {"tenant": {"rate": -1, "burst": 1}},
        {"tenant": {"rate": 1, "burst": 0}},
        {"tenant": {"rate": 1, "burst": 1.5}},
        {"tenant": {"rate": "1", "burst": 1}},
        {"tenant": {"rate": 1, "burst": True}},
        {"tenant": {"rate": 1}},
        {"tenant": {"rate": 1, "burst": 1, "per": "minute"}},
        {"per_tool": {"rate": 1, "burst": 1}},
        {"tools": {"a": {"rate": 1, "burst": 1}}},
        {"tools": []},
    ],
)
def test_unusable_policies_are_refused(limits: dict[str, Any]) -> None:
    with pytest.raises(PolicyError):
        RateLimiter(RatePolicy.from_dict({"rate_limits": limits}), TOOLS)


def test_unusable_manifest_limits_and_files_are_refused(tmp_path: Path) -> None:
    with pytest.raises(PolicyError, match="tool a"):
        RateLimiter(RatePolicy.none(), {"a": {"rate_limit": {"rate": 0, "burst": 1}}})
    for text in ("not json", "[]", '{"rate_limits": 5}'):
        path = tmp_path / "policy.json"
        path.write_text(text)
        with pytest.raises(PolicyError):
            RatePolicy.load(path)
    with pytest.raises(PolicyError):
        RatePolicy.load(tmp_path / "missing.json")


def test_full_buckets_are_forgotten() -> None:
    limits, clock = limiter({"tenant": {"rate": 1, "burst": 2}})
    for n in range(PRUNE_EVERY - 1):
        assert limits.acquire(f"t{n}", "a") is None
    assert len(limits) == PRUNE_EVERY - 1
    clock.now += 2  # every bucket is full again
    assert limits.acquire("busy", "a") is None  # the PRUNE_EVERY-th take prunes
    assert len(limits) == 1  # only the bucket that is not full
