"""The throttle of refused tokens (producers.http.ratelimit.AuthThrottle and
producers.http.auth.throttled_check), in-process with an injected clock: a burst of refused
tokens per client address (and per opaque token's first characters), then attempts are
refused unchecked, a right token too, until the bucket has refilled; no token counts for
nothing; a JWT is throttled by address only; the policy's ``auth_failures`` sets or removes
it."""

from __future__ import annotations

from typing import Any

import pytest

from toolledger.producers.client import TrustedContext
from toolledger.producers.http.auth import (
    UNKNOWN_TOKEN,
    AuthFailure,
    CombinedAuthenticator,
    Throttled,
    TokenEntry,
    TokenStore,
    throttled_check,
)
from toolledger.producers.http.ratelimit import (
    DEFAULT_AUTH_FAILURES,
    PRUNE_EVERY,
    AuthThrottle,
    Bucket,
    PolicyError,
    RatePolicy,
)

GOOD = "good-token-0123456789abcdef"
# the tokens file, and JWTs refused as such (this server has no JWKS)
STORE = CombinedAuthenticator(
    TokenStore([TokenEntry(token=GOOD, tenant="acme", principal="alice")]), None
)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def throttle(rate: float = 0.5, burst: int = 3) -> tuple[AuthThrottle, Clock]:
    clock = Clock()
    return AuthThrottle(Bucket(rate=rate, burst=burst), clock=clock), clock


def attempt(gate: AuthThrottle, token: str | None, client: str | None = "10.0.0.1") -> Any:
    return throttled_check(STORE, gate, client, None if token is None else f"Bearer {token}")


def test_a_burst_of_refused_tokens_then_every_attempt_waits_unchecked() -> None:
    gate, clock = throttle(rate=0.5, burst=3)
    for n in range(3):
        assert attempt(gate, f"wrong-{n}-xxxxxxxxxxxx") == UNKNOWN_TOKEN
    refused = attempt(gate, "wrong-3-xxxxxxxxxxxx")
    assert isinstance(refused, Throttled) and refused.retry_after_s == 2  # 1 token at 0.5/s
    assert "Retry in 2 s" in refused.detail
    # a right token is not checked either: a guess that hits is not told from one that misses
    assert isinstance(attempt(gate, GOOD), Throttled)
    clock.now += 1.5
    assert attempt(gate, GOOD) == Throttled(1)  # 0.25 s left, rounded up
    clock.now += 0.5
    assert attempt(gate, GOOD) == TrustedContext("acme", "alice", frozenset({"tools:call"}))
    assert attempt(gate, "wrong-4-xxxxxxxxxxxx") == UNKNOWN_TOKEN  # the token it had
    assert isinstance(attempt(gate, GOOD), Throttled)


def test_each_address_has_its_own_bucket() -> None:
    gate, _ = throttle(burst=2)
    for n in range(2):
        attempt(gate, f"miss-{n}-aaaaaaaaaaaa", client="10.0.0.1")
    assert isinstance(attempt(gate, GOOD, client="10.0.0.1"), Throttled)
    assert isinstance(attempt(gate, GOOD, client="10.0.0.2"), TrustedContext)
    assert isinstance(attempt(gate, GOOD, client=None), TrustedContext)  # no address known


def test_guesses_at_one_opaque_token_are_held_back_from_every_address() -> None:
    gate, _ = throttle(burst=2)
    prefix = GOOD[:8]
    attempt(gate, prefix + "guess-one-xxxxxxx", client="10.0.0.1")
    attempt(gate, prefix + "guess-two-xxxxxxx", client="10.0.0.2")
    # neither address is spent, but the token's first characters are
    assert isinstance(attempt(gate, prefix + "guess-three-xxxxx", client="10.0.0.3"), Throttled)
    assert isinstance(attempt(gate, "other-prefix-token-xx", client="10.0.0.3"), AuthFailure)


def test_jwts_count_by_address_only() -> None:
    gate, _ = throttle(burst=2)
    jwt = "eyJhbGciOiJSUzI1NiJ9.e30.c2ln"
    for client in ("10.0.0.1", "10.0.0.2", "10.0.0.3"):
        failure = attempt(gate, jwt, client=client)  # the same header on every JWT
        assert isinstance(failure, AuthFailure) and failure.kind == "jwt"
    assert isinstance(attempt(gate, GOOD, client="10.0.0.4"), TrustedContext)


@pytest.mark.parametrize(
    "authorization", [None, "", "Bearer ", "Basic abc", "Bearer " + "x" * 9000]
)
def test_no_token_or_one_that_can_never_be_valid_counts_for_nothing(
    authorization: str | None,
) -> None:
    gate, _ = throttle(burst=1)
    for _ in range(5):
        failure = throttled_check(STORE, gate, "10.0.0.1", authorization)
        assert isinstance(failure, AuthFailure) and failure.kind == "none"
    assert isinstance(attempt(gate, GOOD), TrustedContext)


def test_the_policy_sets_the_bucket_or_switches_it_off() -> None:
    assert RatePolicy.none().limits.auth_failures == DEFAULT_AUTH_FAILURES
    assert (DEFAULT_AUTH_FAILURES.rate, DEFAULT_AUTH_FAILURES.burst) == (1.0, 100)
    custom = RatePolicy.from_dict({"rate_limits": {"auth_failures": {"rate": 2, "burst": 5}}})
    assert custom.limits.auth_failures == Bucket(rate=2, burst=5)
    off = RatePolicy.from_dict({"rate_limits": {"auth_failures": None}})
    gate = AuthThrottle(off.limits.auth_failures)
    for n in range(500):
        assert attempt(gate, f"wrong-{n}-xxxxxxxxxxxx") == UNKNOWN_TOKEN
    for bad in ({"rate": 0, "burst": 1}, {"burst": 5}, {"rate": 1, "burst": 0}):
        with pytest.raises(PolicyError):
            RatePolicy.from_dict({"rate_limits": {"auth_failures": bad}})


def test_full_buckets_are_forgotten() -> None:
    gate, clock = throttle(rate=1, burst=2)
    keys = [[("address", f"10.0.{n // 256}.{n % 256}")] for n in range(PRUNE_EVERY - 1)]
    for key in keys:
        gate.failed(key)
    assert len(gate) == PRUNE_EVERY - 1
    clock.now += 2  # every bucket is full again
    gate.failed([("address", "busy")])  # the PRUNE_EVERY-th failure prunes
    assert len(gate) == 1
